// Package config holds Corral's configuration: the Config struct, its
// defaults, loading from a YAML file, the environment and flags (in that
// order of precedence), validation, and reading secret files.
//
// It is the only package in Corral that reads the process environment or
// secret files. Other packages never see Config: internal/app converts its
// sections into each package's Options.
package config

import (
	"slices"
	"time"

	"github.com/corral-dev/corral/internal/rtkind"
)

// Version is the only configuration format version this Corral reads. A file
// without a version (or with version 0) is read as version 1.
const Version = 1

// EgressModes are the values egress.mode accepts.
var EgressModes = []string{"none", "allowlist", "open"}

// AgentNames are the agents Corral has adapters for, and so the keys the
// agents section accepts besides default.
var AgentNames = []string{"claude", "gemini", "codex", "opencode", "command"}

// Store drivers.
const (
	StoreSQLite   = "sqlite"
	StorePostgres = "postgres"
)

// Store is where the event log is kept: SQLite, corral.db in the data root
// (the default), or a PostgreSQL database. The PostgreSQL connection string
// is a secret: from CORRAL_STORE_DSN or the file dsn_file names, read with
// Secrets; never a key of the file.
type Store struct {
	// Driver is sqlite (corral.db in the data root) or postgres, which
	// several servers may share as replicas of one cluster. corral store
	// copy moves an existing log from one to the other.
	Driver string `yaml:"driver"`
	// DSNFile names a file (mode 0600) holding the PostgreSQL connection
	// string (driver postgres); CORRAL_STORE_DSN wins over it.
	DSNFile string `yaml:"dsn_file"`
	// dsn is the connection string, from CORRAL_STORE_DSN only.
	dsn string
}

// Config is the whole configuration. Every key is optional; Default()
// serves one machine with no configuration at all.
//
// Secrets have no field and no YAML key: the API token and the webhook
// secret come only from the environment (CORRAL_API_TOKEN,
// AI_WORKER_WEBHOOK_SECRET) or from the files named by api_token_file and
// ai_worker_config.webhook_secret_file, and callers get them from Secrets.
type Config struct {
	// Version is the configuration format's version: 1, the only one
	// this Corral reads (0 or none is read as 1).
	Version int `yaml:"version"`

	// Listen is the HTTP listen address, host:port. A non-loopback
	// address needs an API token.
	Listen string `yaml:"listen"`
	// Data is the data root directory: the event store (SQLite), shared/,
	// tasks/, attachments/, documents/, sessions/ and run/.
	Data string `yaml:"data"`

	// apiToken is the bearer token, from CORRAL_API_TOKEN only; read it
	// with Secrets.
	apiToken string
	// APITokenFile names a file (mode 0600) holding the bearer token, whose
	// caller events record as "default"; CORRAL_API_TOKEN wins over it.
	// Without any token the server refuses a non-loopback listen address.
	APITokenFile string `yaml:"api_token_file"`
	// APITokens are further bearer tokens, each with a name that events
	// record as their actor. The unnamed token above is "default"; with no
	// token at all the actor is "local".
	APITokens []APIToken `yaml:"api_tokens"`
	// HTTP says which names and pages the HTTP API answers.
	HTTP HTTP `yaml:"http"`

	// Store is where the event log is kept.
	Store Store `yaml:"store"`

	Log      Log            `yaml:"log"`
	AIWorker AIWorkerConfig `yaml:"ai_worker_config"`
	// Runtime is the runtime a task or session runs on when it names
	// none: local (bubblewrap), gvisor, docker or kubernetes.
	Runtime    string     `yaml:"runtime"`
	Local      Local      `yaml:"local"`
	Gvisor     Gvisor     `yaml:"gvisor"`
	Docker     Docker     `yaml:"docker"`
	Kubernetes Kubernetes `yaml:"kubernetes"`
	Execution  Execution  `yaml:"execution"`
	Sessions   Sessions   `yaml:"sessions"`
	Workspaces Workspaces `yaml:"workspaces"`
	Sandbox    Sandbox    `yaml:"sandbox"`
	Egress     Egress     `yaml:"egress"`
	Agents     Agents     `yaml:"agents"`
	Notify     Notify     `yaml:"notify"`
	Limits     Limits     `yaml:"limits"`

	// Shutdown is what a graceful stop of the server (SIGTERM, SIGINT)
	// does with the sandboxes it runs: leave (the default) leaves them
	// running for the next start, or another replica, to reattach; stop
	// ends each task it was starting or running as cancelled (reason
	// shutdown; the notification goes out once a server leads again) and
	// each session it runs (session_ended, reason shutdown), their
	// sandboxes stopped with limits.stop_grace and destroyed, all within
	// stop_grace and 10 s; queued tasks stay queued and suspended sessions
	// suspended. Warm sandboxes go at every stop. A kill (SIGKILL, OOM, a
	// crash) leaves everything running whatever this says. On several
	// servers a replica with stop ends its own and hands nothing over.
	Shutdown string `yaml:"shutdown"`

	// CrashAt is for the fault tests only, from CORRAL_TEST_CRASH_AT (no
	// key in the file): the server kills itself with SIGKILL the first
	// time a task reaches this point of its start or end (one of
	// sandbox.CrashPoints, which app checks). "" in production.
	CrashAt string `yaml:"-"`

	// file is the path Load read, "" if none.
	file string
	// expanded records that the file's values went through ExpandEnv.
	expanded bool
	// origin maps a dotted key to the environment variable or flag that
	// set it last, so validation errors can name where a bad value came from.
	origin map[string]string
}

// HTTP says which Host and Origin headers the HTTP API answers besides its
// own: localhost, loopback addresses and the address a request came in on,
// with the listen port, and the host of listen. Any other is refused with
// 403, so that a web page cannot drive the API (DNS rebinding, cross-site
// requests).
type HTTP struct {
	// AllowedHosts are further Host values: host (any port) or host:port,
	// such as the name a reverse proxy forwards or a LAN name.
	AllowedHosts []string `yaml:"allowed_hosts"`
	// AllowedOrigins are further Origin values, scheme://host[:port], whose
	// pages may call the API.
	AllowedOrigins []string `yaml:"allowed_origins"`
}

// Log configures the server's logger.
type Log struct {
	// Level is the least level logged: debug, info, warn or error.
	Level string `yaml:"level"`
	// Format is text or json (one object a line).
	Format string `yaml:"format"`
}

// AIWorkerConfig has the keys of seed 000's ai_worker_config.
type AIWorkerConfig struct {
	// Enabled takes new tasks; false refuses them with a 503 (the rest
	// keeps working).
	Enabled bool `yaml:"enabled"`

	// Namespace is the Kubernetes namespace of the worker Jobs (kubernetes
	// runtime), and of the server in the rendered manifests.
	Namespace string `yaml:"namespace"`
	// AICoderImage is a task's image on the docker and kubernetes runtimes
	// when it names none.
	AICoderImage string `yaml:"ai_coder_image"`
	// AllowedImages are glob patterns (path.Match: "python:*",
	// "corral/*") one of which every image a task names must match, on
	// the runtimes that run images; empty: any image. ai_coder_image, the
	// default, must match too.
	AllowedImages []string `yaml:"allowed_images"`
	// ServiceAccount is the worker pods' service account (kubernetes
	// runtime; it gets no token).
	ServiceAccount string `yaml:"service_account"`
	// RuntimeClass is the worker pods' runtimeClassName (kubernetes
	// runtime); empty: the node's default.
	RuntimeClass string `yaml:"runtime_class"`
	// WorkspacePVC is the claim holding the data root (kubernetes runtime):
	// each mount of a worker pod is a subPath of it.
	WorkspacePVC string `yaml:"workspace_pvc"`
	// WorkspaceMountPath is where the claim is mounted in the server's pod
	// (the rendered manifests).
	WorkspaceMountPath string `yaml:"workspace_mount_path"`

	// DefaultTimeoutMinutes is a task's timeout when it names none.
	DefaultTimeoutMinutes int `yaml:"default_timeout_minutes"`
	// MaxTimeoutMinutes is the most a task may ask for (at most 1440).
	MaxTimeoutMinutes int `yaml:"max_timeout_minutes"`
	// MaxConcurrentWorkers bounds the tasks running at once, on every
	// server of a cluster together; the others wait in the queue, in
	// order.
	MaxConcurrentWorkers int `yaml:"max_concurrent_workers"`
	// MaxQueuedTasks bounds the tasks waiting beyond those.
	MaxQueuedTasks int `yaml:"max_queued_tasks"`

	Resources Resources `yaml:"resources"`

	// WebhookPath is seed 000's key for the route workers post their
	// completion to; its one value is /api/webhooks/worker-complete
	// (DefaultWebhookPath).
	WebhookPath string `yaml:"webhook_path"`
	// webhookSecret is from AI_WORKER_WEBHOOK_SECRET only (a literal
	// webhook_secret in the file is refused); read it with Secrets.
	webhookSecret string
	// WebhookSecretFile names a file (mode 0600) holding the secret
	// workers' completions are signed under; AI_WORKER_WEBHOOK_SECRET wins
	// over it. With neither, the server keeps a generated key in the data
	// root (run/webhook.key).
	WebhookSecretFile string `yaml:"webhook_secret_file"`

	// TaskRetentionHours is how long the directory of an ended task (and
	// of an ended session) is kept.
	TaskRetentionHours int `yaml:"task_retention_hours"`
	// EventRetentionHours is how long an ended task's events are kept
	// whole: then retention removes those that told how it ran (progress,
	// egress connections) and keeps those its record is folded from. 0
	// keeps them all forever.
	EventRetentionHours int `yaml:"event_retention_hours"`
	// AttachmentRetentionHours is how long an attachment is kept after it
	// was created or last named by a task that ended.
	AttachmentRetentionHours int `yaml:"attachment_retention_hours"`
	// RetentionInterval is the time between two retention sweeps.
	RetentionInterval Duration `yaml:"retention_interval"`
	// JobTTLSeconds is the worker Jobs' ttlSecondsAfterFinished (kubernetes
	// runtime).
	JobTTLSeconds int `yaml:"job_ttl_seconds"`
}

// Resources are a worker's default resource requests and limits.
type Resources struct {
	// MemoryRequest is a worker pod's memory request (kubernetes runtime).
	MemoryRequest Size `yaml:"memory_request"`
	// MemoryLimit is a sandbox's memory limit.
	MemoryLimit Size `yaml:"memory_limit"`
	// CPURequest is a worker pod's CPU request (kubernetes runtime).
	CPURequest CPU `yaml:"cpu_request"`
	// CPULimit is a sandbox's CPU limit.
	CPULimit CPU `yaml:"cpu_limit"`
	// PidsLimit bounds a sandbox's processes and threads, its own (about
	// 16) included; at least 32. Not on kubernetes, where the node's
	// podPidsLimit applies.
	PidsLimit int `yaml:"pids_limit"`
}

// Sandbox configures what the host runtimes (local, gvisor) share.
type Sandbox struct {
	// HostUID is the host uid every sandbox runs as under a root server,
	// set with HostGID; 0 (the default): each sandbox its own uid, leased
	// from 1900000001 to 1900065535. Never an id /etc/login.defs gives to
	// people or to their subordinate ids. A server not running as root
	// runs sandboxes as its own user.
	HostUID int `yaml:"host_uid"`
	// HostGID is the host gid sandboxes run as under a root server, set
	// with HostUID; 0: 1900000000, the group reserved for sandboxes.
	HostGID int `yaml:"host_gid"`
}

// Local configures the local (bubblewrap) runtime.
type Local struct {
	// Bwrap is the bubblewrap binary, looked up on PATH if not absolute.
	Bwrap string `yaml:"bwrap"`
	// CgroupParent is the cgroup under which each sandbox gets its own.
	CgroupParent string `yaml:"cgroup_parent"`
	// TmpSize is the size of a sandbox's private /tmp.
	TmpSize Size `yaml:"tmp_size"`
	// WarmPool is how many sandboxes of each shape (network none, and
	// with an egress proxy) the runtime keeps warm, started ahead of the
	// tasks that will claim them, each for one task only. -1 (the
	// default): 4 (AutoWarmPool) where local is the default runtime
	// (runtime) on a machine with at least 4 GiB (AutoWarmMemory) of
	// memory, else 0 (a server whose tasks run elsewhere by default
	// keeps none for the few that ask for local). 0: none, every task
	// starts cold.
	WarmPool int `yaml:"warm_pool"`
	// WarmIdle is how long a pool keeps its sandboxes without a task
	// claiming one; then it empties until the next task of its shape.
	// 0: always kept.
	WarmIdle Duration `yaml:"warm_idle"`
	// WarmMax bounds the runtime's warm sandboxes of all shapes together;
	// 0 (the default): warm_pool of each.
	WarmMax int `yaml:"warm_max"`
	// WarmMemory bounds the sum of the warm sandboxes' memory limits (each
	// counts for the default task's ai_worker_config.resources.memory_limit,
	// the most it may take once claimed); 0 (the default): no bound.
	WarmMemory Size `yaml:"warm_memory"`
}

// Gvisor configures the gvisor runtime: its runsc and its warm
// sandboxes; its sandboxes take local.tmp_size for their /tmp.
type Gvisor struct {
	// Runsc is the runsc binary, looked up on PATH if not absolute.
	Runsc string `yaml:"runsc"`
	// Platform is runsc's --platform: ptrace, systrap or kvm; "" (the
	// default): systrap where this runsc has it (gVisor's own default
	// since 2023), else ptrace (Debian 12's runsc). kvm needs /dev/kvm
	// and is never chosen by itself.
	Platform string `yaml:"platform"`
	// WarmPool is how many sandboxes of each shape (network none, and
	// with an egress proxy) the runtime keeps warm, started ahead of the
	// tasks that will claim them, each for one task only. 0 (the
	// default): none, every task starts cold. An idle warm gVisor sandbox
	// holds its sentry and gofer (docs/benchmarks.md says how much).
	WarmPool int `yaml:"warm_pool"`
	// WarmIdle is how long a pool keeps its sandboxes without a task
	// claiming one; then it empties until the next task of its shape.
	// 0: always kept.
	WarmIdle Duration `yaml:"warm_idle"`
	// WarmMax bounds the runtime's warm sandboxes of all shapes together;
	// 0 (the default): warm_pool of each.
	WarmMax int `yaml:"warm_max"`
	// WarmMemory bounds the sum of the warm sandboxes' memory limits (each
	// counts for the default task's ai_worker_config.resources.memory_limit,
	// the most it may take once claimed); 0 (the default): no bound.
	WarmMemory Size `yaml:"warm_memory"`
}

// WarmKeys are one runtime's warm pool settings.
type WarmKeys struct {
	// Size is the pool's size per shape, -1 resolved; Idle its idle time.
	Size int
	Idle time.Duration
	// Max and Memory are its budget: sandboxes, bytes of memory limits.
	Max    int
	Memory int64
}

// Warm returns the warm pool settings of runtime (local, gvisor, docker,
// kubernetes; none for another) on a machine with memTotal bytes of memory.
func (c *Config) Warm(runtime string, memTotal uint64) WarmKeys {
	switch runtime {
	case rtkind.Local:
		l := c.Local
		return WarmKeys{Size: c.LocalWarmPoolSize(memTotal), Idle: time.Duration(l.WarmIdle), Max: l.WarmMax, Memory: l.WarmMemory.Bytes()}
	case rtkind.GVisor:
		g := c.Gvisor
		return WarmKeys{Size: g.WarmPool, Idle: time.Duration(g.WarmIdle), Max: g.WarmMax, Memory: g.WarmMemory.Bytes()}
	case rtkind.Docker:
		d := c.Docker
		return WarmKeys{Size: d.WarmPool, Idle: time.Duration(d.WarmIdle), Max: d.WarmMax, Memory: d.WarmMemory.Bytes()}
	case rtkind.Kubernetes:
		k := c.Kubernetes
		return WarmKeys{Size: k.WarmPool, Idle: time.Duration(k.WarmIdle), Max: k.WarmMaxPods, Memory: k.WarmMaxMemory.Bytes()}
	}
	return WarmKeys{}
}

// The automatic warm pool: AutoWarmPool sandboxes of each shape where the
// machine has at least AutoWarmMemory bytes of memory. An idle warm
// sandbox costs about 1.9 MiB of memory (PSS; docs/benchmarks.md).
const (
	AutoWarmPool   = 4
	AutoWarmMemory = 4 << 30
)

// LocalWarmPoolSize is local.warm_pool with -1 resolved: AutoWarmPool
// where local is the default runtime and the machine has at least
// AutoWarmMemory of its memTotal bytes, else 0.
func (c *Config) LocalWarmPoolSize(memTotal uint64) int {
	switch {
	case c.Local.WarmPool >= 0:
		return c.Local.WarmPool
	case c.Runtime == rtkind.Local && memTotal >= AutoWarmMemory:
		return AutoWarmPool
	}
	return 0
}

// Docker configures the docker runtime. The image a task runs is its own
// or ai_worker_config.ai_coder_image, checked against
// ai_worker_config.allowed_images.
type Docker struct {
	// Host is the engine's address; default DOCKER_HOST, else
	// unix:///var/run/docker.sock. The engine must run on this machine
	// (sandboxes bind the data root's directories).
	Host string `yaml:"host"`
	// Runtime is the OCI runtime the engine runs sandboxes with, by the
	// name it registered it under (runsc for gVisor, registered with
	// --oci-seccomp and --host-uds=open, which corral doctor checks);
	// empty: the engine's default (runc).
	Runtime string `yaml:"runtime"`
	// Pull lets the engine pull an image it does not have; off, a missing
	// image is an error that says so.
	Pull bool `yaml:"pull"`
	// WarmPool is how many containers of each shape (network none, and
	// with an egress proxy) the runtime keeps warm, started ahead of the
	// tasks that will claim them from ai_worker_config.ai_coder_image,
	// each for one task only. 0 (the default): none, every docker task
	// starts cold. An idle warm container holds its worker, waiting.
	WarmPool int `yaml:"warm_pool"`
	// WarmIdle is how long a pool keeps its containers without a task
	// claiming one; then it empties until the next task of its shape.
	// 0: always kept.
	WarmIdle Duration `yaml:"warm_idle"`
	// WarmMax bounds the runtime's warm containers of all shapes
	// together; 0 (the default): warm_pool of each.
	WarmMax int `yaml:"warm_max"`
	// WarmMemory bounds the sum of the warm containers' memory limits
	// (each counts for the default task's
	// ai_worker_config.resources.memory_limit, the most it may take once
	// claimed); 0 (the default): no bound.
	WarmMemory Size `yaml:"warm_memory"`
}

// Kubernetes has Corral's own keys of the kubernetes runtime; seed 000's
// (namespace, runtime_class, workspace_pvc, ...) are in ai_worker_config.
type Kubernetes struct {
	// Kubeconfig is the kubeconfig file that reaches the cluster; empty:
	// the pod's service account when the server runs in a cluster, else
	// $KUBECONFIG. With neither the runtime is unavailable and says so.
	Kubeconfig string `yaml:"kubeconfig"`
	// ServerURL is where worker pods reach this server (its Service, e.g.
	// http://corral.corral.svc:7777): their signed webhooks go there.
	// Required by the runtime.
	ServerURL string `yaml:"server_url"`
	// EgressListen is where the server listens (host:port, e.g. :7778)
	// for the egress of worker pods, which cannot mount the proxy's
	// socket: each connection proves its task or session with that one's
	// key (package egress). Empty: tasks and sessions on kubernetes run
	// with network none.
	EgressListen string `yaml:"egress_listen"`
	// EgressAddr is where worker pods reach EgressListen (host:port, e.g.
	// corral.corral.svc:7778); empty: server_url's host with
	// egress_listen's port.
	EgressAddr string `yaml:"egress_addr"`
	// SecretName is the operator's Secret of API keys, passed to every
	// worker as environment variables by reference (a missing Secret
	// passes none).
	SecretName string `yaml:"secret_name"`
	// PullPolicy is the workers' imagePullPolicy: IfNotPresent, Always or
	// Never.
	PullPolicy string `yaml:"pull_policy"`
	// SeccompProfile is Corral's seccomp profile as installed on every
	// node (corral k8s seccomp prints it; with --gvisor, the form for a
	// gVisor RuntimeClass), relative to the kubelet's seccomp directory,
	// e.g. corral.json; empty: the container runtime's default, which
	// allows ptrace and io_uring.
	SeccompProfile string `yaml:"seccomp_profile"`
	// WarmPool is how many worker pods of each shape (network none, and
	// with egress when egress_listen is set) the runtime keeps warm:
	// created ahead of the tasks that claim them, each for one task only
	// (docs/kubernetes.md, "Warm pods"). 0 (the default): none, every
	// task's pod starts cold.
	WarmPool int `yaml:"warm_pool"`
	// WarmIdle is how long a pool keeps its pods without a task claiming
	// one; then it empties until the next task of its shape. 0: always
	// kept.
	WarmIdle Duration `yaml:"warm_idle"`
	// WarmMaxPods bounds the warm pods of all shapes together, those
	// waiting and those starting; 0: warm_pool of each shape.
	WarmMaxPods int `yaml:"warm_max_pods"`
	// WarmMaxMemory bounds the sum of the warm pods' memory limits (each
	// counts for ai_worker_config.resources.memory_limit, the most it may
	// take once claimed); 0: no bound.
	WarmMaxMemory Size `yaml:"warm_max_memory"`
}

// Execution configures code_execute (seed 004's section): a command run
// once in a fresh sandbox on the default runtime.
type Execution struct {
	// Enabled offers code_execute; EXECUTION_ENABLED sets it. It is off
	// unless asked for (seed 004): a call runs whatever command its caller
	// sends, in any image the allowlist admits, with no agent in between.
	Enabled bool `yaml:"enabled"`
	// DockerSocket is the seed's engine socket path; when set it is the
	// docker runtime's engine (docker.host unix://<path>).
	DockerSocket string `yaml:"docker_socket"`
	// DefaultImage is a call's image on an image runtime when it names
	// none; empty: ai_worker_config.ai_coder_image. EXECUTION_DEFAULT_IMAGE
	// sets it.
	DefaultImage string `yaml:"default_image"`
	// Timeout is a call's limit in seconds when it gives none (at most
	// 300).
	Timeout int `yaml:"timeout"`
	// MaxMemory is a call's memory limit; 0: the workers' memory_limit.
	MaxMemory Size `yaml:"max_memory"`
	// NetworkEnabled lets a call ask for the network (network: true).
	NetworkEnabled bool `yaml:"network_enabled"`
	// MaxOutputSize bounds the stdout and the stderr a call returns, each.
	MaxOutputSize Size `yaml:"max_output_size"`
	// AllowedImages are the glob patterns a call's image must match;
	// empty: ai_worker_config.allowed_images.
	AllowedImages []string `yaml:"allowed_images"`
}

// Sessions configures sessions: long-lived sandboxes commands run in.
type Sessions struct {
	// MaxSessions bounds the sessions running at once (429 past it).
	MaxSessions int `yaml:"max_sessions"`
	// IdleTimeout is a session's default and upper bound of the time it
	// may go idle (no command running, no output) before IdleAction.
	IdleTimeout Duration `yaml:"idle_timeout"`
	// MaxLifetime is a session's default and upper bound of its whole
	// life, suspended time included.
	MaxLifetime Duration `yaml:"max_lifetime"`
	// IdleAction is what becomes of an idle session (no command running,
	// no output, for its idle timeout): "suspend" suspends it (its memory
	// kept where its runtime checkpoints, its files elsewhere); "delete"
	// ends it; "auto" (the default) suspends it where its memory is kept
	// and ends it elsewhere.
	IdleAction string `yaml:"idle_action"`
}

// DefaultWebhookPath is the route workers post completions to
// (webhook.Path), the only value ai_worker_config.webhook_path takes.
const DefaultWebhookPath = "/api/webhooks/worker-complete"

// Shutdown behaviours (Config.Shutdown).
const (
	ShutdownLeave = "leave"
	ShutdownStop  = "stop"
)

// Idle actions.
const (
	IdleAuto    = "auto"
	IdleDelete  = "delete"
	IdleSuspend = "suspend"
)

// Workspaces configures the named workspaces workspace tasks work in.
type Workspaces struct {
	// Roots are directories outside the data root whose direct
	// subdirectories are workspaces too, named by their absolute path
	// (e.g. /srv/repos, so that /srv/repos/app is one). Tasks there run as
	// the sandbox identity, which owns the directory while they do; it
	// goes back to its owner afterwards. Only on the runtimes of the
	// server's host (local, gvisor, docker): a task there on kubernetes is
	// refused.
	Roots []string `yaml:"roots"`
	// AllowHooks leaves the git hooks a task or session creates or
	// changes in a workspace executable. By default they lose their
	// execute bits once the sandbox is gone (a linked hook is removed):
	// git would run them as the workspace's owner, outside any sandbox.
	// Either way they are listed in the result.
	AllowHooks bool `yaml:"allow_hooks"`
}

// Egress configures the network workers reach through the egress proxy.
type Egress struct {
	// Mode is the network of a task that names none: none, allowlist or
	// open.
	Mode string `yaml:"mode"`
	// Allow are the hosts the allowlist mode lets through: host (ports 443
	// and 80), host:port, or *.example.com (subdomains only). Loopback and
	// private addresses only when listed by address: 127.0.0.1:8080.
	Allow []string `yaml:"allow"`
	// TaskHosts says what a task's own allowlist (spawn's network_allow,
	// PATCH /api/tasks/{id}/network) may hold: "narrow" (the default),
	// only what Allow lets through; "add", any host.
	TaskHosts string `yaml:"task_hosts"`
	// Credentials are headers the proxy adds to HTTPS requests for a host
	// (a git host's or a package index's token), so that the secret stays
	// with the server: the proxy intercepts the TLS of these hosts only,
	// under a CA of the server's own that sandboxes with network trust.
	Credentials []EgressCredential `yaml:"credentials"`
	// UpstreamCAFile names a PEM file of CA certificates the proxy trusts,
	// beside the system's, where it speaks TLS itself (model APIs, hosts
	// with credentials): a private git server's CA.
	UpstreamCAFile string `yaml:"upstream_ca_file"`
}

// EgressCredential is one credential rule (egress.credentials). The
// secret comes from a file (mode 0600) or an environment variable of the
// server, never from this file.
type EgressCredential struct {
	// Name names the rule in events and in a task's credentials.
	Name string `yaml:"name"`
	// Host is host or host:port (443 when none).
	Host string `yaml:"host"`
	// PathPrefix, if set, limits the rule to that path and below.
	PathPrefix string `yaml:"path_prefix"`
	// Header is the header set; Authorization when empty.
	Header string `yaml:"header"`
	// Scheme says how the secret becomes the header's value: "" as it
	// is, "bearer" ("Bearer <secret>"), "basic" ("Basic " and the base64
	// of Username:secret).
	Scheme string `yaml:"scheme"`
	// Username is the user of the basic scheme.
	Username string `yaml:"username"`
	// SecretFile names the file (mode 0600) holding the secret; one of it
	// and SecretEnv.
	SecretFile string `yaml:"secret_file"`
	// SecretEnv names the server's environment variable holding the
	// secret; one of it and SecretFile.
	SecretEnv string `yaml:"secret_env"`
	// OnRequest: only the tasks that name the rule in their credentials
	// get it; otherwise every task and session with network does.
	OnRequest bool `yaml:"on_request"`
	// PlaceholderEnv names a variable the sandbox gets with a placeholder
	// in the secret's place, for a program that insists on one (GH_TOKEN):
	// what it sends in the rule's header is replaced at the egress.
	PlaceholderEnv string `yaml:"placeholder_env"`

	// fromEnv is SecretEnv's value, read by Load.
	fromEnv string
}

// Credential schemes.
const (
	SchemeBearer = "bearer"
	SchemeBasic  = "basic"
)

// TaskHosts values.
const (
	TaskHostsNarrow = "narrow"
	TaskHostsAdd    = "add"
)

// Agents configures the agent adapters.
type Agents struct {
	// Default is the agent a task without one uses.
	Default  string `yaml:"default"`
	Claude   Agent  `yaml:"claude"`
	Gemini   Agent  `yaml:"gemini"`
	Codex    Agent  `yaml:"codex"`
	Opencode Agent  `yaml:"opencode"`
	Command  Agent  `yaml:"command"`
}

// Agent configures one agent adapter.
type Agent struct {
	// Binary is the agent's program, looked up inside the sandbox. It
	// defaults to the agent's name (command's is fixed: a command task
	// runs its own argv).
	Binary string `yaml:"binary"`
	// Args are extra arguments appended to the adapter's own, after its
	// flags (none for command, whose argv is the task's).
	Args []string `yaml:"args"`
	// Env is added to the agent's environment. Values may be secrets:
	// never log them.
	Env map[string]string `yaml:"env"`
}

// Get returns the agent named name (one of AgentNames).
func (a *Agents) Get(name string) (Agent, bool) {
	p := a.ptr(name)
	if p == nil {
		return Agent{}, false
	}
	return *p, true
}

// Set replaces the agent named name (one of AgentNames); another name
// changes nothing.
func (a *Agents) Set(name string, ag Agent) {
	if p := a.ptr(name); p != nil {
		*p = ag
	}
}

func (a *Agents) ptr(name string) *Agent {
	switch name {
	case "claude":
		return &a.Claude
	case "gemini":
		return &a.Gemini
	case "codex":
		return &a.Codex
	case "opencode":
		return &a.Opencode
	case "command":
		return &a.Command
	}
	return nil
}

// APIToken is one named bearer token.
type APIToken struct {
	// Name is the actor recorded on what its caller does.
	Name string `yaml:"name"`
	// TokenFile names the file (mode 0600) holding the token.
	TokenFile string `yaml:"token_file"`
}

// Notify configures outbound notifications to the host.
type Notify struct {
	// URL is the host's callback, http or https; empty turns
	// notifications off.
	URL string `yaml:"url"`
	// SecretFile names a file (mode 0600) holding whsec_ and a base64 key,
	// the Standard Webhooks signing key; required with URL.
	SecretFile string `yaml:"secret_file"`
	// PreviousSecretFile, during a rotation, holds the secret before
	// SecretFile's: notifications carry a signature under each, so the
	// host verifies them with either (corral notify-secret says how).
	PreviousSecretFile string `yaml:"previous_secret_file"`
	// Events are the event types sent besides worker_completed, which
	// always is.
	Events []string `yaml:"events"`
	// MaxAttempts POSTs a notification gets before it is a dead letter.
	MaxAttempts int `yaml:"max_attempts"`
	// InitialBackoff is the wait after the first failed attempt; it
	// doubles, with jitter, after each one up to MaxBackoff.
	InitialBackoff Duration `yaml:"initial_backoff"`
	// MaxBackoff is the longest wait between two attempts.
	MaxBackoff Duration `yaml:"max_backoff"`
	// Timeout bounds one POST.
	Timeout Duration `yaml:"timeout"`
	// Concurrency bounds the POSTs in flight.
	Concurrency int `yaml:"concurrency"`
}

// Limits bound what callers and workers may use.
type Limits struct {
	// MaxPromptBytes bounds a task description.
	MaxPromptBytes Size `yaml:"max_prompt_bytes"`
	// MaxTaskDirBytes bounds everything in one task directory, and a
	// session's own directory (in the kernel where the data root has
	// project quotas, else polled).
	MaxTaskDirBytes Size `yaml:"max_task_dir_bytes"`
	// MaxContextBytes bounds the context files copied into a task.
	MaxContextBytes Size `yaml:"max_context_bytes"`
	// MaxRequestBytes bounds an API request's body (uploads aside).
	MaxRequestBytes Size `yaml:"max_request_bytes"`
	// MaxLogBytes bounds an agent's transcript.
	MaxLogBytes Size `yaml:"max_log_bytes"`
	// MaxUploadBytes bounds one uploaded attachment (or one made from a
	// workspace file); 413 past it.
	MaxUploadBytes Size `yaml:"max_upload_bytes"`
	// MaxUploadRequestBytes bounds a whole upload request.
	MaxUploadRequestBytes Size `yaml:"max_upload_request_bytes"`
	// MaxSharedBytes bounds the total size of shared/ (write_workspace and
	// save_to_shared); 429 naming the limit past it.
	MaxSharedBytes Size `yaml:"max_shared_bytes"`
	// MaxWriteBytes bounds one write_workspace file; 413 past it.
	MaxWriteBytes Size `yaml:"max_write_bytes"`
	// MinFreeDisk is the free-space floor of the data root's filesystem:
	// below it no new work is taken and a task still writing is stopped.
	// 0 turns it off.
	MinFreeDisk Size `yaml:"min_free_disk"`
	// WebhookMaxSkew is how old a worker's signed webhook may be.
	WebhookMaxSkew Duration `yaml:"webhook_max_skew"`
	// StopGrace is the time from SIGTERM to SIGKILL when a sandbox is
	// stopped: a task's cancelled, a session's ended (its commands get
	// the SIGTERM).
	StopGrace Duration `yaml:"stop_grace"`
	// APIRate and APIBurst are a token bucket per caller of the API and
	// MCP: each API token (with none configured, the local caller) and
	// each session token may make APIRate requests a second on average
	// and APIBurst at once; past them a 429 with Retry-After. An event
	// stream is one request however long it stays open. 0 APIRate turns
	// the limit off.
	APIRate float64 `yaml:"api_rate"`
	// APIBurst is the requests a caller may make at once (see APIRate).
	APIBurst int `yaml:"api_burst"`
}

// Default returns the configuration used when nothing is set: one machine,
// loopback only, the local runtime.
func Default() *Config {
	return &Config{
		Version: Version,
		Listen:  "127.0.0.1:7777",
		Data:    "./corral-data",
		Store:   Store{Driver: StoreSQLite},
		Log:     Log{Level: "info", Format: "text"},
		AIWorker: AIWorkerConfig{
			Enabled:               true,
			Namespace:             "default",
			AICoderImage:          "corral-worker:latest",
			ServiceAccount:        "corral-worker",
			RuntimeClass:          "gvisor",
			WorkspacePVC:          "corral-workspace",
			WorkspaceMountPath:    "/workspace",
			DefaultTimeoutMinutes: 30,
			MaxTimeoutMinutes:     120,
			MaxConcurrentWorkers:  3,
			MaxQueuedTasks:        100,
			Resources: Resources{
				MemoryRequest: mustSize("512Mi"),
				MemoryLimit:   mustSize("2Gi"),
				CPURequest:    500,
				CPULimit:      2000,
				PidsLimit:     512,
			},
			WebhookPath:              DefaultWebhookPath,
			TaskRetentionHours:       48,
			EventRetentionHours:      720,
			AttachmentRetentionHours: 168,
			RetentionInterval:        Duration(10 * time.Minute),
			JobTTLSeconds:            3600,
		},
		Runtime:    rtkind.Local,
		Local:      Local{Bwrap: "bwrap", CgroupParent: "corral", TmpSize: mustSize("256MiB"), WarmPool: -1, WarmIdle: Duration(10 * time.Minute)},
		Gvisor:     Gvisor{Runsc: "runsc", WarmIdle: Duration(10 * time.Minute)},
		Docker:     Docker{Host: "unix:///var/run/docker.sock", WarmIdle: Duration(10 * time.Minute)},
		Kubernetes: Kubernetes{SecretName: "ai-worker-secrets", PullPolicy: "IfNotPresent", WarmIdle: Duration(10 * time.Minute)},
		Execution:  Execution{Timeout: 60, MaxOutputSize: mustSize("1MiB")},
		Sessions:   Sessions{MaxSessions: 8, IdleTimeout: Duration(30 * time.Minute), MaxLifetime: Duration(8 * time.Hour), IdleAction: IdleAuto},
		Egress: Egress{
			// SPEC §4: the model providers' API hosts, through the proxy.
			Mode:      "allowlist",
			Allow:     []string{"api.anthropic.com", "generativelanguage.googleapis.com", "api.openai.com"},
			TaskHosts: TaskHostsNarrow,
		},
		Agents: Agents{
			Default:  "claude",
			Claude:   Agent{Binary: "claude"},
			Gemini:   Agent{Binary: "gemini"},
			Codex:    Agent{Binary: "codex"},
			Opencode: Agent{Binary: "opencode"},
			Command:  Agent{Binary: "command"},
		},
		Notify: Notify{
			MaxAttempts:    15,
			InitialBackoff: Duration(time.Second),
			MaxBackoff:     Duration(time.Hour),
			Timeout:        Duration(10 * time.Second),
			Concurrency:    4,
		},
		Limits: Limits{
			MaxPromptBytes:        mustSize("64KiB"),
			MaxTaskDirBytes:       mustSize("1GiB"),
			MaxContextBytes:       mustSize("256MiB"),
			MaxRequestBytes:       mustSize("1MiB"),
			MaxLogBytes:           mustSize("16MiB"),
			MaxUploadBytes:        mustSize("25MiB"),
			MaxUploadRequestBytes: mustSize("100MiB"),
			MaxSharedBytes:        mustSize("10GiB"),
			MaxWriteBytes:         mustSize("1MiB"),
			MinFreeDisk:           mustSize("256MiB"),
			WebhookMaxSkew:        Duration(5 * time.Minute),
			StopGrace:             Duration(10 * time.Second),
			APIRate:               50,
			APIBurst:              200,
		},
		Shutdown: ShutdownLeave,
	}
}

// File returns the path of the configuration file Load read, or "" if it
// read none.
func (c *Config) File() string { return c.file }

func mustSize(s string) Size {
	v, err := ParseSize(s)
	if err != nil {
		panic(err)
	}
	return v
}

func known(set []string, v string) bool { return slices.Contains(set, v) }
