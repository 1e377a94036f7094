package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/agent"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/eventstore/postgres"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/quota"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/sandbox/docker"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/taskrun"
)

// Check is one line of `corral doctor`, the type /api/health answers
// with: what was checked, whether it works, and if not, how to fix it.
type Check = httpapi.Check

// Doctor checks what works on this machine for cfg: the runtimes, their
// limits, and the agents.
func Doctor(ctx context.Context, cfg *config.Config, log *slog.Logger) []Check {
	var out []Check
	// The runtimes' state directories, as serve's under run/: passable by
	// the sandbox identity (MkdirTemp makes them owner-only).
	stateDir, err := os.MkdirTemp("", "corral-doctor-")
	if err == nil {
		defer os.RemoveAll(stateDir)
		os.Chmod(stateDir, 0o711)
	}
	host, err := sandboxIdentity(cfg)
	idc := Check{Name: "sandbox host identity", OK: err == nil, Required: true}
	if err != nil {
		idc.Detail, idc.Fix = err.Error(), "set sandbox.host_uid and sandbox.host_gid to an id no person owns, or leave them unset"
	} else if host.Switch() {
		idc.Detail = fmt.Sprintf("sandboxes run as uid %d gid %d on the host, never root", host.UID, host.GID)
	} else {
		idc.Detail = fmt.Sprintf("sandboxes run as this server's own uid %d", host.UID)
	}
	out = append(out, idc)
	for _, name := range rtkind.Names() {
		out = append(out, doctorRuntime(ctx, name, cfg, filepath.Join(stateDir, name), host, log)...)
	}
	out = append(out, doctorStore(ctx, cfg), doctorQuota(cfg), doctorDisk(cfg.Data), doctorWarm(cfg), doctorWarmRuntime(cfg, rtkind.GVisor), doctorWarmRuntime(cfg, rtkind.Docker), doctorExec(cfg))
	if cfg.Kubernetes.ServerURL != "" {
		out = append(out, doctorWarmKubernetes(cfg))
	}
	agents := agentConfigs(cfg)
	// The agents' version checks run at once, each bounded: an agent
	// that hangs on --version costs the doctor agentVersionWait, not
	// that times the number of agents.
	names := []string{task.AgentClaude, task.AgentGemini, task.AgentCodex, task.AgentOpencode}
	checks := make([]Check, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			ag := agents[name]
			c := Check{Name: "agent " + name, Required: cfg.Agents.Default == name}
			if why := agentMissing(name, ag); why != "" {
				c.Detail = why
				c.Fix = installHint[name]
			} else {
				creds, ok := credentialCheck(name, ag.Env)
				c.OK, c.Detail = ok, agentVersion(ctx, ag.Binary, name)+"; "+creds
				if !ok {
					c.Fix = credentialFix(name)
				}
			}
			checks[i] = c
		})
	}
	wg.Wait()
	out = append(out, checks...)
	out = append(out, Check{Name: "agent command", OK: true, Detail: "any program under the host's /usr"})
	return out
}

// maxClockSkew is the most the store's clock may differ from this
// machine's before doctor says so: servers on one database will order
// their leases by it.
const maxClockSkew = 5 * time.Second

// doctorStore checks the event store: SQLite needs nothing; PostgreSQL is
// reached, its schema compared with this binary's, its clock with this
// machine's, and its server lock looked at.
func doctorStore(ctx context.Context, cfg *config.Config) Check {
	c := Check{Name: "event store", Required: true}
	if cfg.Store.Driver != config.StorePostgres {
		c.OK, c.Detail = true, "SQLite: corral.db in the data root"
		return c
	}
	c.Fix = "check the connection string (CORRAL_STORE_DSN or store.dsn_file) and that PostgreSQL answers"
	secrets, err := cfg.Secrets()
	if err != nil {
		c.Detail = err.Error()
		return c
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := postgres.Inspect(ctx, secrets.StoreDSN)
	if err != nil {
		c.Detail = "PostgreSQL: " + err.Error()
		return c
	}
	servers := "no server runs on it"
	var skewed []string
	if n := len(r.Replicas); n > 0 {
		servers = fmt.Sprintf("%d server(s) run on it", n)
		for _, rep := range r.Replicas {
			if rep.ClockSkew > maxClockSkew || rep.ClockSkew < -maxClockSkew {
				skewed = append(skewed, fmt.Sprintf("%s on %s (%s)", rep.ID, rep.Host, rep.ClockSkew.Round(time.Millisecond)))
			}
		}
	}
	c.Detail = fmt.Sprintf("PostgreSQL %s, schema version %d (this corral's: %d; a start applies what is missing), clock %s from this machine's; %s",
		r.ServerVersion, r.Schema, r.Binary, r.ClockSkew.Round(time.Millisecond), servers)
	if len(skewed) > 0 {
		c.Detail += "; clocks off the database's by more than " + maxClockSkew.String() + ": " + strings.Join(skewed, ", ")
	}
	switch {
	case r.Schema > r.Binary:
		c.Fix = "the database was made by a newer corral: run that version, or a newer one"
	case r.ClockSkew > maxClockSkew || r.ClockSkew < -maxClockSkew || len(skewed) > 0:
		c.Fix = "set the clocks of this machine and the database's right (chrony or systemd-timesyncd)"
	default:
		c.OK, c.Fix = true, ""
	}
	return c
}

// doctorCache runs Doctor for the web UI's health page (GET /api/health)
// at most once per ttl: a run starts a gVisor sandbox and every agent CLI,
// seconds of work that a page reload must not repeat. Callers during a run
// wait for its findings.
type doctorCache struct {
	run func(context.Context) []Check // Doctor, for this server's configuration
	ttl time.Duration

	mu  sync.Mutex
	at  time.Time
	out []Check
}

func (d *doctorCache) checks(ctx context.Context) ([]Check, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.out == nil || time.Since(d.at) > d.ttl {
		d.out, d.at = d.run(ctx), time.Now().UTC()
	}
	return slices.Clone(d.out), d.at
}

// doctorRuntime checks a runtime built exactly as corral serve builds it:
// whether it runs here (for gvisor, a trivial sandbox run with the flags
// tasks use) and, for the default runtime, whether it enforces limits.
func doctorRuntime(ctx context.Context, name string, cfg *config.Config, stateDir string, host hostuser.Identity, log *slog.Logger) []Check {
	c := Check{Name: "runtime " + name, Required: cfg.Runtime == name}
	dataRoot, _ := filepath.Abs(cfg.Data)
	rt, err := openRuntime(name, cfg, dataRoot, stateDir, "", host, nil, log)
	if rt == nil && err == nil {
		c.Detail = unconfigured(name, cfg)
		return []Check{c}
	}
	if err != nil {
		c.Detail = err.Error()
		return []Check{c}
	}
	if cl, ok := rt.(io.Closer); ok {
		defer cl.Close()
	}
	caps, err := rt.Capabilities(ctx)
	switch {
	case err != nil:
		c.Detail = err.Error()
		return []Check{c}
	case !caps.Available:
		c.Detail, c.Fix = caps.Reason, runtimeFix[name]
		return []Check{c}
	}
	c.OK, c.Detail = true, caps.Version
	out := []Check{c}
	if name == cfg.Runtime {
		lim := Check{Name: "sandbox limits (cgroups: memory, cpu, pids)", OK: caps.Limits, Detail: "enforced"}
		if !caps.Limits {
			lim.Fix = "run corral serve as root on a host with cgroups mounted (v1 or v2)"
		}
		if len(caps.Warnings) > 0 {
			lim.Detail = strings.Join(caps.Warnings, "; ")
		}
		out = append(out, lim)
	} else if len(caps.Warnings) > 0 {
		out[0].Detail += "; " + strings.Join(caps.Warnings, "; ")
	}
	if caps.Checkpoint || caps.NoCheckpoint != "" {
		// Not required: a suspend without keeps a session's files.
		cp := Check{Name: "runtime " + name + " checkpoints", OK: caps.Checkpoint, Detail: "a session's suspend keeps its memory and processes"}
		if !caps.Checkpoint {
			cp.Detail, cp.Fix = caps.NoCheckpoint, runtimeCheckpointFix[name]
		}
		out = append(out, cp)
	}
	if d, ok := rt.(*docker.Runtime); ok {
		out = append(out, doctorImages(ctx, d, cfg)...)
	}
	return out
}

// runtimeCheckpointFix is how to let a runtime keep a session's memory
// where its Capabilities say it cannot.
var runtimeCheckpointFix = map[string]string{
	docker.Name: `add "experimental": true to /etc/docker/daemon.json and restart dockerd`,
}

// doctorImages checks that the engine has the images tasks and
// code_execute (when it is on) run by default (or may pull them).
func doctorImages(ctx context.Context, d *docker.Runtime, cfg *config.Config) []Check {
	images := []string{cfg.AIWorker.AICoderImage}
	if img := cfg.Execution.DefaultImage; cfg.Execution.Enabled && img != "" && img != images[0] {
		images = append(images, img)
	}
	var out []Check
	for _, img := range images {
		c := Check{Name: "docker image " + img, Required: cfg.Runtime == docker.Name}
		switch err := d.HasImage(ctx, img); {
		case err == nil:
			c.OK, c.Detail = true, "on the engine"
		case cfg.Docker.Pull:
			c.OK, c.Detail = true, "not on the engine; pulled when first used (docker.pull: true)"
		default:
			c.Detail = err.Error()
			c.Fix = "docker load -i IMAGE.tar (or docker pull " + img + "), or set docker.pull: true"
		}
		out = append(out, c)
	}
	return out
}

// doctorQuota says how task directories will be held to their quota on
// the data root's filesystem (the data root, or the nearest directory
// above it that exists).
func doctorQuota(cfg *config.Config) Check {
	dir, _ := filepath.Abs(cfg.Data)
	for _, err := os.Stat(dir); err != nil && dir != filepath.Dir(dir); _, err = os.Stat(dir) {
		dir = filepath.Dir(dir)
	}
	c := Check{Name: "task directory quota"}
	if _, err := quota.Open(dir); err != nil {
		c.Detail = taskrun.QuotaMode(false) + ": " + err.Error()
		c.Fix = "for a hard limit, put the data root on ext4 made with -O quota,project and mounted with prjquota, or on XFS mounted with pquota, and run corral serve as root"
		return c
	}
	c.OK, c.Detail = true, taskrun.QuotaMode(true)+" on "+dir
	return c
}

// agentVersionWait bounds an agent's --version: one that takes longer
// (a CLI that updates itself, or waits on the network) is reported
// installed with its version unknown.
const agentVersionWait = 3 * time.Second

// agentVersion asks an agent's CLI for its version, briefly.
func agentVersion(ctx context.Context, bin, name string) string {
	if bin == "" {
		bin = name
	}
	ctx, cancel := context.WithTimeout(ctx, agentVersionWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--version")
	// A version check that outlives its time is killed with whatever it
	// started: Output would otherwise wait for a child that holds the pipe.
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	if ctx.Err() != nil {
		return fmt.Sprintf("installed (version unknown: no answer to --version within %s)", agentVersionWait)
	}
	if err != nil && !errors.Is(err, exec.ErrWaitDelay) { // a child left behind holds the pipe, not the answer
		return "installed (version unknown: " + err.Error() + ")"
	}
	return fmt.Sprintf("installed, %s", strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0]))
}

// credentialCheck says whether an agent's environment (KEY=VALUE, the
// task's, from agents.<name>.env) holds what it authenticates with. It
// names variables, never their values; a base URL is shown without its
// user information, query or fragment.
func credentialCheck(name string, env []string) (detail string, ok bool) {
	ad, err := agent.Lookup(name)
	if err != nil {
		return err.Error(), false
	}
	creds := ad.Credentials()
	set := map[string]string{}
	for _, kv := range env {
		if k, v, found := strings.Cut(kv, "="); found && v != "" {
			set[k] = v
		}
	}
	if len(creds.AnyOf) == 0 {
		return "needs no credentials", true
	}
	i := slices.IndexFunc(creds.AnyOf, func(k string) bool { return set[k] != "" })
	if i < 0 {
		which := creds.AnyOf[0]
		if len(creds.AnyOf) > 1 {
			which = "one of " + strings.Join(creds.AnyOf, ", ")
		}
		return fmt.Sprintf("no credentials: set %s in agents.%s.env", which, name), false
	}
	detail = "credentials: " + creds.AnyOf[i] + " set"
	if u := set[creds.BaseURL]; u != "" {
		detail += "; " + creds.BaseURL + " points at " + redactURL(u)
	}
	return detail, true
}

// credentialFix is how to give an agent its credentials.
func credentialFix(name string) string {
	ad, _ := agent.Lookup(name)
	k := ad.Credentials().AnyOf[0]
	return fmt.Sprintf("in the configuration file, agents: {%s: {env: {%s: \"${%s}\"}}}, and run with --config.expand-env", name, k, k)
}

// redactURL is a URL with no user information, query or fragment, which
// may carry secrets; what does not parse as a URL is not shown.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return "(not a URL)"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}

// slowFsync is the fsync time from which doctorDisk calls the data root's
// disk slow: a task waits for three or four, so 30 ms or more a task.
const slowFsync = 10 * time.Millisecond

// doctorDisk times fsyncs of a small file in the data root, as the event
// log's commits make them (corral.db is there): every task waits for
// three (four when it waits in the queue), one after another.
func doctorDisk(dataRoot string) Check {
	median, err := fsyncMedian(dataRoot)
	return diskCheck(dataRoot, median, err)
}

// diskCheck is doctorDisk's line for a median fsync time, or for the error
// that kept it from being measured.
func diskCheck(dataRoot string, median time.Duration, err error) Check {
	c := Check{Name: "data root disk"}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		c.OK, c.Detail = true, "not measured: the data root "+dataRoot+" does not exist yet"
	case errors.Is(err, fs.ErrPermission):
		c.OK, c.Detail = true, "not measured: this user cannot write in the data root "+dataRoot+"; run corral doctor as the user corral serve runs as"
	case err != nil:
		c.Detail, c.Fix = "cannot write in the data root: "+err.Error(), "make the data root a directory the user corral serve runs as can write"
	default:
		c.OK = median < slowFsync
		c.Detail = fmt.Sprintf("a write and fsync takes %.2f ms at the median; each task waits for three or four (the event log's commits, corral_event_commit_seconds in /metrics)", float64(median)/float64(time.Millisecond))
		if !c.OK {
			c.Fix = "put the data root on a local SSD: tasks wait for its fsyncs one after another"
		}
	}
	return c
}

// fsyncMedian writes a page to a new file in dir and fsyncs it, ten
// times, and returns the median time of one; the file is removed.
func fsyncMedian(dir string) (time.Duration, error) {
	f, err := os.CreateTemp(dir, ".doctor-fsync-")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	page := make([]byte, 4096)
	var took []time.Duration
	for i := range 10 {
		start := time.Now()
		if _, err := f.WriteAt(page, int64(i)*int64(len(page))); err != nil {
			return 0, err
		}
		if err := f.Sync(); err != nil {
			return 0, err
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	return took[len(took)/2], nil
}

// doctorWarm says how many sandboxes the local runtime keeps warm, and
// why.
func doctorWarm(cfg *config.Config) Check {
	c := Check{Name: "warm sandboxes (local runtime)", OK: true}
	mem := memTotal()
	n := cfg.LocalWarmPoolSize(mem)
	switch {
	case cfg.Local.WarmPool < 0 && cfg.Runtime != rtkind.Local:
		c.Detail = fmt.Sprintf("none: automatic (local.warm_pool -1), and the default runtime is %s; tasks that ask for local start cold", cfg.Runtime)
	case cfg.Local.WarmPool < 0 && n == 0:
		c.Detail = fmt.Sprintf("none: automatic (local.warm_pool -1), and this machine has %d MiB of memory, under %d MiB; every task starts cold", mem>>20, config.AutoWarmMemory>>20)
	case n == 0:
		c.Detail = "none: local.warm_pool is 0; every task starts cold"
	default:
		c.Detail = fmt.Sprintf("%d per shape (network none; with an egress proxy), for tasks with the default resources outside a workspace; each serves one task and is destroyed; /metrics shows the pools (corral_warm_*)", n)
	}
	return c
}

// doctorWarmRuntime says how many sandboxes the gvisor or docker runtime
// (name) keeps warm, within which budget.
func doctorWarmRuntime(cfg *config.Config, name string) Check {
	c := Check{Name: "warm sandboxes (" + name + " runtime)", OK: true}
	k := cfg.Warm(name, memTotal())
	if k.Size == 0 {
		c.Detail = fmt.Sprintf("none: %s.warm_pool is 0; every %s task starts cold", name, name)
		return c
	}
	budget := "no budget beyond the pool size"
	if k.Max > 0 || k.Memory > 0 {
		budget = fmt.Sprintf("a budget of %d sandboxes (0: no bound) and %d MiB of memory limits (0: no bound)", k.Max, k.Memory>>20)
	}
	what := ""
	if name == rtkind.Docker {
		what = ", for tasks with the default resources and image"
	}
	c.Detail = fmt.Sprintf("%d per shape (network none; with an egress proxy)%s, %s; emptied when the host is short of memory; each serves one task and is destroyed; /metrics shows the pools (corral_warm_*{runtime=%q})", k.Size, what, budget, name)
	return c
}

// doctorWarmKubernetes says how many pods the kubernetes runtime keeps
// warm, within what budget.
func doctorWarmKubernetes(cfg *config.Config) Check {
	k := cfg.Kubernetes
	c := Check{Name: "warm pods (kubernetes runtime)", OK: true, Detail: "none: kubernetes.warm_pool is 0; every task's pod starts cold"}
	if k.WarmPool > 0 {
		budget := "no bound on their memory"
		if b := k.WarmMaxMemory.Bytes(); b > 0 {
			budget = fmt.Sprintf("at most %d MiB of their memory limits", b>>20)
		}
		pods := "warm_pool of each shape"
		if k.WarmMaxPods > 0 {
			pods = fmt.Sprintf("at most %d pods", k.WarmMaxPods)
		}
		c.Detail = fmt.Sprintf("%d per shape (network none; with egress when kubernetes.egress_listen is set), %s, %s, for tasks with the default resources and image; each serves one task; /metrics shows the pools (corral_warm_*{runtime=\"kubernetes\"})", k.WarmPool, pods, budget)
	}
	return c
}

// doctorExec says whether the server offers code_execute, which is off
// unless asked for: a call runs whatever command its caller sends.
func doctorExec(cfg *config.Config) Check {
	c := Check{Name: "code_execute", OK: true}
	if cfg.Execution.Enabled {
		c.Detail = "on (execution.enabled: true): the API's and MCP's callers may run any command once in a fresh sandbox"
	} else {
		c.Detail = "off (execution.enabled: false): not offered, and POST /api/exec answers 503; execution.enabled: true or EXECUTION_ENABLED=true turns it on"
	}
	return c
}
