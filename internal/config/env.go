package config

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/corral-dev/corral/internal/errdefs"
)

// This file declares every environment variable Corral reads. No other
// package reads the environment; add a new variable here.

// envVar is one environment variable and the key it sets.
type envVar struct {
	name string
	key  string // dotted config key, for validation errors
	set  func(c *Config, v string) error
}

// envVars are applied in order: the seed's AI_WORKER_* names first, then
// CORRAL_*, so CORRAL_MAX_CONCURRENT wins over AI_WORKER_MAX_CONCURRENT.
// CORRAL_CONFIG is read by Load to find the file. An empty value counts as
// unset.
var envVars = []envVar{
	{"AI_WORKER_ENABLED", "ai_worker_config.enabled", setBool(func(c *Config) *bool { return &c.AIWorker.Enabled })},
	{"AI_WORKER_NAMESPACE", "ai_worker_config.namespace", setString(func(c *Config) *string { return &c.AIWorker.Namespace })},
	{"AI_WORKER_IMAGE", "ai_worker_config.ai_coder_image", setString(func(c *Config) *string { return &c.AIWorker.AICoderImage })},
	{"AI_WORKER_PVC", "ai_worker_config.workspace_pvc", setString(func(c *Config) *string { return &c.AIWorker.WorkspacePVC })},
	{"AI_WORKER_WEBHOOK_SECRET", "ai_worker_config.webhook_secret", setString(func(c *Config) *string { return &c.AIWorker.webhookSecret })},
	{"AI_WORKER_DEFAULT_TIMEOUT", "ai_worker_config.default_timeout_minutes", setInt(func(c *Config) *int { return &c.AIWorker.DefaultTimeoutMinutes })},
	{"AI_WORKER_MAX_CONCURRENT", "ai_worker_config.max_concurrent_workers", setInt(func(c *Config) *int { return &c.AIWorker.MaxConcurrentWorkers })},

	{"EXECUTION_ENABLED", "execution.enabled", setBool(func(c *Config) *bool { return &c.Execution.Enabled })},
	{"EXECUTION_DEFAULT_IMAGE", "execution.default_image", setString(func(c *Config) *string { return &c.Execution.DefaultImage })},
	{"DOCKER_HOST", "docker.host", setString(func(c *Config) *string { return &c.Docker.Host })},

	{"CORRAL_LISTEN", "listen", setString(func(c *Config) *string { return &c.Listen })},
	{"CORRAL_DATA", "data", setString(func(c *Config) *string { return &c.Data })},
	{"CORRAL_API_TOKEN", "api_token", setString(func(c *Config) *string { return &c.apiToken })},
	{"CORRAL_STORE_DRIVER", "store.driver", setString(func(c *Config) *string { return &c.Store.Driver })},
	{"CORRAL_STORE_DSN", "store.dsn", setString(func(c *Config) *string { return &c.Store.dsn })},
	{"CORRAL_RUNTIME", "runtime", setString(func(c *Config) *string { return &c.Runtime })},
	{"CORRAL_LOG_LEVEL", "log.level", setString(func(c *Config) *string { return &c.Log.Level })},
	{"CORRAL_LOG_FORMAT", "log.format", setString(func(c *Config) *string { return &c.Log.Format })},
	{"CORRAL_MAX_CONCURRENT", "ai_worker_config.max_concurrent_workers", setInt(func(c *Config) *int { return &c.AIWorker.MaxConcurrentWorkers })},
	{"CORRAL_KUBERNETES_SERVER_URL", "kubernetes.server_url", setString(func(c *Config) *string { return &c.Kubernetes.ServerURL })},
	{"CORRAL_KUBERNETES_EGRESS_LISTEN", "kubernetes.egress_listen", setString(func(c *Config) *string { return &c.Kubernetes.EgressListen })},
	{"CORRAL_KUBERNETES_EGRESS_ADDR", "kubernetes.egress_addr", setString(func(c *Config) *string { return &c.Kubernetes.EgressAddr })},
	{"CORRAL_LOCAL_WARM_POOL", "local.warm_pool", setInt(func(c *Config) *int { return &c.Local.WarmPool })},
	{"CORRAL_GVISOR_WARM_POOL", "gvisor.warm_pool", setInt(func(c *Config) *int { return &c.Gvisor.WarmPool })},
	{"CORRAL_DOCKER_WARM_POOL", "docker.warm_pool", setInt(func(c *Config) *int { return &c.Docker.WarmPool })},
	{"CORRAL_EGRESS_MODE", "egress.mode", setString(func(c *Config) *string { return &c.Egress.Mode })},
	{"CORRAL_DEFAULT_AGENT", "agents.default", setString(func(c *Config) *string { return &c.Agents.Default })},
	// The fault tests' kill point (Config.CrashAt); never set in
	// production.
	{"CORRAL_TEST_CRASH_AT", "crash_at", setString(func(c *Config) *string { return &c.CrashAt })},
}

// EnvVars returns the names of the environment variables Load reads, for
// help text and `corral doctor`.
func EnvVars() []string {
	names := []string{"CORRAL_CONFIG"}
	for _, e := range envVars {
		names = append(names, e.name)
	}
	return names
}

// applyEnv applies the environment layer. A bad value is an error naming
// the variable; every bad value is reported at once.
func (c *Config) applyEnv(env map[string]string) error {
	var errs []error
	for _, e := range envVars {
		v := env[e.name]
		if v == "" {
			continue
		}
		if err := e.set(c, v); err != nil {
			errs = append(errs, &errdefs.FieldError{Field: e.name, Err: err})
			continue
		}
		c.setOrigin(e.key, e.name)
	}
	return errors.Join(errs...)
}

// applyFlags applies the flags layer.
func (c *Config) applyFlags(f Flags) {
	if f.Listen != nil {
		c.Listen = *f.Listen
		c.setOrigin("listen", "--listen")
	}
	if f.Data != nil {
		c.Data = *f.Data
		c.setOrigin("data", "--data")
	}
	if f.Runtime != nil {
		c.Runtime = *f.Runtime
		c.setOrigin("runtime", "--runtime")
	}
	if f.MaxConcurrent != nil {
		c.AIWorker.MaxConcurrentWorkers = *f.MaxConcurrent
		c.setOrigin("ai_worker_config.max_concurrent_workers", "--max-concurrent")
	}
}

func (c *Config) setOrigin(key, from string) {
	if c.origin == nil {
		c.origin = map[string]string{}
	}
	c.origin[key] = from
}

// field names key for a validation error: the environment variable or
// flag that set it last, or the dotted key if the file or the default did.
func (c *Config) field(key string) string {
	if from, ok := c.origin[key]; ok {
		return from
	}
	return key
}

func setString(f func(*Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error { *f(c) = v; return nil }
}

func setInt(f func(*Config) *int) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("must be a whole number, got %q", v)
		}
		*f(c) = n
		return nil
	}
}

func setBool(f func(*Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("must be true or false, got %q", v)
		}
		*f(c) = b
		return nil
	}
}
