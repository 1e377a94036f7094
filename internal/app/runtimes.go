package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/agent"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/docker"
	"github.com/corral-dev/corral/internal/sandbox/gvisor"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes"
	"github.com/corral-dev/corral/internal/sandbox/local"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// runtimeFix is how to make each runtime available on Debian.
var runtimeFix = map[string]string{
	local.Name:  "apt-get install -y bubblewrap",
	gvisor.Name: "apt-get install -y runsc",
	docker.Name: "apt-get install -y docker.io, start dockerd, and load the image (docker load)",
}

// unconfigured says why openRuntime opened no runtime name.
func unconfigured(name string, cfg *config.Config) string {
	if name != kubernetes.Name {
		return ""
	}
	if cfg.Kubernetes.ServerURL == "" {
		return "kubernetes.server_url is not set: the URL worker pods reach this server at (its Service)"
	}
	return "no cluster: set kubernetes.kubeconfig or KUBECONFIG, or run the server in the cluster (corral k8s render)"
}

// clusterConfig is how to reach the cluster: kubernetes.kubeconfig, else
// the pod's service account in a cluster, else $KUBECONFIG; nil if none.
func clusterConfig(cfg *config.Config) (*rest.Config, error) {
	path := cfg.Kubernetes.Kubeconfig
	if path == "" {
		if c, err := rest.InClusterConfig(); err == nil {
			return c, nil
		}
		path = os.Getenv("KUBECONFIG")
	}
	if path == "" {
		return nil, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return c, nil
}

// openRuntime builds the runtime name (one of rtkind.Names()) as cfg
// configures it, keeping its state under stateDir, or returns nil for one
// not configured (unconfigured says why). worker is the corral-worker
// executable beside the server's own (not the copy staged in the data
// root for sandboxes), which gvisor runs on the host, as root, as its
// restores' subreaper; "" for none (doctor, which restores nothing).
// corral serve and corral doctor both build their runtimes here, so
// doctor checks what serve runs. This is the one place that names
// concrete backends.
func openRuntime(name string, cfg *config.Config, dataRoot, stateDir, worker string, host hostuser.Identity, ids *hostuser.Identities, log *slog.Logger) (sandbox.Runtime, error) {
	switch name {
	case local.Name:
		return local.New(local.Options{
			StateDir:     stateDir,
			DataRoot:     dataRoot,
			HostRoots:    cfg.Workspaces.Roots,
			Bwrap:        cfg.Local.Bwrap,
			CgroupParent: cfg.Local.CgroupParent,
			TmpSize:      cfg.Local.TmpSize.Bytes(),
			// No single file (an output, a log, the sandbox's own
			// output.log) may outgrow the task directory's quota,
			// whatever the quota watcher's timing.
			FileSizeLimit: cfg.Limits.MaxTaskDirBytes.Bytes(),
			Host:          host,
			Identities:    ids,
			Crash:         crashHook(cfg.CrashAt, log),
		}, log)
	case gvisor.Name:
		return gvisor.New(gvisor.Options{
			StateDir:   stateDir,
			DataRoot:   dataRoot,
			Runsc:      cfg.Gvisor.Runsc,
			Platform:   cfg.Gvisor.Platform,
			TmpSize:    cfg.Local.TmpSize.Bytes(),
			Host:       host,
			Identities: ids,
			Subreaper:  worker,
			Crash:      crashHook(cfg.CrashAt, log),
		}, log)
	case docker.Name:
		engine := cfg.Docker.Host
		if cfg.Execution.DockerSocket != "" {
			engine = "unix://" + cfg.Execution.DockerSocket // seed 004's key
		}
		return docker.New(docker.Options{
			DataRoot:      dataRoot,
			StateDir:      stateDir,
			Host:          engine,
			Runtime:       cfg.Docker.Runtime,
			DefaultImage:  cfg.AIWorker.AICoderImage,
			Pull:          cfg.Docker.Pull,
			TmpSize:       cfg.Local.TmpSize.Bytes(),
			FileSizeLimit: cfg.Limits.MaxTaskDirBytes.Bytes(),
			User:          host,
			Identities:    ids,
			Crash:         crashHook(cfg.CrashAt, log),
		}, log)
	case kubernetes.Name:
		k := cfg.Kubernetes
		if k.ServerURL == "" {
			return nil, nil
		}
		cluster, err := clusterConfig(cfg)
		if cluster == nil || err != nil {
			return nil, err
		}
		w := cfg.AIWorker
		return kubernetes.New(kubernetes.Options{
			Config:           cluster,
			Namespace:        w.Namespace,
			DataRoot:         dataRoot,
			Claim:            w.WorkspacePVC,
			RuntimeClass:     w.RuntimeClass,
			ServiceAccount:   w.ServiceAccount,
			DefaultImage:     w.AICoderImage,
			PullPolicy:       k.PullPolicy,
			MemoryRequest:    w.Resources.MemoryRequest.Bytes(),
			CPURequestMillis: w.Resources.CPURequest.Millis(),
			TmpSize:          cfg.Local.TmpSize.Bytes(),
			JobTTL:           time.Duration(w.JobTTLSeconds) * time.Second,
			SecretName:       k.SecretName,
			SeccompProfile:   k.SeccompProfile,
			ServerURL:        k.ServerURL,
			StateDir:         stateDir,
			Crash:            crashHook(cfg.CrashAt, log),
		}, log)
	}
	return nil, nil
}

// openRuntimes builds the runtimes this server offers, each keeping its
// state in run/<name>.
func (a *App) openRuntimes(ctx context.Context) (map[string]sandbox.Runtime, error) {
	out := map[string]sandbox.Runtime{}
	// One range of identities for the sandboxes of every runtime here.
	ids := hostuser.NewIdentities(a.sandboxUser, a.data.HostPath(workspace.DirRun, "identities"))
	for _, name := range rtkind.Names() {
		rt, err := openRuntime(name, a.cfg, a.data.Path(), a.data.HostPath(workspace.DirRun, name), filepath.Join(filepath.Dir(a.opts.Binary), workerproto.WorkerName), a.sandboxUser, ids, a.log)
		if err != nil {
			return nil, fmt.Errorf("open %s runtime: %w", name, err)
		}
		if rt != nil {
			out[name] = rt
		}
	}
	return out, nil
}

// availability says, for each runtime and network policy, why a task cannot
// use it ("" if it can).
func (a *App) availability(ctx context.Context, sandboxes map[string]sandbox.Runtime) (runtimes, networks map[string]string) {
	runtimes = map[string]string{}
	for _, name := range rtkind.Names() {
		rt, ok := sandboxes[name]
		if !ok {
			runtimes[name] = unconfigured(name, a.cfg)
			continue
		}
		caps, err := rt.Capabilities(ctx)
		switch {
		case err != nil:
			runtimes[name] = err.Error()
		case !caps.Available:
			runtimes[name] = caps.Reason
		default:
			runtimes[name] = ""
			for _, w := range caps.Warnings {
				a.log.Warn("runtime degraded", "runtime", name, "warning", w)
			}
		}
		switch {
		case runtimes[name] != "" && name == a.cfg.Runtime:
			a.log.Error("default runtime unavailable", "runtime", name, "reason", runtimes[name])
		case runtimes[name] != "":
			// Checked once, at start: what is installed or configured
			// later is offered after a restart.
			a.log.Info("runtime not offered", "runtime", name, "reason", runtimes[name], "note", "checked at start; restart the server once it is fixed")
		}
	}
	// Every runtime gives a sandbox loopback only; allowlist and open add
	// the egress proxy (internal/egress), reached through a unix socket
	// the sandbox mounts.
	networks = map[string]string{
		task.NetworkNone:      "",
		task.NetworkAllowlist: "",
		task.NetworkOpen:      "",
	}
	return runtimes, networks
}

// place makes the runtimes' records: each kind's sandbox (if configured),
// why it takes no work, and, for the remote one (kubernetes), the URL its
// sandboxes post to and where they reach the egress proxies (egressAddr;
// "" for nowhere).
func (a *App) place(sandboxes map[string]sandbox.Runtime, available map[string]string, egressAddr string) *placement.Set {
	var rs []*placement.Runtime
	for _, k := range rtkind.Kinds {
		r := &placement.Runtime{Kind: k, Sandbox: sandboxes[k.Name], Unavailable: available[k.Name]}
		if k.Name == kubernetes.Name {
			r.ServerURL, r.EgressAddr = a.cfg.Kubernetes.ServerURL, egressAddr
			if egressAddr == "" {
				r.NoEgress = "worker pods reach the egress proxy only when kubernetes.egress_listen is set"
			}
		}
		rs = append(rs, r)
	}
	return placement.NewSet(rs...)
}

// agentConfigs turns the agents section into the orchestrator's form.
func agentConfigs(cfg *config.Config) map[string]workerproto.AgentConfig {
	out := map[string]workerproto.AgentConfig{}
	for _, name := range []string{task.AgentClaude, task.AgentGemini, task.AgentCodex, task.AgentOpencode, task.AgentCommand} {
		ag, _ := cfg.Agents.Get(name)
		ac := workerproto.AgentConfig{Binary: ag.Binary, Args: ag.Args}
		keys := make([]string, 0, len(ag.Env))
		for k := range ag.Env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ac.Env = append(ac.Env, k+"="+ag.Env[k])
		}
		ac.SandboxEnv = ac.Env
		if ad, err := agent.Lookup(name); err == nil {
			var apis []agent.ModelAPI
			ac.SandboxEnv, apis = ad.Credentials().ModelAPIs(ac.Env)
			for _, m := range apis {
				ac.Models = append(ac.Models, workerproto.ModelAPI(m))
			}
		}
		out[name] = ac
	}
	return out
}

// checkModelAPIs refuses agents whose keys the egress could not add to
// their model APIs' requests: a base URL variable that is no http(s) URL.
func checkModelAPIs(agents map[string]workerproto.AgentConfig) error {
	for _, name := range slices.Sorted(maps.Keys(agents)) {
		if _, err := egressModels(agents[name].Models); err != nil {
			return &errdefs.FieldError{Field: "agents." + name + ".env", Err: fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)}
		}
	}
	return nil
}

// agentNoCredentials says which variable an agent's configured
// environment must set for it to authenticate, when it sets none of them
// (doctor's check of the same).
func agentNoCredentials(name string, ag workerproto.AgentConfig) string {
	if detail, ok := credentialCheck(name, ag.Env); !ok {
		return "the " + name + " agent has " + detail
	}
	return ""
}

// installHint is how to install each agent's CLI.
var installHint = map[string]string{
	task.AgentClaude:   "npm install -g @anthropic-ai/claude-code",
	task.AgentGemini:   "npm install -g @google/gemini-cli",
	task.AgentCodex:    "npm install -g @openai/codex",
	task.AgentOpencode: "npm install -g opencode-ai",
}

// agentMissing says why an agent cannot start in a local sandbox, which
// sees the host's /usr: its binary must be found there.
func agentMissing(name string, ag workerproto.AgentConfig) string {
	switch name {
	case task.AgentCommand:
		return ""
	}
	bin := ag.Binary
	if bin == "" {
		bin = name
	}
	p, err := exec.LookPath(bin)
	if err == nil && (strings.HasPrefix(p, "/usr/") || strings.HasPrefix(p, "/bin/")) {
		return ""
	}
	if err == nil {
		return fmt.Sprintf("agent binary %q is at %s, outside /usr, so sandboxes cannot see it", bin, filepath.Dir(p))
	}
	if _, err := os.Stat(bin); err == nil && filepath.IsAbs(bin) {
		return ""
	}
	return fmt.Sprintf("agent binary %q is not installed (install: %s)", bin, installHint[name])
}

// DestroySandboxes destroys every sandbox the runtimes hold. It is for a
// throwaway server (corral bench, tests) whose Run has returned: a real
// server leaves its sandboxes running for the next start to reattach.
func (a *App) DestroySandboxes(ctx context.Context) error {
	var errs []error
	for name, rt := range a.placements.Sandboxes() {
		if caps, err := rt.Capabilities(ctx); err != nil || !caps.Available {
			continue // it could never have made a sandbox
		}
		hs, err := rt.List(ctx, map[string]string{sandbox.LabelManaged: "true"})
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s sandboxes: %w", name, err))
			continue
		}
		for _, h := range hs {
			if err := rt.Destroy(ctx, h.ID); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
