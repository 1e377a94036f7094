package app

import (
	"context"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes"
	"github.com/corral-dev/corral/internal/task"
)

// memTotal is this machine's memory in bytes, 0 if unknown.
func memTotal() uint64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	return uint64(si.Totalram) * uint64(si.Unit)
}

// memoryShort reports whether this machine is short of memory: less than
// a tenth of it available. Warm pools empty then, before tasks' memory is
// at stake.
func memoryShort() bool {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return false
	}
	var total, avail uint64
	for line := range strings.Lines(string(b)) {
		k, v, _ := strings.Cut(line, ":")
		n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "MemTotal":
			total = n
		case "MemAvailable":
			avail = n
		}
	}
	return total > 0 && avail < total/10
}

// warmPolicy is what runtime keeps warm under cfg (its section's
// warm_pool, warm_idle and budget): sandboxes of each of the task
// runner's shapes (tasks with the default resources) for that runtime.
func (a *App) warmPolicy(runtime string) (sandbox.WarmPolicy, error) {
	w := a.cfg.AIWorker
	k := a.cfg.Warm(runtime, memTotal())
	p := sandbox.WarmPolicy{Size: k.Size, Idle: k.Idle, MaxSandboxes: k.Max, MaxMemory: k.Memory, Pressure: memoryShort}
	var where placement.Runtime
	if runtime == rtkind.Kubernetes {
		// A cluster's pressure is its nodes', which the runtime asks
		// the API server for, not this machine's.
		p.Pressure = nil
		if pl, ok := a.placements.Get(runtime); ok {
			where = *pl
		}
	}
	if p.Size == 0 {
		return p, nil
	}
	var err error
	p.Shapes, err = a.runner.WarmShapes(task.Resources{
		MemoryBytes: w.Resources.MemoryLimit.Bytes(),
		CPUMillis:   w.Resources.CPULimit.Millis(),
		Pids:        int64(w.Resources.PidsLimit),
	}, where)
	return p, err
}

// keepWarm has every runtime that can keep sandboxes warm do so under
// run, until ctx ends. A pool that cannot start is logged, never fatal:
// tasks then start cold.
func (a *App) keepWarm(ctx context.Context, run func(func() error)) {
	for name, rt := range a.placements.Sandboxes() {
		w, ok := rt.(sandbox.Warmer)
		if !ok {
			continue
		}
		p, err := a.warmPolicy(name)
		if err != nil {
			a.log.Warn("no warm sandboxes", "runtime", name, "err", err)
			continue
		}
		if p.Size == 0 {
			continue
		}
		if caps, err := rt.Capabilities(ctx); err != nil || !caps.Available {
			continue
		}
		run(func() error {
			if err := w.KeepWarm(ctx, p); err != nil {
				a.log.Warn("no warm sandboxes", "runtime", name, "err", err)
			}
			return nil
		})
	}
}

// warmGate is the runtime whose warm pods poll the server, if any.
func (a *App) warmGate() httpapi.WarmGate {
	if k, ok := a.placements.Sandboxes()[kubernetes.Name].(*kubernetes.Runtime); ok {
		return k
	}
	return nil
}

// WarmStats are the runtimes' warm pools (/metrics), in a fixed order.
func (a *App) WarmStats() []httpapi.WarmPool {
	var out []httpapi.WarmPool
	sandboxes := a.placements.Sandboxes()
	for _, name := range slices.Sorted(maps.Keys(sandboxes)) {
		w, ok := sandboxes[name].(sandbox.Warmer)
		if !ok {
			continue
		}
		for _, s := range w.WarmStats() {
			out = append(out, httpapi.WarmPool{Runtime: s.Runtime, Shape: s.Shape, Ready: s.Ready, Target: s.Target,
				Claims: s.Claims, Misses: s.Misses, Started: s.Started, Failed: s.Failed, Destroyed: s.Destroyed})
		}
	}
	return out
}
