package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/egress"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/task"
)

// Placeholder is the value corral k8s render gives every secret in the
// Secrets it writes. A secret that still holds it was never filled in, and
// the server refuses it rather than run with a token anyone can read here.
const Placeholder = "REPLACE_ME"

// MaxTimeoutMinutes is the highest task timeout Corral accepts: one day.
const MaxTimeoutMinutes = 1440

// Validate checks the merged configuration and returns every problem at
// once, as errors.Join of *errdefs.FieldError (so errors.Is(err,
// errdefs.ErrInvalidArgument) holds). Each Field is the dotted YAML key, or
// the environment variable or flag that set the bad value. Validate does no
// I/O: secret files are read by Secrets.
func (c *Config) Validate() error {
	v := &validator{c: c}

	if c.Version != 0 && c.Version != Version {
		v.add("version", "unsupported config version %d (this corral reads version %d)", c.Version, Version)
	}
	loopback, err := checkListen(c.Listen)
	if err != nil {
		v.add("listen", "%v", err)
	} else if !loopback && c.apiToken == "" && c.APITokenFile == "" && len(c.APITokens) == 0 {
		v.add("listen", "%s is not a loopback address and no API token is configured; set CORRAL_API_TOKEN or listen on loopback", c.Listen)
	}
	// A Secret rendered by corral k8s render and applied unedited.
	if c.apiToken == Placeholder {
		v.add("api_token", "is the placeholder %s from corral k8s render: put a real token in the server's Secret", Placeholder)
	}
	if c.AIWorker.webhookSecret == Placeholder {
		v.add("ai_worker_config.webhook_secret", "is the placeholder %s from corral k8s render: put a real secret in the server's Secret", Placeholder)
	}
	v.nonEmpty("data", c.Data)
	v.store(&c.Store)
	v.http(&c.HTTP)
	v.oneOf("log.level", c.Log.Level, []string{"debug", "info", "warn", "error"})
	v.oneOf("log.format", c.Log.Format, []string{"text", "json"})

	v.aiWorker(&c.AIWorker)
	v.execution(&c.Execution)
	if c.Sessions.MaxSessions < 0 {
		v.add("sessions.max_sessions", "must not be negative, got %d", c.Sessions.MaxSessions)
	}
	if c.Sessions.IdleTimeout < Duration(time.Second) || c.Sessions.MaxLifetime < Duration(time.Second) {
		v.add("sessions", "idle_timeout and max_lifetime must be at least 1s")
	}

	for i, r := range c.Workspaces.Roots {
		if !filepath.IsAbs(r) || filepath.Clean(r) != r || strings.ContainsRune(r, 0) || r == "/" {
			v.add(fmt.Sprintf("workspaces.roots[%d]", i), "must be an absolute, clean directory other than /, got %q", r)
		}
	}
	v.kubernetes(&c.Kubernetes)
	v.oneOf("runtime", c.Runtime, rtkind.Names())
	v.nonEmpty("local.bwrap", c.Local.Bwrap)
	if p := strings.Trim(c.Local.CgroupParent, "/"); !filepath.IsLocal(p) || path.Clean(p) != p || strings.ContainsRune(p, 0) {
		v.add("local.cgroup_parent", "must be a clean cgroup path such as corral or system.slice/corral, got %q", p)
	}
	v.positiveSize("local.tmp_size", c.Local.TmpSize)
	if c.Local.WarmPool < -1 || c.Local.WarmPool > maxWarmPool {
		v.add("local.warm_pool", "must be -1 (automatic), 0 (none) or up to %d sandboxes per shape, got %d", maxWarmPool, c.Local.WarmPool)
	}
	v.warm("local", c.Local.WarmIdle, c.Local.WarmMax, c.Local.WarmMemory)
	v.nonEmpty("gvisor.runsc", c.Gvisor.Runsc)
	if p := c.Gvisor.Platform; p != "" {
		v.oneOf("gvisor.platform", p, []string{"ptrace", "systrap", "kvm"})
	}
	if c.Gvisor.WarmPool < 0 || c.Gvisor.WarmPool > maxWarmPool {
		v.add("gvisor.warm_pool", "must be 0 (none) or up to %d sandboxes per shape, got %d", maxWarmPool, c.Gvisor.WarmPool)
	}
	v.warm("gvisor", c.Gvisor.WarmIdle, c.Gvisor.WarmMax, c.Gvisor.WarmMemory)
	if c.Docker.WarmPool < 0 || c.Docker.WarmPool > maxWarmPool {
		v.add("docker.warm_pool", "must be 0 (none) or up to %d containers per shape, got %d", maxWarmPool, c.Docker.WarmPool)
	}
	v.warm("docker", c.Docker.WarmIdle, c.Docker.WarmMax, c.Docker.WarmMemory)
	// Ranges a person may own are refused where the identity is used
	// (sandbox/hostuser), which reads the host's login.defs.
	for _, f := range []struct {
		key string
		id  int
	}{{"sandbox.host_uid", c.Sandbox.HostUID}, {"sandbox.host_gid", c.Sandbox.HostGID}} {
		if f.id < 0 || f.id > 1<<32-2 {
			v.add(f.key, "must be 0 (the reserved sandbox identity) or a host id up to 4294967294, got %d", f.id)
		}
	}

	v.oneOf("egress.mode", c.Egress.Mode, EgressModes)
	v.oneOf("egress.task_hosts", c.Egress.TaskHosts, []string{TaskHostsNarrow, TaskHostsAdd})
	for i, h := range c.Egress.Allow {
		if !allowEntry(h) {
			v.add(fmt.Sprintf("egress.allow[%d]", i), "must be a host name (api.example.com, api.example.com:8443, *.example.com) or an IP address such as 127.0.0.1:8080, with no scheme or path, got %q", h)
		}
	}

	v.egressCredentials(c.Egress.Credentials)
	v.oneOf("sessions.idle_action", c.Sessions.IdleAction, []string{IdleAuto, IdleDelete, IdleSuspend})
	v.oneOf("shutdown", c.Shutdown, []string{ShutdownLeave, ShutdownStop})

	v.agents(&c.Agents)

	if u := c.Notify.URL; u != "" {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			v.add("notify.url", "must be an http or https URL, got %q", u)
		}
	}
	for i, e := range c.Notify.Events {
		switch {
		case strings.TrimSpace(e) == "":
			v.add(fmt.Sprintf("notify.events[%d]", i), "must not be empty")
		case strings.HasPrefix(e, "delivery_") || strings.HasPrefix(e, "notify_"):
			v.add(fmt.Sprintf("notify.events[%d]", i), "%q is a notification's own event and cannot be notified", e)
		}
	}
	if c.Notify.PreviousSecretFile != "" && c.Notify.SecretFile == "" {
		v.add("notify.previous_secret_file", "goes with notify.secret_file, the new secret")
	}
	if c.Notify.URL != "" && c.Notify.SecretFile == "" {
		v.add("notify.secret_file", "must be set when notify.url is: notifications are always signed (a file holding whsec_ and a base64 key)")
	}
	if c.Notify.MaxAttempts < 1 {
		v.add("notify.max_attempts", "must be at least 1, got %d", c.Notify.MaxAttempts)
	}
	if c.Notify.InitialBackoff <= 0 {
		v.add("notify.initial_backoff", "must be positive, got %s", c.Notify.InitialBackoff)
	}
	if c.Notify.MaxBackoff < c.Notify.InitialBackoff {
		v.add("notify.max_backoff", "must be at least notify.initial_backoff (%s), got %s", c.Notify.InitialBackoff, c.Notify.MaxBackoff)
	}
	if c.Notify.Timeout <= 0 {
		v.add("notify.timeout", "must be positive, got %s", c.Notify.Timeout)
	}
	if c.Notify.Concurrency < 1 {
		v.add("notify.concurrency", "must be at least 1, got %d", c.Notify.Concurrency)
	}
	names := map[string]bool{}
	for i, t := range c.APITokens {
		p := fmt.Sprintf("api_tokens[%d]", i)
		switch {
		case !tokenName().MatchString(t.Name):
			v.add(p+".name", "must be 1 to 64 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit, got %q", t.Name)
		case t.Name == "default" || t.Name == "local" || t.Name == "anonymous":
			v.add(p+".name", "%q is reserved (default is the unnamed token's; local and anonymous mean no token)", t.Name)
		case names[t.Name]:
			v.add(p+".name", "%q is used by another token", t.Name)
		}
		names[t.Name] = true
		if t.TokenFile == "" {
			v.add(p+".token_file", "must be set")
		}
	}

	l := &c.Limits
	v.positiveSize("limits.max_prompt_bytes", l.MaxPromptBytes)
	v.positiveSize("limits.max_task_dir_bytes", l.MaxTaskDirBytes)
	v.positiveSize("limits.max_context_bytes", l.MaxContextBytes)
	v.positiveSize("limits.max_request_bytes", l.MaxRequestBytes)
	v.positiveSize("limits.max_log_bytes", l.MaxLogBytes)
	v.positiveSize("limits.max_upload_bytes", l.MaxUploadBytes)
	v.positiveSize("limits.max_upload_request_bytes", l.MaxUploadRequestBytes)
	v.positiveSize("limits.max_shared_bytes", l.MaxSharedBytes)
	v.positiveSize("limits.max_write_bytes", l.MaxWriteBytes)
	if l.MaxRequestBytes.Bytes() > 0 && l.MaxRequestBytes.Bytes() < l.MaxPromptBytes.Bytes() {
		v.add("limits.max_request_bytes", "must be at least limits.max_prompt_bytes (%s), since a prompt arrives in a request", l.MaxPromptBytes)
	}
	if l.WebhookMaxSkew <= 0 {
		v.add("limits.webhook_max_skew", "must be positive, got %s", l.WebhookMaxSkew)
	}
	if l.StopGrace < 0 {
		v.add("limits.stop_grace", "must not be negative, got %s", l.StopGrace)
	}
	if l.APIRate < 0 || math.IsNaN(l.APIRate) || math.IsInf(l.APIRate, 0) {
		v.add("limits.api_rate", "must be a number of requests a second, 0 (no limit) or more, got %g", l.APIRate)
	}
	if l.APIBurst < 1 {
		v.add("limits.api_burst", "must be at least 1 (the requests a caller may make at once), got %d", l.APIBurst)
	}
	return errors.Join(v.errs...)
}

// warm checks a runtime's warm pool idle time and budget, under section.
func (v *validator) warm(section string, idle Duration, maxN int, mem Size) {
	if idle < 0 {
		v.add(section+".warm_idle", "must not be negative, got %s", time.Duration(idle))
	}
	if maxN < 0 || maxN > 2*maxWarmPool {
		v.add(section+".warm_max", "must be 0 (warm_pool of each shape) or up to %d sandboxes, got %d", 2*maxWarmPool, maxN)
	}
	if mem.Bytes() < 0 {
		v.add(section+".warm_memory", "must not be negative, got %d bytes", mem.Bytes())
	}
}

// maxWarmPool bounds local.warm_pool: each warm sandbox is processes and
// a cgroup held for as long as it waits.
const maxWarmPool = 1000

func (v *validator) kubernetes(k *Kubernetes) {
	if k.ServerURL != "" {
		u, err := url.Parse(k.ServerURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			v.add("kubernetes.server_url", "must be an http(s) URL with a host and nothing after the path (where worker pods reach this server), got %q", k.ServerURL)
		}
	}
	if k.WarmPool < 0 || k.WarmPool > maxWarmPool {
		v.add("kubernetes.warm_pool", "must be 0 (none) or up to %d pods per shape, got %d", maxWarmPool, k.WarmPool)
	}
	if k.WarmIdle < 0 {
		v.add("kubernetes.warm_idle", "must not be negative, got %s", time.Duration(k.WarmIdle))
	}
	if k.WarmMaxPods < 0 {
		v.add("kubernetes.warm_max_pods", "must not be negative, got %d", k.WarmMaxPods)
	}
	if k.WarmMaxMemory.Bytes() < 0 {
		v.add("kubernetes.warm_max_memory", "must not be negative")
	}
	if k.EgressListen != "" {
		if _, err := checkListen(k.EgressListen); err != nil {
			v.add("kubernetes.egress_listen", "%v", err)
		}
		if k.EgressAddr == "" && k.ServerURL == "" {
			v.add("kubernetes.egress_listen", "needs kubernetes.egress_addr, or kubernetes.server_url for its host: where worker pods reach it")
		}
	}
	if k.EgressAddr != "" {
		host, port, _ := net.SplitHostPort(k.EgressAddr)
		if _, err := checkListen(k.EgressAddr); err != nil || host == "" || port == "0" {
			v.add("kubernetes.egress_addr", "must be host:port with a host and a port (where worker pods reach kubernetes.egress_listen), got %q", k.EgressAddr)
		}
		if k.EgressListen == "" {
			v.add("kubernetes.egress_addr", "is where worker pods reach kubernetes.egress_listen, which is not set")
		}
	}
	if k.SecretName != "" && !dnsSubdomain().MatchString(k.SecretName) {
		v.add("kubernetes.secret_name", "must be a Kubernetes object name (lowercase letters, digits, '-' and '.'), got %q", k.SecretName)
	}
	v.oneOf("kubernetes.pull_policy", k.PullPolicy, []string{"IfNotPresent", "Always", "Never"})
	if p := k.SeccompProfile; p != "" && (!filepath.IsLocal(p) || filepath.Clean(p) != p) {
		v.add("kubernetes.seccomp_profile", "must be a clean path relative to the kubelet's seccomp directory, got %q", p)
	}
}

func (v *validator) aiWorker(w *AIWorkerConfig) {
	const p = "ai_worker_config."
	if !dnsLabel().MatchString(w.Namespace) {
		v.add(p+"namespace", "must be a Kubernetes namespace name (lowercase letters, digits and '-', at most 63), got %q", w.Namespace)
	}
	if rtkind.RunsImages(v.c.Runtime) && w.AICoderImage == "" {
		v.add(p+"ai_coder_image", "must be set for the %s runtime", v.c.Runtime)
	}
	v.imagePatterns(p+"allowed_images", w.AllowedImages)
	if w.AICoderImage != "" && !task.ImageAllowed(w.AllowedImages, w.AICoderImage) {
		v.add(p+"ai_coder_image", "%q, the default image, must match one of allowed_images %v", w.AICoderImage, w.AllowedImages)
	}
	if !path.IsAbs(w.WorkspaceMountPath) {
		v.add(p+"workspace_mount_path", "must be an absolute path, got %q", w.WorkspaceMountPath)
	}

	def, most := w.DefaultTimeoutMinutes, w.MaxTimeoutMinutes
	if most < 1 || most > MaxTimeoutMinutes {
		v.add(p+"max_timeout_minutes", "must be between 1 and %d, got %d", MaxTimeoutMinutes, most)
	}
	switch {
	case def < 1:
		v.add(p+"default_timeout_minutes", "must be at least 1, got %d", def)
	case def > most && most >= 1:
		v.add(p+"default_timeout_minutes", "must not exceed max_timeout_minutes (%d), got %d", most, def)
	}
	if w.MaxConcurrentWorkers < 1 {
		v.add(p+"max_concurrent_workers", "must be at least 1, got %d", w.MaxConcurrentWorkers)
	}
	if w.MaxQueuedTasks < 1 {
		v.add(p+"max_queued_tasks", "must be at least 1, got %d", w.MaxQueuedTasks)
	}

	r := &w.Resources
	v.positiveSize(p+"resources.memory_request", r.MemoryRequest)
	v.positiveSize(p+"resources.memory_limit", r.MemoryLimit)
	if r.MemoryLimit.Bytes() > 0 && r.MemoryRequest.Bytes() > r.MemoryLimit.Bytes() {
		v.add(p+"resources.memory_request", "must not exceed memory_limit (%s), got %s", r.MemoryLimit, r.MemoryRequest)
	}
	if r.CPURequest <= 0 {
		v.add(p+"resources.cpu_request", "must be positive, got %s", r.CPURequest)
	}
	if r.CPULimit <= 0 {
		v.add(p+"resources.cpu_limit", "must be positive, got %s", r.CPULimit)
	}
	if r.CPULimit > 0 && r.CPURequest > r.CPULimit {
		v.add(p+"resources.cpu_request", "must not exceed cpu_limit (%s), got %s", r.CPULimit, r.CPURequest)
	}
	if r.PidsLimit < task.MinPids {
		v.add(p+"resources.pids_limit", "must be at least %d (%s), got %d", task.MinPids, task.MinPidsReason, r.PidsLimit)
	}

	// Seed 000's key, taken for its one value: the workers post their
	// completions (and progress beside them) to a route of the server's
	// own, not configurable.
	if w.WebhookPath != DefaultWebhookPath {
		v.add(p+"webhook_path", "is fixed at %s (the route workers post to; progress goes beside it), got %q: remove the key", DefaultWebhookPath, w.WebhookPath)
	}
	if w.TaskRetentionHours < 1 {
		v.add(p+"task_retention_hours", "must be at least 1, got %d", w.TaskRetentionHours)
	}
	if w.EventRetentionHours < 0 {
		v.add(p+"event_retention_hours", "must not be negative (0 keeps events forever), got %d", w.EventRetentionHours)
	}
	if w.AttachmentRetentionHours < 1 {
		v.add(p+"attachment_retention_hours", "must be at least 1, got %d", w.AttachmentRetentionHours)
	}
	if w.RetentionInterval < Duration(1e9) {
		v.add(p+"retention_interval", "must be at least 1s, got %s", w.RetentionInterval)
	}
	if w.JobTTLSeconds < 0 {
		v.add(p+"job_ttl_seconds", "must not be negative, got %d", w.JobTTLSeconds)
	}
}

func (v *validator) execution(e *Execution) {
	const p = "execution."
	if e.Timeout < 1 || e.Timeout > 300 {
		v.add(p+"timeout", "must be between 1 and 300 seconds, got %d", e.Timeout)
	}
	v.positiveSize(p+"max_output_size", e.MaxOutputSize)
	if e.MaxMemory.Bytes() < 0 || (e.MaxMemory.Bytes() > 0 && e.MaxMemory.Bytes() < 16<<20) {
		v.add(p+"max_memory", "must be at least 16Mi, got %s", e.MaxMemory)
	}
	if e.DockerSocket != "" && !path.IsAbs(e.DockerSocket) {
		v.add(p+"docker_socket", "must be an absolute path, got %q", e.DockerSocket)
	}
	v.imagePatterns(p+"allowed_images", e.AllowedImages)
}

func (v *validator) http(h *HTTP) {
	for i, e := range h.AllowedHosts {
		if !hostEntry(e) {
			v.add(fmt.Sprintf("http.allowed_hosts[%d]", i), "must be a host name or IP address with an optional :port (corral.example.com, corral.lan:7777, [fd00::1]:7777), with no scheme, path or wildcard, got %q", e)
		}
	}
	for i, e := range h.AllowedOrigins {
		if !originEntry(e) {
			v.add(fmt.Sprintf("http.allowed_origins[%d]", i), "must be an origin, scheme://host[:port] with scheme http or https and no path (https://corral.example.com, http://localhost:5173), got %q", e)
		}
	}
}

func (v *validator) agents(a *Agents) {
	if !known(AgentNames, a.Default) {
		v.add("agents.default", "must be one of %s, got %q", strings.Join(AgentNames, ", "), a.Default)
	}
	for _, name := range AgentNames {
		ag, _ := a.Get(name)
		p := "agents." + name
		v.nonEmpty(p+".binary", ag.Binary)
		if name == "command" {
			// A command task runs the argv it was given: a binary or
			// arguments here would change nothing, and say they did.
			if ag.Binary != Default().Agents.Command.Binary {
				v.add(p+".binary", "is not used: a command task runs its own argv; remove the key")
			}
			if len(ag.Args) > 0 {
				v.add(p+".args", "is not used: a command task runs its own argv; remove the key")
			}
		}
		for i, arg := range ag.Args {
			if strings.ContainsRune(arg, 0) {
				v.add(fmt.Sprintf("%s.args[%d]", p, i), "must not contain a NUL byte")
			}
		}
		for k, val := range ag.Env {
			switch {
			case !envName().MatchString(k):
				v.add(p+".env."+k, "is not a valid environment variable name")
			case strings.ContainsRune(val, 0):
				v.add(p+".env."+k, "must not contain a NUL byte")
			case !v.c.expanded && strings.Contains(val, "${"):
				// Never echo the value: it may be a secret.
				v.add(p+".env."+k, "holds a ${...} reference but expansion is off; run with --config.expand-env")
			}
		}
	}
}

func (v *validator) egressCredentials(creds []EgressCredential) {
	names := map[string]bool{}
	for i, c := range creds {
		p := fmt.Sprintf("egress.credentials[%d]", i)
		switch {
		case !credentialName().MatchString(c.Name):
			v.add(p+".name", "must be 1-63 lowercase letters, digits, '-' or '_', got %q", c.Name)
		case names[c.Name]:
			v.add(p+".name", "%q names another rule too", c.Name)
		}
		names[c.Name] = true
		header := c.Header
		if header == "" {
			header = "Authorization"
		}
		// The value is checked when it is read (Secrets).
		if _, err := egress.ParseCredential(c.Name, c.Host, c.PathPrefix, header, "x"); err != nil {
			v.add(p, "%v", err)
		}
		v.oneOf(p+".scheme", c.Scheme, []string{"", SchemeBearer, SchemeBasic})
		if (c.Scheme == SchemeBasic) != (c.Username != "") || strings.ContainsAny(c.Username, ":\r\n") {
			v.add(p+".username", "is needed with scheme basic, and only there, without ':' or line breaks")
		}
		if (c.SecretFile == "") == (c.SecretEnv == "") {
			v.add(p, "needs secret_file or secret_env, one of the two")
		}
		if c.SecretEnv != "" && !envName().MatchString(c.SecretEnv) {
			v.add(p+".secret_env", "is not a valid environment variable name")
		}
		if c.PlaceholderEnv != "" && (!envName().MatchString(c.PlaceholderEnv) || strings.HasPrefix(c.PlaceholderEnv, "CORRAL_")) {
			v.add(p+".placeholder_env", "is not a valid environment variable name outside CORRAL_")
		}
	}
}

var credentialName = lazyRegexp(`^[a-z0-9][a-z0-9_-]{0,62}$`)

type validator struct {
	c    *Config
	errs []error
}

func (v *validator) add(key, format string, args ...any) {
	v.errs = append(v.errs, &errdefs.FieldError{Field: v.c.field(key), Err: fmt.Errorf(format, args...)})
}

func (v *validator) nonEmpty(key, s string) {
	if strings.TrimSpace(s) == "" {
		v.add(key, "must not be empty")
	}
}

func (v *validator) oneOf(key, s string, set []string) {
	if !known(set, s) {
		v.add(key, "must be one of %s, got %q", strings.Join(set, ", "), s)
	}
}

func (v *validator) positiveSize(key string, s Size) {
	if s.Bytes() <= 0 {
		v.add(key, "must be positive, got %s", s)
	}
}

// The patterns are compiled on first use: package initialisation runs in
// every corral process, including each sandbox's worker, which never
// validates a configuration.
var (
	dnsLabel     = lazyRegexp(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	dnsSubdomain = lazyRegexp(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	envName      = lazyRegexp(`^[A-Za-z_][A-Za-z0-9_]*$`)
	tokenName    = lazyRegexp(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	hostPattern  = lazyRegexp(`^(\*\.)?([A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*$`)
)

// allowEntry reports whether h is an egress allow entry: a host name, a
// *.suffix or an IP address, with an optional :port (internal/egress
// parses them; config may not import it).
func allowEntry(h string) bool {
	if host, port, err := net.SplitHostPort(h); err == nil {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return false
		}
		h = host
	}
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Zone() == ""
	}
	return hostPattern().MatchString(h)
}

// hostEntry reports whether h is an http.allowed_hosts entry: a host name
// or an IP address (IPv6 in brackets when a port follows), with an
// optional :port.
func hostEntry(h string) bool {
	if host, port, err := net.SplitHostPort(h); err == nil {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return false
		}
		h = host
	} else {
		h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	}
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Zone() == ""
	}
	return !strings.HasPrefix(h, "*.") && hostPattern().MatchString(h)
}

// originEntry reports whether o is an http.allowed_origins entry: what a
// browser sends as Origin, scheme://host[:port].
func originEntry(o string) bool {
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		return false
	}
	return u.Host != "" && hostEntry(u.Host)
}

func lazyRegexp(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}

// checkListen checks a host:port address and reports whether it is loopback
// only. A host name other than localhost, or an empty host (every
// interface), counts as not loopback; Validate does no name lookups.
func checkListen(addr string) (loopback bool, err error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("must be host:port such as 127.0.0.1:7777, got %q", addr)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n > 65535 {
		return false, fmt.Errorf("port must be a number from 0 to 65535, got %q", port)
	}
	if host == "localhost" {
		return true, nil
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback(), nil
}

// imagePatterns checks a list of image glob patterns.
func (v *validator) imagePatterns(key string, patterns []string) {
	for i, pat := range patterns {
		if _, err := path.Match(pat, ""); err != nil || pat == "" {
			v.add(fmt.Sprintf("%s[%d]", key, i), "must be a glob pattern such as python:* (path.Match syntax), got %q", pat)
		}
	}
}

// store checks the event store's driver and that a PostgreSQL one has a
// connection string, and SQLite none.
func (v *validator) store(s *Store) {
	v.oneOf("store.driver", s.Driver, []string{StoreSQLite, StorePostgres})
	hasDSN := s.dsn != "" || s.DSNFile != ""
	switch {
	case s.Driver == StorePostgres && !hasDSN:
		v.add("store.driver", "postgres needs a connection string: set CORRAL_STORE_DSN or store.dsn_file")
	case s.Driver == StoreSQLite && hasDSN:
		v.add("store.dsn_file", "is for store.driver postgres; SQLite keeps corral.db in the data root")
	}
}
