package config

import (
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/rtkind"
)

// MustWriteConfig writes a configuration file into a temporary directory
// and returns its path.
func MustWriteConfig(tb testing.TB, content string) string {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), "corral.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		tb.Fatal(err)
	}
	return p
}

// MustLoad loads content with the given environment and fails tb on error.
func MustLoad(tb testing.TB, content string, env ...string) *Config {
	tb.Helper()
	c, err := Load(LoadOptions{Path: MustWriteConfig(tb, content), Environ: env})
	if err != nil {
		tb.Fatalf("Load: %v", err)
	}
	return c
}

// fieldErrors flattens err into its FieldErrors.
func fieldErrors(err error) []*errdefs.FieldError {
	var out []*errdefs.FieldError
	var walk func(error)
	walk = func(err error) {
		if fe, ok := err.(*errdefs.FieldError); ok {
			out = append(out, fe)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

// wantFieldError fails t unless err holds a FieldError for field whose
// message contains msg.
func wantFieldError(t *testing.T, err error, field, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %s: ...%s...", field, msg)
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("error %v is not ErrInvalidArgument", err)
	}
	for _, fe := range fieldErrors(err) {
		if fe.Field == field && strings.Contains(fe.Err.Error(), msg) {
			return
		}
	}
	t.Errorf("error = %v\nwant a field error %s: ...%s...", err, field, msg)
}

// cmpConfig compares configurations; Size has an Equal method, empty and
// nil lists and maps are the same, and unexported bookkeeping is ignored.
var cmpConfig = []cmp.Option{cmpopts.IgnoreUnexported(Config{}, AIWorkerConfig{}, Store{}), cmpopts.EquateEmpty()}

func TestDefaultIsValid(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"listen", c.Listen, "127.0.0.1:7777"},
		{"data", c.Data, "./corral-data"},
		{"runtime", c.Runtime, "local"},
		{"egress.mode", c.Egress.Mode, "allowlist"},
		{"agents.default", c.Agents.Default, "claude"},
		{"enabled", c.AIWorker.Enabled, true},
		{"execution.enabled", c.Execution.Enabled, false},
		{"max_concurrent", c.AIWorker.MaxConcurrentWorkers, 3},
		{"max_queued", c.AIWorker.MaxQueuedTasks, 100},
		{"memory_limit", c.AIWorker.Resources.MemoryLimit.Bytes(), int64(2 << 30)},
		{"cpu_limit", c.AIWorker.Resources.CPULimit.Millis(), int64(2000)},
		{"max_prompt_bytes", c.Limits.MaxPromptBytes.Bytes(), int64(64 << 10)},
		{"stop_grace", time.Duration(c.Limits.StopGrace), 10 * time.Second},
		{"webhook_max_skew", time.Duration(c.Limits.WebhookMaxSkew), 5 * time.Minute},
		{"api_rate", c.Limits.APIRate, 50.0},
		{"api_burst", c.Limits.APIBurst, 200},
	}
	for _, ck := range checks {
		if ck.got != ck.want {
			t.Errorf("%s = %v, want %v", ck.name, ck.got, ck.want)
		}
	}
	for _, name := range AgentNames {
		a, ok := c.Agents.Get(name)
		if !ok || a.Binary != name {
			t.Errorf("agent %s = %+v, %v; want binary %s", name, a, ok, name)
		}
	}
	if _, ok := c.Agents.Get("nope"); ok {
		t.Error(`Agents.Get("nope") found an agent`)
	}
}

// TestDefaultIsFresh makes sure callers cannot change each other's defaults
// through shared slices.
func TestDefaultIsFresh(t *testing.T) {
	a := Default()
	a.Egress.Allow[0] = "evil.example"
	if Default().Egress.Allow[0] != "api.anthropic.com" {
		t.Error("Default() shares its allow list between calls")
	}
}

func TestLoadNoFile(t *testing.T) {
	t.Chdir(t.TempDir()) // no corral.yaml here
	c, err := Load(LoadOptions{Environ: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Default(), c, cmpConfig...); diff != "" {
		t.Errorf("Load with nothing set differs from Default() (-want +got):\n%s", diff)
	}
	if c.File() != "" {
		t.Errorf("File() = %q, want none", c.File())
	}
}

func TestLoadFindsFile(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.WriteFile(DefaultFile, []byte("listen: 127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(LoadOptions{Environ: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:1" || c.File() != DefaultFile {
		t.Errorf("./corral.yaml not used: listen %q, file %q", c.Listen, c.File())
	}

	// CORRAL_CONFIG wins over ./corral.yaml, and Path over CORRAL_CONFIG.
	other := MustWriteConfig(t, "listen: 127.0.0.1:2\n")
	c, err = Load(LoadOptions{Environ: []string{"CORRAL_CONFIG=" + other}})
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:2" || c.File() != other {
		t.Errorf("CORRAL_CONFIG not used: listen %q, file %q", c.Listen, c.File())
	}
	third := MustWriteConfig(t, "listen: 127.0.0.1:3\n")
	c, err = Load(LoadOptions{Path: third, Environ: []string{"CORRAL_CONFIG=" + other}})
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:3" {
		t.Errorf("Path not used over CORRAL_CONFIG: listen %q", c.Listen)
	}
}

func TestLoadMissingFile(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	for name, opts := range map[string]LoadOptions{
		"path":          {Path: missing, Environ: []string{}},
		"CORRAL_CONFIG": {Environ: []string{"CORRAL_CONFIG=" + missing}},
	} {
		_, err := Load(opts)
		if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), missing) {
			t.Errorf("%s: Load of a missing file = %v, want ErrNotFound naming it", name, err)
		}
	}
}

func TestLoadFile(t *testing.T) {
	c := MustLoad(t, `
version: 1
listen: 127.0.0.1:9000
data: /srv/corral
api_token_file: /etc/corral/token
log: {level: debug, format: json}
ai_worker_config:
  enabled: false
  namespace: family-assistant
  ai_coder_image: containers.example.com/ai-coder:v1.0
  default_timeout_minutes: 10
  max_timeout_minutes: 60
  max_concurrent_workers: 5
  resources:
    memory_request: 256Mi
    memory_limit: 1GiB
    cpu_request: "0.25"
    cpu_limit: 2000m
    pids_limit: 128
  webhook_secret_file: /etc/corral/webhook.key
  task_retention_hours: 24
  event_retention_hours: 0
  job_ttl_seconds: 0
runtime: docker
local: {tmp_size: 64MiB}
egress:
  mode: none
  allow: [example.com, "*.example.org"]
agents:
  default: gemini
  gemini: {env: {GEMINI_API_KEY: literal-for-test}, args: [--yolo]}
  codex: {binary: /opt/codex/bin/codex}
notify:
  url: https://assistant.example/hooks/corral
  secret_file: /etc/corral/notify.key
  events: [worker_completed]
  max_attempts: 5
limits:
  max_prompt_bytes: 128KiB
  stop_grace: 30s
  api_rate: 2.5
  api_burst: 10
shutdown: stop
`)
	want := Default()
	want.Listen = "127.0.0.1:9000"
	want.Data = "/srv/corral"
	want.APITokenFile = "/etc/corral/token"
	want.Log = Log{Level: "debug", Format: "json"}
	w := &want.AIWorker
	w.Enabled = false
	w.Namespace = "family-assistant"
	w.AICoderImage = "containers.example.com/ai-coder:v1.0"
	w.DefaultTimeoutMinutes, w.MaxTimeoutMinutes, w.MaxConcurrentWorkers = 10, 60, 5
	w.Resources = Resources{MemoryRequest: mustSize("256Mi"), MemoryLimit: mustSize("1GiB"), CPURequest: 250, CPULimit: 2000, PidsLimit: 128}
	w.WebhookSecretFile = "/etc/corral/webhook.key"
	w.TaskRetentionHours, w.EventRetentionHours, w.JobTTLSeconds = 24, 0, 0
	want.Runtime = "docker"
	want.Local.TmpSize = mustSize("64MiB")
	want.Egress = Egress{Mode: "none", Allow: []string{"example.com", "*.example.org"}, TaskHosts: TaskHostsNarrow}
	want.Agents.Default = "gemini"
	want.Agents.Gemini = Agent{Binary: "gemini", Args: []string{"--yolo"}, Env: map[string]string{"GEMINI_API_KEY": "literal-for-test"}}
	want.Agents.Codex.Binary = "/opt/codex/bin/codex"
	want.Notify.URL, want.Notify.SecretFile, want.Notify.Events, want.Notify.MaxAttempts = "https://assistant.example/hooks/corral", "/etc/corral/notify.key", []string{"worker_completed"}, 5
	want.Limits.MaxPromptBytes = mustSize("128KiB")
	want.Limits.StopGrace = Duration(30 * time.Second)
	want.Limits.APIRate, want.Limits.APIBurst = 2.5, 10
	want.Shutdown = ShutdownStop
	if diff := cmp.Diff(want, c, cmpConfig...); diff != "" {
		t.Errorf("loaded config differs (-want +got):\n%s", diff)
	}
}

func TestLoadFileEdgeCases(t *testing.T) {
	tests := []struct {
		name  string
		file  string
		check func(*Config) bool
	}{
		{"empty file", "", func(c *Config) bool { return c.Listen == "127.0.0.1:7777" }},
		{"comments only", "# nothing\n", func(c *Config) bool { return c.Listen == "127.0.0.1:7777" }},
		{"no version means 1", "listen: 127.0.0.1:1\n", func(c *Config) bool { return c.Version == 1 }},
		{"version 0 means 1", "version: 0\n", func(c *Config) bool { return c.Version == 1 }},
		{"empty section keeps defaults", "ai_worker_config:\n", func(c *Config) bool { return c.AIWorker.MaxConcurrentWorkers == 3 }},
		{"empty value keeps default", "listen:\n", func(c *Config) bool { return c.Listen == "127.0.0.1:7777" }},
		{"empty list is empty", "egress: {allow: []}\n", func(c *Config) bool { return len(c.Egress.Allow) == 0 }},
		{"partial agent keeps binary", "agents: {claude: {args: [-v]}}\n", func(c *Config) bool {
			return c.Agents.Claude.Binary == "claude" && slices.Equal(c.Agents.Claude.Args, []string{"-v"})
		}},
		{"alias", "limits: {max_prompt_bytes: &s 32KiB, max_log_bytes: *s}\n", func(c *Config) bool {
			return c.Limits.MaxLogBytes.Bytes() == 32<<10
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if c := MustLoad(t, tt.file); !tt.check(c) {
				t.Errorf("check failed for %q", tt.file)
			}
		})
	}
}

func TestLoadFileErrors(t *testing.T) {
	tests := []struct {
		name, file, field, msg string
	}{
		{"unknown top-level key", "listen: 127.0.0.1:1\nlisten_addr: x\n", "listen_addr", "unknown key (" /* path */},
		{"unknown nested key", "ai_worker_config:\n  max_concurent_workers: 4\n", "ai_worker_config.max_concurent_workers", "unknown key"},
		{"unknown agent", "agents:\n  aider: {binary: aider}\n", "agents.aider", "unknown key"},
		{"unknown key in agent", "agents:\n  claude: {bin: x}\n", "agents.claude.bin", "unknown key"},
		{"line number", "log:\n  level: info\n  colour: true\n", "log.colour", "line 3)"},
		{"duplicate key", "listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n", "listen", "duplicate key"},
		{"not a number", "ai_worker_config:\n  max_concurrent_workers: many\n", "ai_worker_config.max_concurrent_workers", "must be a whole number ("}, {"line of a bad value", "ai_worker_config:\n  max_concurrent_workers: many\n", "ai_worker_config.max_concurrent_workers", "corral.yaml line 2)"},
		{"not a bool", "ai_worker_config: {enabled: maybe}\n", "ai_worker_config.enabled", "must be true or false"},
		{"not a list", "egress: {allow: api.openai.com}\n", "egress.allow", "must be a list of strings"},
		{"not a mapping", "limits: 5\n", "limits", "must be a mapping of keys"},
		{"env not a mapping", "agents: {claude: {env: [A]}}\n", "agents.claude.env", "must be a mapping of names to strings"},
		{"bad size", "limits: {max_log_bytes: 16 megs}\n", "limits.max_log_bytes", `unknown unit "megs"`},
		{"bad cpu", "ai_worker_config: {resources: {cpu_limit: lots}}\n", "ai_worker_config.resources.cpu_limit", "number of cores"},
		{"bad duration", "limits: {stop_grace: 10}\n", "limits.stop_grace", "Go duration"},
		{"literal webhook secret", "ai_worker_config:\n  webhook_secret: hunter2\n", "ai_worker_config.webhook_secret", "use ai_worker_config.webhook_secret_file or the AI_WORKER_WEBHOOK_SECRET environment variable"},
		{"literal api token", "api_token: hunter2\n", "api_token", "use api_token_file or the CORRAL_API_TOKEN"},
		{"literal notify secret", "notify: {secret: hunter2}\n", "notify.secret", "use notify.secret_file"},
		{"literal named token", "api_tokens:\n  - {name: a, token: hunter2}\n", "api_tokens[0].token", "use token_file"},
		{"unknown key in a token", "api_tokens:\n  - {name: a, file: /x}\n", "api_tokens[0].file", "unknown key"},
		{"tokens not a list", "api_tokens: {name: a}\n", "api_tokens", "must be a list"},
		{"unsupported version", "version: 2\nnew_format: {}\n", "version", "unsupported config version 2"},
		{"bad version", "version: one\n", "version", "must be a whole number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(LoadOptions{Path: MustWriteConfig(t, tt.file), Environ: []string{}})
			wantFieldError(t, err, tt.field, tt.msg)
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error %q echoes a secret", err)
			}
		})
	}
}

func TestLoadFileReportsEveryError(t *testing.T) {
	_, err := Load(LoadOptions{Path: MustWriteConfig(t, "a: 1\nb: 2\nlimits: {c: 3}\n"), Environ: []string{}})
	var fields []string
	for _, fe := range fieldErrors(err) {
		fields = append(fields, fe.Field)
	}
	if diff := cmp.Diff([]string{"a", "b", "limits.c"}, fields); diff != "" {
		t.Errorf("field errors (-want +got):\n%s", diff)
	}
	// Only the version error is reported for a file in another format.
	_, err = Load(LoadOptions{Path: MustWriteConfig(t, "version: 3\na: 1\n"), Environ: []string{}})
	if n := len(fieldErrors(err)); n != 1 {
		t.Errorf("got %d errors for a version 3 file, want just the version: %v", n, err)
	}
}

func TestLoadSyntaxError(t *testing.T) {
	for _, file := range []string{"listen: [\n", "a: 1\n---\nb: 2\n", "- listen\n"} {
		_, err := Load(LoadOptions{Path: MustWriteConfig(t, file), Environ: []string{}})
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "corral.yaml") {
			t.Errorf("Load(%q) = %v, want ErrInvalidArgument naming the file", file, err)
		}
	}
}

func TestEnvOverrides(t *testing.T) {
	c := MustLoad(t, "listen: 127.0.0.1:1\nai_worker_config: {namespace: fromfile}\n",
		"AI_WORKER_ENABLED=false",
		"AI_WORKER_NAMESPACE=fromenv",
		"AI_WORKER_IMAGE=img:1",
		"AI_WORKER_PVC=pvc1",
		"AI_WORKER_WEBHOOK_SECRET=whsecret",
		"AI_WORKER_DEFAULT_TIMEOUT=7",
		"AI_WORKER_MAX_CONCURRENT=4",
		"CORRAL_LISTEN=127.0.0.1:2",
		"CORRAL_DATA=/d",
		"CORRAL_API_TOKEN=tok",
		"CORRAL_RUNTIME=gvisor",
		"CORRAL_LOG_LEVEL=warn",
		"CORRAL_LOG_FORMAT=json",
		"CORRAL_EGRESS_MODE=open",
		"CORRAL_DEFAULT_AGENT=codex",
		"CORRAL_LISTEN_UNRELATED=x",
		"EXECUTION_ENABLED=true",
		"EXECUTION_DEFAULT_IMAGE=python:3.12-slim",
		"DOCKER_HOST=unix:///run/other.sock",
	)
	want := Default()
	want.Listen = "127.0.0.1:2"
	want.Data = "/d"
	want.Runtime = "gvisor"
	want.Log = Log{Level: "warn", Format: "json"}
	want.Egress.Mode = "open"
	want.Agents.Default = "codex"
	want.Execution.Enabled, want.Execution.DefaultImage = true, "python:3.12-slim"
	want.Docker.Host = "unix:///run/other.sock"
	w := &want.AIWorker
	w.Enabled, w.Namespace, w.AICoderImage, w.WorkspacePVC = false, "fromenv", "img:1", "pvc1"
	w.DefaultTimeoutMinutes, w.MaxConcurrentWorkers = 7, 4
	if diff := cmp.Diff(want, c, cmpConfig...); diff != "" {
		t.Errorf("config differs (-want +got):\n%s", diff)
	}
	s, err := c.Secrets()
	if err != nil {
		t.Fatal(err)
	}
	if s.APIToken != "tok" || string(s.WebhookSecret) != "whsecret" {
		t.Errorf("Secrets() = %+v, want the environment's", s)
	}
}

func TestEnvOrder(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		want int
	}{
		{"AI_WORKER only", []string{"AI_WORKER_MAX_CONCURRENT=4"}, 4},
		{"CORRAL wins over AI_WORKER", []string{"CORRAL_MAX_CONCURRENT=6", "AI_WORKER_MAX_CONCURRENT=4"}, 6},
		{"empty counts as unset", []string{"CORRAL_MAX_CONCURRENT=", "AI_WORKER_MAX_CONCURRENT=4"}, 4},
		{"later duplicate wins", []string{"CORRAL_MAX_CONCURRENT=2", "CORRAL_MAX_CONCURRENT=5"}, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := MustLoad(t, "ai_worker_config: {max_concurrent_workers: 9}\n", tt.env...)
			if got := c.AIWorker.MaxConcurrentWorkers; got != tt.want {
				t.Errorf("max_concurrent_workers = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestEnvBadValues(t *testing.T) {
	tests := []struct {
		env, field, msg string
	}{
		{"AI_WORKER_ENABLED=perhaps", "AI_WORKER_ENABLED", `must be true or false, got "perhaps"`},
		{"AI_WORKER_DEFAULT_TIMEOUT=30m", "AI_WORKER_DEFAULT_TIMEOUT", `must be a whole number, got "30m"`},
		{"AI_WORKER_MAX_CONCURRENT=x", "AI_WORKER_MAX_CONCURRENT", "must be a whole number"},
		{"CORRAL_MAX_CONCURRENT=1.5", "CORRAL_MAX_CONCURRENT", "must be a whole number"},
		// Values that parse but break a rule name the variable too.
		{"CORRAL_MAX_CONCURRENT=0", "CORRAL_MAX_CONCURRENT", "must be at least 1"},
		{"AI_WORKER_DEFAULT_TIMEOUT=500", "AI_WORKER_DEFAULT_TIMEOUT", "must not exceed max_timeout_minutes (120)"},
		{"CORRAL_RUNTIME=firecracker", "CORRAL_RUNTIME", "must be one of local, gvisor, docker, kubernetes"},
		{"CORRAL_LOG_LEVEL=loud", "CORRAL_LOG_LEVEL", "must be one of debug, info, warn, error"},
		{"CORRAL_LOG_FORMAT=xml", "CORRAL_LOG_FORMAT", "must be one of text, json"},
		{"CORRAL_EGRESS_MODE=some", "CORRAL_EGRESS_MODE", "must be one of none, allowlist, open"},
		{"CORRAL_DEFAULT_AGENT=aider", "CORRAL_DEFAULT_AGENT", "must be one of claude"},
		{"CORRAL_LISTEN=7777", "CORRAL_LISTEN", "must be host:port"},
		{"AI_WORKER_NAMESPACE=Bad_NS", "AI_WORKER_NAMESPACE", "Kubernetes namespace"},
		// A Secret of corral k8s render's applied unedited.
		{"CORRAL_API_TOKEN=REPLACE_ME", "CORRAL_API_TOKEN", "placeholder REPLACE_ME"},
		{"AI_WORKER_WEBHOOK_SECRET=REPLACE_ME", "AI_WORKER_WEBHOOK_SECRET", "placeholder REPLACE_ME"},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			_, err := Load(LoadOptions{Path: MustWriteConfig(t, ""), Environ: []string{tt.env}})
			wantFieldError(t, err, tt.field, tt.msg)
		})
	}
	// Every bad variable is reported at once.
	_, err := Load(LoadOptions{Path: MustWriteConfig(t, ""), Environ: []string{"AI_WORKER_ENABLED=x", "CORRAL_MAX_CONCURRENT=y"}})
	if n := len(fieldErrors(err)); n != 2 {
		t.Errorf("got %d errors, want 2: %v", n, err)
	}
}

func TestFlags(t *testing.T) {
	path := MustWriteConfig(t, "listen: 127.0.0.1:1\ndata: /file\nruntime: docker\nai_worker_config: {max_concurrent_workers: 2}\n")
	env := []string{"CORRAL_LISTEN=127.0.0.1:2", "CORRAL_DATA=/env", "CORRAL_RUNTIME=gvisor", "CORRAL_MAX_CONCURRENT=3"}

	var opts LoadOptions
	opts.Environ = env
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	opts.RegisterFlags(fs)
	if err := fs.Parse([]string{"--config", path, "--listen", "127.0.0.1:3", "--data=/flag", "--runtime", "kubernetes", "--max-concurrent", "8"}); err != nil {
		t.Fatal(err)
	}
	c, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	got := []any{c.Listen, c.Data, c.Runtime, c.AIWorker.MaxConcurrentWorkers}
	want := []any{"127.0.0.1:3", "/flag", "kubernetes", 8}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("flags did not win (-want +got):\n%s", diff)
	}

	// Flags not given leave the environment's values alone.
	opts = LoadOptions{Environ: env}
	fs = flag.NewFlagSet("serve", flag.ContinueOnError)
	opts.RegisterFlags(fs)
	if err := fs.Parse([]string{"--config", path, "--config.expand-env"}); err != nil {
		t.Fatal(err)
	}
	if !opts.ExpandEnv {
		t.Error("--config.expand-env did not set ExpandEnv")
	}
	c, err = Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:2" || c.AIWorker.MaxConcurrentWorkers != 3 {
		t.Errorf("unset flags changed values: listen %q, max %d", c.Listen, c.AIWorker.MaxConcurrentWorkers)
	}

	// A bad flag value names the flag.
	fs = flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	(&LoadOptions{}).RegisterFlags(fs)
	if err := fs.Parse([]string{"--max-concurrent", "lots"}); err == nil || !strings.Contains(err.Error(), "max-concurrent") {
		t.Errorf("Parse of a bad --max-concurrent = %v", err)
	}
	zero := 0
	_, err = Load(LoadOptions{Path: path, Environ: env, Flags: Flags{MaxConcurrent: &zero}})
	wantFieldError(t, err, "--max-concurrent", "must be at least 1")
}

// TestPrecedence sets one key in every layer, then removes the top layer
// each time: default < file < AI_WORKER_* < CORRAL_* < flag.
func TestPrecedence(t *testing.T) {
	n := 7
	file := MustWriteConfig(t, "ai_worker_config: {max_concurrent_workers: 2}\n")
	tests := []struct {
		name string
		opts LoadOptions
		want int
	}{
		{"flag", LoadOptions{Path: file, Environ: []string{"AI_WORKER_MAX_CONCURRENT=4", "CORRAL_MAX_CONCURRENT=5"}, Flags: Flags{MaxConcurrent: &n}}, 7},
		{"CORRAL_", LoadOptions{Path: file, Environ: []string{"AI_WORKER_MAX_CONCURRENT=4", "CORRAL_MAX_CONCURRENT=5"}}, 5},
		{"AI_WORKER_", LoadOptions{Path: file, Environ: []string{"AI_WORKER_MAX_CONCURRENT=4"}}, 4},
		{"file", LoadOptions{Path: file, Environ: []string{}}, 2},
		{"default", LoadOptions{Path: MustWriteConfig(t, ""), Environ: []string{}}, 3},
	}
	for _, tt := range tests {
		c, err := Load(tt.opts)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got := c.AIWorker.MaxConcurrentWorkers; got != tt.want {
			t.Errorf("%s layer: max_concurrent_workers = %d, want %d", tt.name, got, tt.want)
		}
	}
}

func TestExpandEnv(t *testing.T) {
	const file = `
data: ${CORRAL_TEST_DIR}/data
ai_worker_config: {max_concurrent_workers: $N, namespace: "${NS}"}
agents:
  claude: {env: {ANTHROPIC_API_KEY: "${KEY}", PRICE: "$$5"}, args: [$ARG, "a$"]}
limits: {max_log_bytes: "${LOG}"}
egress: {allow: ["${HOST}"]}
`
	env := []string{"CORRAL_TEST_DIR=/srv", "N=6", "NS=team", "KEY=sk-1", "ARG=-v", "LOG=2MiB", "HOST=api.example.com"}
	c, err := Load(LoadOptions{Path: MustWriteConfig(t, file), Environ: env, ExpandEnv: true})
	if err != nil {
		t.Fatal(err)
	}
	got := []any{c.Data, c.AIWorker.MaxConcurrentWorkers, c.AIWorker.Namespace, c.Agents.Claude.Env, c.Agents.Claude.Args, c.Limits.MaxLogBytes.Bytes(), c.Egress.Allow}
	want := []any{"/srv/data", 6, "team", map[string]string{"ANTHROPIC_API_KEY": "sk-1", "PRICE": "$5"}, []string{"-v", "a$"}, int64(2 << 20), []string{"api.example.com"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("expanded values (-want +got):\n%s", diff)
	}

	// Off (the default): values stay as written, and an agent env value
	// that still holds ${...} is refused instead of reaching the agent.
	c, err = Load(LoadOptions{Path: MustWriteConfig(t, "data: ${CORRAL_TEST_DIR}/data\n"), Environ: env})
	if err != nil {
		t.Fatal(err)
	}
	if c.Data != "${CORRAL_TEST_DIR}/data" {
		t.Errorf("data = %q with expansion off, want it as written", c.Data)
	}
	_, err = Load(LoadOptions{Path: MustWriteConfig(t, "agents: {claude: {env: {ANTHROPIC_API_KEY: \"${KEY}\"}}}\n"), Environ: env})
	wantFieldError(t, err, "agents.claude.env.ANTHROPIC_API_KEY", "expansion is off; run with --config.expand-env")

	// Expansion does not reach keys.
	_, err = Load(LoadOptions{Path: MustWriteConfig(t, "${K}: 1\n"), Environ: []string{"K=listen"}, ExpandEnv: true})
	wantFieldError(t, err, "${K}", "unknown key")

	// A quoted reference (needed inside a flow mapping) fills a number, and
	// a value that is not a number is still refused.
	c, err = Load(LoadOptions{Path: MustWriteConfig(t, "ai_worker_config: {max_concurrent_workers: \"${N}\"}\n"), Environ: env, ExpandEnv: true})
	if err != nil || c.AIWorker.MaxConcurrentWorkers != 6 {
		t.Errorf("quoted reference: %v", err)
	}
	_, err = Load(LoadOptions{Path: MustWriteConfig(t, "ai_worker_config: {max_concurrent_workers: \"${NS}\"}\n"), Environ: env, ExpandEnv: true})
	wantFieldError(t, err, "ai_worker_config.max_concurrent_workers", "must be a whole number")
}

func TestExpandEnvErrors(t *testing.T) {
	tests := []struct{ file, field, msg string }{
		{"data: ${MISSING}\n", "data", "environment variable MISSING is not set"},
		{"data: $MISSING/x\n", "data", "environment variable MISSING is not set"},
		{"data: ${UNTERMINATED\n", "data", "unterminated ${"},
		{"data: ${1BAD}\n", "data", `bad variable name "1BAD"`},
		{"egress: {allow: [a.com, $MISSING]}\n", "egress.allow[1]", "MISSING is not set"},
		{"agents: {claude: {env: {K: $MISSING}}}\n", "agents.claude.env.K", "MISSING is not set"},
	}
	for _, tt := range tests {
		_, err := Load(LoadOptions{Path: MustWriteConfig(t, tt.file), Environ: []string{}, ExpandEnv: true})
		wantFieldError(t, err, tt.field, tt.msg)
	}
}

func TestExpand(t *testing.T) {
	env := map[string]string{"A": "x", "B_2": "y", "E": ""}
	for in, want := range map[string]string{
		"plain":       "plain",
		"$A":          "x",
		"${A}":        "x",
		"${A}${B_2}":  "xy",
		"$A.$B_2/":    "x.y/",
		"pre-$E-post": "pre--post",
		"$$A":         "$A",
		"$$":          "$",
		"cost: 5$":    "cost: 5$",
		"$ 1":         "$ 1",
		"$1":          "$1",
	} {
		got, err := expand(in, env)
		if err != nil || got != want {
			t.Errorf("expand(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(*Config)
		field string
		msg   string
	}{
		{"store driver", func(c *Config) { c.Store.Driver = "mysql" }, "store.driver", "one of"},
		{"postgres without a dsn", func(c *Config) { c.Store.Driver = StorePostgres }, "store.driver", "needs a connection string"},
		{"sqlite with a dsn", func(c *Config) { c.Store.DSNFile = "/etc/corral/dsn" }, "store.dsn_file", "is for store.driver postgres"},
		{"default timeout zero", func(c *Config) { c.AIWorker.DefaultTimeoutMinutes = 0 }, "ai_worker_config.default_timeout_minutes", "must be at least 1"},
		{"default above max", func(c *Config) { c.AIWorker.DefaultTimeoutMinutes = 121 }, "ai_worker_config.default_timeout_minutes", "must not exceed max_timeout_minutes (120)"},
		{"max above a day", func(c *Config) { c.AIWorker.MaxTimeoutMinutes = 1441 }, "ai_worker_config.max_timeout_minutes", "between 1 and 1440"},
		{"max zero", func(c *Config) { c.AIWorker.MaxTimeoutMinutes = 0 }, "ai_worker_config.max_timeout_minutes", "between 1 and 1440"},
		{"max concurrent zero", func(c *Config) { c.AIWorker.MaxConcurrentWorkers = 0 }, "ai_worker_config.max_concurrent_workers", "must be at least 1"},
		{"max queued zero", func(c *Config) { c.AIWorker.MaxQueuedTasks = 0 }, "ai_worker_config.max_queued_tasks", "must be at least 1"},
		{"namespace", func(c *Config) { c.AIWorker.Namespace = "" }, "ai_worker_config.namespace", "Kubernetes namespace"},
		{"image for kubernetes", func(c *Config) { c.Runtime = "kubernetes"; c.AIWorker.AICoderImage = "" }, "ai_worker_config.ai_coder_image", "must be set for the kubernetes runtime"},
		{"mount path", func(c *Config) { c.AIWorker.WorkspaceMountPath = "workspace" }, "ai_worker_config.workspace_mount_path", "absolute"},
		{"server url", func(c *Config) { c.Kubernetes.ServerURL = "corral:7777" }, "kubernetes.server_url", "http(s) URL"},
		{"server url with a token", func(c *Config) { c.Kubernetes.ServerURL = "http://u:p@corral:7777" }, "kubernetes.server_url", "http(s) URL"},
		{"egress listen", func(c *Config) { c.Kubernetes.EgressListen, c.Kubernetes.EgressAddr = "7778", "corral:7778" }, "kubernetes.egress_listen", "host:port"},
		{"egress listen without an address", func(c *Config) { c.Kubernetes.EgressListen = ":7778" }, "kubernetes.egress_listen", "needs kubernetes.egress_addr"},
		{"egress addr without a host", func(c *Config) { c.Kubernetes.EgressListen, c.Kubernetes.EgressAddr = ":7778", ":7778" }, "kubernetes.egress_addr", "with a host and a port"},
		{"egress addr without a listener", func(c *Config) { c.Kubernetes.EgressAddr = "corral:7778" }, "kubernetes.egress_addr", "which is not set"},
		{"secret name", func(c *Config) { c.Kubernetes.SecretName = "Keys" }, "kubernetes.secret_name", "object name"},
		{"credential name", func(c *Config) { c.Egress.Credentials = []EgressCredential{{Name: "Git", Host: "h", SecretEnv: "T"}} }, "egress.credentials[0].name", "lowercase"},
		{"credential names twice", func(c *Config) {
			c.Egress.Credentials = []EgressCredential{{Name: "g", Host: "h", SecretEnv: "T"}, {Name: "g", Host: "i", SecretEnv: "T"}}
		}, "egress.credentials[1].name", "names another rule too"},
		{"credential wildcard", func(c *Config) { c.Egress.Credentials = []EgressCredential{{Name: "g", Host: "*.h", SecretEnv: "T"}} }, "egress.credentials[0]", "wildcards"},
		{"credential header", func(c *Config) {
			c.Egress.Credentials = []EgressCredential{{Name: "g", Host: "h", Header: "Host", SecretEnv: "T"}}
		}, "egress.credentials[0]", "cannot be the header"},
		{"credential prefix", func(c *Config) {
			c.Egress.Credentials = []EgressCredential{{Name: "g", Host: "h", PathPrefix: "/a/../b", SecretEnv: "T"}}
		}, "egress.credentials[0]", "clean path"},
		{"credential scheme", func(c *Config) {
			c.Egress.Credentials = []EgressCredential{{Name: "g", Host: "h", Scheme: "digest", SecretEnv: "T"}}
		}, "egress.credentials[0].scheme", "one of"},
		{"credential basic without user", func(c *Config) {
			c.Egress.Credentials = []EgressCredential{{Name: "g", Host: "h", Scheme: "basic", SecretEnv: "T"}}
		}, "egress.credentials[0].username", "needed with scheme basic"},
		{"credential two secrets", func(c *Config) {
			c.Egress.Credentials = []EgressCredential{{Name: "g", Host: "h", SecretEnv: "T", SecretFile: "/f"}}
		}, "egress.credentials[0]", "one of the two"},
		{"credential no secret", func(c *Config) { c.Egress.Credentials = []EgressCredential{{Name: "g", Host: "h"}} }, "egress.credentials[0]", "one of the two"},
		{"pull policy", func(c *Config) { c.Kubernetes.PullPolicy = "sometimes" }, "kubernetes.pull_policy", "one of"},
		{"seccomp profile", func(c *Config) { c.Kubernetes.SeccompProfile = "/var/lib/kubelet/seccomp/corral.json" }, "kubernetes.seccomp_profile", "relative"},
		{"workspace root relative", func(c *Config) { c.Workspaces.Roots = []string{"/srv/repos", "repos"} }, "workspaces.roots[1]", "absolute, clean directory"},
		{"workspace root /", func(c *Config) { c.Workspaces.Roots = []string{"/"} }, "workspaces.roots[0]", "other than /"},
		{"memory zero", func(c *Config) { c.AIWorker.Resources.MemoryLimit = Size{} }, "ai_worker_config.resources.memory_limit", "must be positive"},
		{"memory request above limit", func(c *Config) { c.AIWorker.Resources.MemoryRequest = mustSize("4Gi") }, "ai_worker_config.resources.memory_request", "must not exceed memory_limit (2Gi)"},
		{"cpu zero", func(c *Config) { c.AIWorker.Resources.CPULimit = 0 }, "ai_worker_config.resources.cpu_limit", "must be positive"},
		{"cpu request above limit", func(c *Config) { c.AIWorker.Resources.CPURequest = 3000 }, "ai_worker_config.resources.cpu_request", "must not exceed cpu_limit (2)"},
		{"pids", func(c *Config) { c.AIWorker.Resources.PidsLimit = 0 }, "ai_worker_config.resources.pids_limit", "at least 32"},
		{"webhook path", func(c *Config) { c.AIWorker.WebhookPath = "api/hook" }, "ai_worker_config.webhook_path", "is fixed at /api/webhooks/worker-complete"},
		{"another webhook path", func(c *Config) { c.AIWorker.WebhookPath = "/hooks/done" }, "ai_worker_config.webhook_path", "remove the key"},
		{"retention", func(c *Config) { c.AIWorker.TaskRetentionHours = 0 }, "ai_worker_config.task_retention_hours", "at least 1"},
		{"event retention", func(c *Config) { c.AIWorker.EventRetentionHours = -1 }, "ai_worker_config.event_retention_hours", "must not be negative (0 keeps events forever)"},
		{"job ttl", func(c *Config) { c.AIWorker.JobTTLSeconds = -1 }, "ai_worker_config.job_ttl_seconds", "not be negative"},
		{"listen no port", func(c *Config) { c.Listen = "localhost" }, "listen", "must be host:port"},
		{"listen bad port", func(c *Config) { c.Listen = "127.0.0.1:http" }, "listen", "port must be a number"},
		{"listen big port", func(c *Config) { c.Listen = "127.0.0.1:70000" }, "listen", "port must be a number"},
		{"public listen without token", func(c *Config) { c.Listen = "0.0.0.0:7777" }, "listen", "set CORRAL_API_TOKEN or listen on loopback"},
		{"all interfaces without token", func(c *Config) { c.Listen = ":7777" }, "listen", "set CORRAL_API_TOKEN or listen on loopback"},
		{"host name without token", func(c *Config) { c.Listen = "corral.internal:7777" }, "listen", "set CORRAL_API_TOKEN or listen on loopback"},
		{"data", func(c *Config) { c.Data = " " }, "data", "must not be empty"},
		{"log level", func(c *Config) { c.Log.Level = "trace" }, "log.level", "must be one of"},
		{"log format", func(c *Config) { c.Log.Format = "xml" }, "log.format", "must be one of"},
		{"runtime", func(c *Config) { c.Runtime = "lxc" }, "runtime", `must be one of local, gvisor, docker, kubernetes, got "lxc"`},
		{"bwrap", func(c *Config) { c.Local.Bwrap = "" }, "local.bwrap", "must not be empty"},
		{"cgroup parent dotdot", func(c *Config) { c.Local.CgroupParent = "../escape" }, "local.cgroup_parent", "clean cgroup path"},
		{"cgroup parent unclean", func(c *Config) { c.Local.CgroupParent = "a//b" }, "local.cgroup_parent", "clean cgroup path"},
		{"cgroup parent empty", func(c *Config) { c.Local.CgroupParent = "/" }, "local.cgroup_parent", "clean cgroup path"},
		{"tmp size", func(c *Config) { c.Local.TmpSize = Size{} }, "local.tmp_size", "must be positive"},
		{"warm pool below -1", func(c *Config) { c.Local.WarmPool = -2 }, "local.warm_pool", "must be -1 (automatic)"},
		{"warm pool too large", func(c *Config) { c.Local.WarmPool = 1001 }, "local.warm_pool", "up to 1000"},
		{"warm idle negative", func(c *Config) { c.Local.WarmIdle = -1 }, "local.warm_idle", "must not be negative"},
		{"warm max negative", func(c *Config) { c.Local.WarmMax = -1 }, "local.warm_max", "must be 0"},
		{"warm memory negative", func(c *Config) { c.Local.WarmMemory = Size{n: -1} }, "local.warm_memory", "must not be negative"},
		{"gvisor warm pool negative", func(c *Config) { c.Gvisor.WarmPool = -1 }, "gvisor.warm_pool", "must be 0 (none)"},
		{"gvisor warm idle negative", func(c *Config) { c.Gvisor.WarmIdle = -1 }, "gvisor.warm_idle", "must not be negative"},
		{"gvisor warm max too large", func(c *Config) { c.Gvisor.WarmMax = 2001 }, "gvisor.warm_max", "up to 2000"},
		{"docker warm pool negative", func(c *Config) { c.Docker.WarmPool = -1 }, "docker.warm_pool", "must be 0 (none)"},
		{"docker warm idle negative", func(c *Config) { c.Docker.WarmIdle = -1 }, "docker.warm_idle", "must not be negative"},
		{"docker warm memory negative", func(c *Config) { c.Docker.WarmMemory = Size{n: -1} }, "docker.warm_memory", "must not be negative"},
		{"kubernetes warm pool negative", func(c *Config) { c.Kubernetes.WarmPool = -1 }, "kubernetes.warm_pool", "must be 0 (none) or up to"},
		{"kubernetes warm idle negative", func(c *Config) { c.Kubernetes.WarmIdle = -1 }, "kubernetes.warm_idle", "must not be negative"},
		{"kubernetes warm max pods negative", func(c *Config) { c.Kubernetes.WarmMaxPods = -1 }, "kubernetes.warm_max_pods", "must not be negative"},
		{"egress mode", func(c *Config) { c.Egress.Mode = "strict" }, "egress.mode", "must be one of none, allowlist, open"},
		{"egress scheme", func(c *Config) { c.Egress.Allow = []string{"a.com", "https://api.openai.com"} }, "egress.allow[1]", "no scheme or path"},
		{"egress port", func(c *Config) { c.Egress.Allow = []string{"api.openai.com:443", "api.openai.com:99999"} }, "egress.allow[1]", "host name"},
		{"egress zone", func(c *Config) { c.Egress.Allow = []string{"127.0.0.1:8080", "[::1]:8080", "[fe80::1%eth0]:80"} }, "egress.allow[2]", "host name"},
		{"egress bad wildcard", func(c *Config) { c.Egress.Allow = []string{"api.*.com"} }, "egress.allow[0]", "host name"},
		{"agent default", func(c *Config) { c.Agents.Default = "aider" }, "agents.default", `got "aider"`},
		{"agent binary", func(c *Config) { c.Agents.Codex.Binary = "" }, "agents.codex.binary", "must not be empty"},
		{"agent env name", func(c *Config) { c.Agents.Claude.Env = map[string]string{"BAD-NAME": "x"} }, "agents.claude.env.BAD-NAME", "not a valid environment variable name"},
		{"agent env NUL", func(c *Config) { c.Agents.Claude.Env = map[string]string{"K": "a\x00b"} }, "agents.claude.env.K", "NUL"},
		{"agent arg NUL", func(c *Config) { c.Agents.Gemini.Args = []string{"ok", "a\x00"} }, "agents.gemini.args[1]", "NUL"},
		{"command binary", func(c *Config) { c.Agents.Command.Binary = "/usr/bin/env" }, "agents.command.binary", "its own argv"},
		{"command args", func(c *Config) { c.Agents.Command.Args = []string{"-v"} }, "agents.command.args", "its own argv"},
		{"notify scheme", func(c *Config) { c.Notify.URL, c.Notify.SecretFile = "ftp://host/x", "/k" }, "notify.url", "http or https URL"},
		{"notify no host", func(c *Config) { c.Notify.URL, c.Notify.SecretFile = "https:///x", "/k" }, "notify.url", "http or https URL"},
		{"notify relative", func(c *Config) { c.Notify.URL, c.Notify.SecretFile = "/hooks", "/k" }, "notify.url", "http or https URL"},
		{"notify event", func(c *Config) { c.Notify.Events = []string{""} }, "notify.events[0]", "must not be empty"},
		{"notify own event", func(c *Config) { c.Notify.Events = []string{"delivery_failed"} }, "notify.events[0]", "cannot be notified"},
		{"notify unsigned", func(c *Config) { c.Notify.URL = "https://h/x" }, "notify.secret_file", "must be set when notify.url is"},
		{"notify attempts", func(c *Config) { c.Notify.MaxAttempts = 0 }, "notify.max_attempts", "at least 1"},
		{"notify backoff", func(c *Config) { c.Notify.MaxBackoff = Duration(time.Millisecond) }, "notify.max_backoff", "at least notify.initial_backoff"},
		{"notify timeout", func(c *Config) { c.Notify.Timeout = 0 }, "notify.timeout", "must be positive"},
		{"notify concurrency", func(c *Config) { c.Notify.Concurrency = 0 }, "notify.concurrency", "at least 1"},
		{"token name", func(c *Config) { c.APITokens = []APIToken{{Name: "Bad Name", TokenFile: "/x"}} }, "api_tokens[0].name", "lowercase letters"},
		{"token name reserved", func(c *Config) { c.APITokens = []APIToken{{Name: "default", TokenFile: "/x"}} }, "api_tokens[0].name", "reserved"},
		{"token name twice", func(c *Config) { c.APITokens = []APIToken{{Name: "a", TokenFile: "/x"}, {Name: "a", TokenFile: "/y"}} }, "api_tokens[1].name", "used by another token"},
		{"token file", func(c *Config) { c.APITokens = []APIToken{{Name: "a"}} }, "api_tokens[0].token_file", "must be set"},
		{"prompt size", func(c *Config) { c.Limits.MaxPromptBytes = Size{} }, "limits.max_prompt_bytes", "must be positive"},
		{"task dir size", func(c *Config) { c.Limits.MaxTaskDirBytes = Size{} }, "limits.max_task_dir_bytes", "must be positive"},
		{"context size", func(c *Config) { c.Limits.MaxContextBytes = Size{} }, "limits.max_context_bytes", "must be positive"},
		{"log size", func(c *Config) { c.Limits.MaxLogBytes = Size{} }, "limits.max_log_bytes", "must be positive"},
		{"request below prompt", func(c *Config) { c.Limits.MaxRequestBytes = mustSize("1KiB") }, "limits.max_request_bytes", "at least limits.max_prompt_bytes (64KiB)"},
		{"skew", func(c *Config) { c.Limits.WebhookMaxSkew = 0 }, "limits.webhook_max_skew", "must be positive"},
		{"grace", func(c *Config) { c.Limits.StopGrace = -1 }, "limits.stop_grace", "not be negative"},
		{"api rate negative", func(c *Config) { c.Limits.APIRate = -1 }, "limits.api_rate", "0 (no limit) or more, got -1"},
		{"api rate NaN", func(c *Config) { c.Limits.APIRate = math.NaN() }, "limits.api_rate", "got NaN"},
		{"api rate infinite", func(c *Config) { c.Limits.APIRate = math.Inf(1) }, "limits.api_rate", "got +Inf"},
		{"api burst zero", func(c *Config) { c.Limits.APIBurst = 0 }, "limits.api_burst", "must be at least 1 (the requests a caller may make at once), got 0"},
		{"api burst negative", func(c *Config) { c.Limits.APIBurst = -5 }, "limits.api_burst", "must be at least 1"},
		{"version", func(c *Config) { c.Version = 2 }, "version", "unsupported config version 2"},
		{"shutdown", func(c *Config) { c.Shutdown = "kill" }, "shutdown", `must be one of leave, stop, got "kill"`},
		{"http host scheme", func(c *Config) { c.HTTP.AllowedHosts = []string{"corral.lan", "http://corral.lan"} }, "http.allowed_hosts[1]", "no scheme, path or wildcard"},
		{"http host wildcard", func(c *Config) { c.HTTP.AllowedHosts = []string{"*.example.com"} }, "http.allowed_hosts[0]", "host name or IP address"},
		{"http host port", func(c *Config) { c.HTTP.AllowedHosts = []string{"corral.lan:0"} }, "http.allowed_hosts[0]", "optional :port"},
		{"http origin without scheme", func(c *Config) { c.HTTP.AllowedOrigins = []string{"corral.example.com"} }, "http.allowed_origins[0]", "scheme://host[:port]"},
		{"http origin path", func(c *Config) { c.HTTP.AllowedOrigins = []string{"https://corral.example.com/ui"} }, "http.allowed_origins[0]", "no path"},
		{"http origin null", func(c *Config) { c.HTTP.AllowedOrigins = []string{"null"} }, "http.allowed_origins[0]", "http or https"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.edit(c)
			err := c.Validate()
			wantFieldError(t, err, tt.field, tt.msg)
			if n := len(fieldErrors(err)); n != 1 {
				t.Errorf("got %d errors, want 1: %v", n, err)
			}
		})
	}
}

func TestValidateAccepts(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
	}{
		{"loopback v6", func(c *Config) { c.Listen = "[::1]:7777" }},
		{"postgres with a dsn file", func(c *Config) { c.Store.Driver, c.Store.DSNFile = StorePostgres, "/etc/corral/dsn" }},
		{"postgres with a dsn", func(c *Config) { c.Store.Driver, c.Store.dsn = StorePostgres, "host=/run/postgresql" }},
		{"localhost", func(c *Config) { c.Listen = "localhost:0" }},
		{"other loopback", func(c *Config) { c.Listen = "127.0.0.2:80" }},
		{"public with token", func(c *Config) { c.Listen = "0.0.0.0:7777"; c.apiToken = "t" }},
		{"public with token file", func(c *Config) { c.Listen = ":7777"; c.APITokenFile = "/etc/corral/token" }},
		{"default equals max", func(c *Config) { c.AIWorker.DefaultTimeoutMinutes = 120 }},
		{"a day", func(c *Config) { c.AIWorker.MaxTimeoutMinutes = 1440 }},
		{"nested cgroup", func(c *Config) { c.Local.CgroupParent = "/system.slice/corral/" }},
		{"wildcard host", func(c *Config) { c.Egress.Allow = []string{"*.googleapis.com", "10.0.0.5"} }},
		{"empty allowlist", func(c *Config) { c.Egress.Allow = nil }},
		{"notify http", func(c *Config) {
			c.Notify.URL = "http://127.0.0.1:9/hook"
			c.Notify.SecretFile = "/etc/corral/notify.key"
		}},
		{"public with named token", func(c *Config) {
			c.Listen = ":7777"
			c.APITokens = []APIToken{{Name: "assistant", TokenFile: "/etc/corral/a"}, {Name: "ci-bot.2", TokenFile: "/etc/corral/b"}}
		}},
		{"zero grace", func(c *Config) { c.Limits.StopGrace = 0 }},
		{"no rate limit", func(c *Config) { c.Limits.APIRate = 0 }},
		{"a request a minute", func(c *Config) { c.Limits.APIRate, c.Limits.APIBurst = 1.0/60, 1 }},
		{"http names", func(c *Config) {
			c.HTTP.AllowedHosts = []string{"corral.example.com", "corral.lan:7777", "192.168.1.5", "[fd00::1]:7777", "fd00::2"}
			c.HTTP.AllowedOrigins = []string{"https://corral.example.com", "http://localhost:5173/", "http://[::1]:8080"}
		}},
		{"zero job ttl", func(c *Config) { c.AIWorker.JobTTLSeconds = 0 }},
		{"local without image", func(c *Config) { c.AIWorker.AICoderImage = "" }},
		{"expanded env", func(c *Config) { c.expanded = true; c.Agents.Claude.Env = map[string]string{"K": "${literal}"} }},
	}
	for _, tt := range tests {
		c := Default()
		tt.edit(c)
		if err := c.Validate(); err != nil {
			t.Errorf("%s: Validate() = %v, want nil", tt.name, err)
		}
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := Default()
	c.Runtime = "lxc"
	c.AIWorker.MaxConcurrentWorkers = 0
	c.Limits.MaxLogBytes = Size{}
	c.Agents.Default = ""
	err := c.Validate()
	var fields []string
	for _, fe := range fieldErrors(err) {
		fields = append(fields, fe.Field)
	}
	slices.Sort(fields)
	want := []string{"agents.default", "ai_worker_config.max_concurrent_workers", "limits.max_log_bytes", "runtime"}
	if diff := cmp.Diff(want, fields); diff != "" {
		t.Errorf("fields (-want +got):\n%s", diff)
	}
}

// TestValidateNamesOrigin checks that a bad value set by a flag names the
// flag, and one set by a variable names the variable.
func TestValidateNamesOrigin(t *testing.T) {
	bad := "nowhere"
	_, err := Load(LoadOptions{Path: MustWriteConfig(t, "listen: x\n"), Environ: []string{"CORRAL_LISTEN=y"}, Flags: Flags{Listen: &bad}})
	wantFieldError(t, err, "--listen", `got "nowhere"`)
	_, err = Load(LoadOptions{Path: MustWriteConfig(t, "listen: x\n"), Environ: []string{"CORRAL_LISTEN=y"}})
	wantFieldError(t, err, "CORRAL_LISTEN", `got "y"`)
	_, err = Load(LoadOptions{Path: MustWriteConfig(t, "listen: x\n"), Environ: []string{}})
	wantFieldError(t, err, "listen", `got "x"`)
}

// TestExampleFile loads corral.example.yaml at the repository root: it
// must load, validate, and show exactly the defaults.
func TestExampleFile(t *testing.T) {
	c, err := Load(LoadOptions{Path: filepath.Join("..", "..", "corral.example.yaml"), Environ: []string{}})
	if err != nil {
		t.Fatalf("load example: %v", err)
	}
	if diff := cmp.Diff(Default(), c, cmpConfig...); diff != "" {
		t.Errorf("corral.example.yaml differs from Default() (-default +example):\n%s", diff)
	}
}

func TestEnvVars(t *testing.T) {
	got := EnvVars()
	for _, name := range []string{"CORRAL_CONFIG", "AI_WORKER_ENABLED", "AI_WORKER_WEBHOOK_SECRET", "CORRAL_API_TOKEN", "CORRAL_DEFAULT_AGENT"} {
		if !slices.Contains(got, name) {
			t.Errorf("EnvVars() lacks %s", name)
		}
	}
}

func TestWarmPoolSize(t *testing.T) {
	for _, tt := range []struct {
		pool    int
		runtime string
		mem     uint64
		want    int
	}{
		{-1, "local", AutoWarmMemory, AutoWarmPool},
		{-1, "local", AutoWarmMemory - 1, 0},
		{-1, "local", 0, 0},
		{-1, "gvisor", 64 << 30, 0},
		{-1, "kubernetes", 64 << 30, 0},
		{0, "local", 64 << 30, 0},
		{7, "local", 1 << 30, 7},
		{7, "docker", 64 << 30, 7},
	} {
		c := &Config{Runtime: tt.runtime, Local: Local{WarmPool: tt.pool}}
		if got := c.LocalWarmPoolSize(tt.mem); got != tt.want || c.Warm(rtkind.Local, tt.mem).Size != got {
			t.Errorf("warm_pool %d, runtime %s, with %d bytes of memory: %d sandboxes (Warm: %d), want %d", tt.pool, tt.runtime, tt.mem, got, c.Warm(rtkind.Local, tt.mem).Size, tt.want)
		}
	}
}

// TestSpecExample: SPEC §9's example, as docs/configuration.md prints it,
// loads (with expansion and the variables it names); as SPEC prints it (the
// ${...} unquoted inside {...}), the error names the line and the key, and
// says how to write it.
func TestSpecExample(t *testing.T) {
	doc, err := os.ReadFile(referencePath)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- spec9 -->\n```yaml\n")
	if !ok {
		t.Fatalf("%s has no <!-- spec9 --> example", referencePath)
	}
	example, _, _ := strings.Cut(rest, "```")
	env := []string{"ANTHROPIC_API_KEY=sk-a", "GEMINI_API_KEY=gm-b"}
	c, err := Load(LoadOptions{Path: MustWriteConfig(t, example), Environ: env, ExpandEnv: true})
	if err != nil {
		t.Fatalf("SPEC §9's example as %s prints it: %v", referencePath, err)
	}
	if c.Agents.Claude.Env["ANTHROPIC_API_KEY"] != "sk-a" || c.AIWorker.Resources.PidsLimit != 512 || c.Notify.URL != "https://assistant.example/hooks/corral" {
		t.Errorf("loaded: claude env %v, pids %d, notify %q", c.Agents.Claude.Env, c.AIWorker.Resources.PidsLimit, c.Notify.URL)
	}
	asSpec := strings.NewReplacer(`"${ANTHROPIC_API_KEY}"`, `${ANTHROPIC_API_KEY}`, `"${GEMINI_API_KEY}"`, `${GEMINI_API_KEY}`).Replace(example)
	_, err = Load(LoadOptions{Path: MustWriteConfig(t, asSpec), Environ: env, ExpandEnv: true})
	if err == nil || !strings.Contains(err.Error(), "line 15") || !strings.Contains(err.Error(), "agents.claude") || !strings.Contains(err.Error(), `must be quoted: "${VAR}"`) {
		t.Errorf("as SPEC prints it: %v; want the line, the key and how to quote", err)
	}
}
