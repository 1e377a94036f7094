package taskrun

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workerproto"
)

// fakeEgress records Open and Close and keeps a set of task directories.
type fakeEgress struct {
	root     string // the data root its directories are in
	mu       sync.Mutex
	dirs     map[string]string // task id → network it was opened for
	opened   []string
	closed   []string
	updated  []string
	policies map[string]EgressPolicy // by task, as last opened or updated
}

func newFakeEgress(ids ...string) *fakeEgress {
	f := &fakeEgress{dirs: map[string]string{}}
	for _, id := range ids {
		f.dirs[id] = "stale"
	}
	return f
}

func (f *fakeEgress) Open(id string, p EgressPolicy) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.dirs[id]; ok && f.dirs[id] != "stale" {
		return f.Dir(id), nil // keeps the policy of the one that runs
	}
	f.dirs[id] = p.Network
	f.opened = append(f.opened, id+":"+p.Network)
	if f.policies == nil {
		f.policies = map[string]EgressPolicy{}
	}
	f.policies[id] = p
	return f.Dir(id), nil
}

func (f *fakeEgress) Update(id string, p EgressPolicy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.dirs[id]; !ok {
		return errdefs.ErrNotFound
	}
	f.dirs[id] = p.Network
	f.policies[id] = p
	f.updated = append(f.updated, id+":"+p.Network)
	return nil
}

func (f *fakeEgress) Dir(id string) string { return filepath.Join(f.root, "run", "egress", id) }

func (f *fakeEgress) Close(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.dirs, id)
	f.closed = append(f.closed, id)
	return nil
}

// Forwards are two loopback addresses, as an allowlist naming a model
// server on the host's loopback gives them.
func (f *fakeEgress) Forwards() []string               { return []string{"127.0.0.1:8080", "[::1]:11434"} }
func (f *fakeEgress) SandboxEnv(EgressPolicy) []string { return nil }

func (f *fakeEgress) Tasks() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id := range f.dirs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

func (f *fakeEgress) state() (dirs []string, opened []string) {
	ids, _ := f.Tasks()
	f.mu.Lock()
	defer f.mu.Unlock()
	return ids, slices.Clone(f.opened)
}

// withEgress runs the runner's proxies through eg (none when nil).
func withEgress(eg Egress) func(*Options) {
	return func(o *Options) {
		if eg != nil {
			o.Egress = eg
		}
	}
}

// onRemoteRuntime places the kubernetes runtime, whose workers reach the
// server at a URL and, with egressAddr, the egress proxies over TCP.
func onRemoteRuntime(egressAddr string) func(*Options) {
	return func(o *Options) {
		k, _ := rtkind.Of("kubernetes")
		r := &placement.Runtime{Kind: k, ServerURL: "http://corral:7777", EgressAddr: egressAddr}
		if egressAddr == "" {
			r.NoEgress = "kubernetes.egress_listen is not set"
		}
		o.Worker.Placements = placement.NewSet(r)
	}
}

// remoteSpec is a task on the kubernetes runtime as a spawn makes it (the
// default image), with network.
func remoteSpec(network string) task.Spec {
	return task.Spec{Command: []string{"true"}, Runtime: "kubernetes", Image: "busybox", Network: network}
}

// A Prepare that fails after it opened the task's egress proxy (here: the
// task works through a session, and this runner serves none) closes it:
// no sandbox will use it.
func TestPrepareFailedClosesItsProxy(t *testing.T) {
	eg := newFakeEgress()
	f := MustNew(t, withEgress(eg))
	eg.root = f.data.Path()
	tk := f.MustCreate(t, task.Spec{Command: []string{"true"}, Network: task.NetworkAllowlist, ExecSession: "sess-x"})
	if _, err := f.r.Prepare(context.Background(), tk); err == nil {
		t.Fatal("Prepare of a task through a session, without sessions: no error")
	}
	if dirs, opened := eg.state(); len(opened) != 1 || len(dirs) != 0 {
		t.Errorf("after a failed Prepare: proxies %v open, %v opened; want the one opened, then closed", dirs, opened)
	}
}

func TestPrepareWithEgress(t *testing.T) {
	eg := newFakeEgress()
	f := MustNew(t, withEgress(eg))
	eg.root = f.data.Path()
	ctx := context.Background()
	for _, network := range []string{task.NetworkAllowlist, task.NetworkOpen} {
		tk := f.MustCreate(t, task.Spec{Command: []string{"true"}, Network: network})
		spec, err := f.r.Prepare(ctx, tk)
		if err != nil {
			t.Fatal(err)
		}
		if spec.Network != sandbox.NetworkEgress {
			t.Errorf("%s: sandbox network %q, want egress", network, spec.Network)
		}
		want := sandbox.Mount{Source: "run/egress/" + tk.ID, Target: workerproto.EgressDir, ReadOnly: true}
		if !slices.Contains(spec.Mounts, want) {
			t.Errorf("%s: mounts %v lack %v", network, spec.Mounts, want)
		}
		i := slices.Index(spec.Command, "--egress-socket")
		if i < 0 || spec.Command[i+1] != "/run/corral/egress/proxy.sock" || i > slices.Index(spec.Command, "--") {
			t.Errorf("%s: argv %q lacks --egress-socket before --", network, spec.Command)
		}
		// The worker reads the argv as it was meant.
		opts, err := workerproto.ParseArgs(spec.Command[3:])
		if err != nil {
			t.Fatalf("%s: the worker refuses its argv %q: %v", network, spec.Command, err)
		}
		if !slices.Equal(opts.EgressForward, eg.Forwards()) || opts.EgressSocket != "/run/corral/egress/proxy.sock" {
			t.Errorf("%s: worker options forward %v over %q", network, opts.EgressForward, opts.EgressSocket)
		}
	}
	_, opened := eg.state()
	if len(opened) != 2 || opened[0][len(opened[0])-len(":allowlist"):] != ":allowlist" || opened[1][len(opened[1])-len(":open"):] != ":open" {
		t.Errorf("opened %v", opened)
	}

	none := f.MustCreate(t, task.Spec{Command: []string{"true"}, Network: task.NetworkNone})
	spec, err := f.r.Prepare(ctx, none)
	if err != nil {
		t.Fatal(err)
	}
	if spec.Network != sandbox.NetworkNone || slices.Contains(spec.Command, "--egress-socket") {
		t.Errorf("network none: sandbox network %q, argv %q", spec.Network, spec.Command)
	}
	for _, m := range spec.Mounts {
		if m.Target == workerproto.EgressDir {
			t.Errorf("network none mounts the egress directory")
		}
	}
	if _, opened := eg.state(); len(opened) != 2 {
		t.Errorf("network none opened a proxy: %v", opened)
	}
}

func TestPrepareWithoutEgressRefusesNetwork(t *testing.T) {
	f := MustNew(t)
	tk := f.MustCreate(t, task.Spec{Command: []string{"true"}, Network: task.NetworkAllowlist})
	if _, err := f.r.Prepare(context.Background(), tk); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Prepare = %v, want ErrFailedPrecondition", err)
	}
}

// TestReconcileReopensAndRunEgressSweeps plays a restart: a running task with
// network gets its proxy back, a stale directory of an ended or unknown
// task is removed, and a task that ends later loses its proxy.
func TestAdoptReopensAndRunEgressSweeps(t *testing.T) {
	eg := newFakeEgress("unknown-task")
	f := MustNew(t, withEgress(eg))
	create := func(network string) task.Task {
		return f.MustCreate(t, task.Spec{Command: []string{"true"}, Network: network})
	}
	running, noNet, ended := create(task.NetworkAllowlist), create(task.NetworkNone), create(task.NetworkOpen)
	for _, tk := range []task.Task{running, noNet, ended} {
		f.MustStart(t, tk)
	}
	f.MustAppend(t, ended.ID, projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Success}, "test"))
	eg.mu.Lock()
	eg.dirs[ended.ID] = "stale"
	eg.mu.Unlock()

	// A restart: the scheduler adopts the tasks still running, and the
	// runner reopens the proxies of those with network; RunEgress sweeps
	// the rest.
	if err := f.r.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, tk := range []task.Task{running, noNet} {
		f.r.Adopt(context.Background(), tk)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.r.RunEgress(ctx) }()
	defer func() { cancel(); <-done }()

	waitDirs := func(want []string) {
		t.Helper()
		sort.Strings(want)
		deadline := time.Now().Add(10 * time.Second)
		for {
			dirs, _ := eg.state()
			if cmp.Equal(want, dirs) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("egress directories %v, want %v", dirs, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitDirs([]string{running.ID})
	if _, opened := eg.state(); !slices.Equal(opened, []string{running.ID + ":allowlist"}) {
		t.Errorf("reopened %v, want only the running task with network", opened)
	}

	// An egress event on the stream does not end the task, nor its proxy.
	evs, err := f.store.Append(ctx, task.StreamID(running.ID), eventstore.AnyVersion,
		projection.NewEvent(task.EventEgressConnection, task.EgressConnection{Host: "h", Port: 443, Allowed: true}, "test"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.tasks.CatchUp(ctx, evs[0].Position); err != nil {
		t.Fatal(err)
	}
	if tk, _ := f.tasks.Get(running.ID); tk.Status != task.Running {
		t.Errorf("after an egress event the task is %s, want running", tk.Status)
	}
	time.Sleep(2 * egressSweepPause) // a sweep after the event must keep the proxy
	if dirs, _ := eg.state(); !slices.Equal(dirs, []string{running.ID}) {
		t.Errorf("egress directories %v after an egress event", dirs)
	}
	f.MustAppend(t, running.ID, projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Success}, "test"))
	waitDirs(nil)
}

// Mounts are paths of the data root: worker binaries elsewhere cannot be
// mounted, and Prepare says so.
func TestPrepareRefusesPathsOutsideTheDataRoot(t *testing.T) {
	f := MustNew(t, func(o *Options) { o.Worker.BinDir = "/usr/local/bin" })
	tk := f.MustCreate(t, task.Spec{Command: []string{"true"}})
	if _, err := f.r.Prepare(context.Background(), tk); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "not within the data root") {
		t.Errorf("Prepare = %v, want the binary refused as outside the data root", err)
	}
}

// A task on a remote runtime reaches its proxy at the egress address,
// with nothing mounted; the forwards still apply.
func TestPrepareRemoteEgress(t *testing.T) {
	eg := newFakeEgress()
	f := MustNew(t, withEgress(eg), onRemoteRuntime("corral:7778"))
	eg.root = f.data.Path()
	tk := f.MustCreate(t, remoteSpec(task.NetworkAllowlist))
	spec, err := f.r.Prepare(context.Background(), tk)
	if err != nil {
		t.Fatal(err)
	}
	if spec.Network != sandbox.NetworkEgress {
		t.Errorf("sandbox network %q, want egress", spec.Network)
	}
	for _, m := range spec.Mounts {
		if m.Target == workerproto.EgressDir {
			t.Errorf("a remote sandbox mounts the egress directory: %v", m)
		}
	}
	opts, err := workerproto.ParseArgs(spec.Command[3:])
	if err != nil {
		t.Fatalf("the worker refuses its argv %q: %v", spec.Command, err)
	}
	if opts.EgressAddr != "corral:7778" || opts.EgressSocket != "" || !slices.Equal(opts.EgressForward, eg.Forwards()) {
		t.Errorf("worker egress: addr %q socket %q forwards %v", opts.EgressAddr, opts.EgressSocket, opts.EgressForward)
	}
	if _, opened := eg.state(); len(opened) != 1 || !strings.HasSuffix(opened[0], ":allowlist") {
		t.Errorf("opened %v", opened)
	}
}

// TestPrepareRemoteWithoutEgress: a task with network on a remote runtime
// without an egress address (recorded under another configuration) does
// not start, whether or not the server runs egress proxies, and no proxy
// is opened for it; with network none it starts.
func TestPrepareRemoteWithoutEgress(t *testing.T) {
	eg := newFakeEgress()
	for name, egress := range map[string]Egress{"no egress proxies": nil, "egress proxies": eg} {
		f := MustNew(t, withEgress(egress), onRemoteRuntime(""))
		eg.root = f.data.Path()
		tk := f.MustCreate(t, remoteSpec(task.NetworkAllowlist))
		_, err := f.r.Prepare(context.Background(), tk)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%s: Prepare of a task with network on kubernetes without egress: %v", name, err)
		}
		if egress != nil && (err == nil || !strings.Contains(err.Error(), "kubernetes.egress_listen is not set")) {
			t.Errorf("%s: Prepare = %v, want the runtime's reason", name, err)
		}
		if spec, err := f.r.Prepare(context.Background(), f.MustCreate(t, remoteSpec(task.NetworkNone))); err != nil || spec.Network != sandbox.NetworkNone {
			t.Errorf("%s: Prepare of a task with network none: network %q, %v", name, spec.Network, err)
		}
	}
	if _, opened := eg.state(); len(opened) != 0 {
		t.Errorf("opened %v for a remote runtime without egress", opened)
	}
}

// TestPrepareKeepsTheKeysOut: a claude task's sandbox gets the agent's
// SandboxEnv (a placeholder for the key, no base URL), never its Env; its
// worker is told to point ANTHROPIC_BASE_URL at its relay; its proxy is
// opened with the model API and the key. The key is nowhere in the spec.
// Without network the sandbox still gets the placeholder only.
func TestPrepareKeepsTheKeysOut(t *testing.T) {
	const key = "sk-ant-real-0123456789"
	eg := newFakeEgress()
	f := MustNew(t, withEgress(eg), func(o *Options) {
		o.Agents[task.AgentClaude] = workerproto.AgentConfig{
			Env:        []string{"ANTHROPIC_API_KEY=" + key, "ANTHROPIC_BASE_URL=http://127.0.0.2:8080", "OTHER=kept"},
			SandboxEnv: []string{"ANTHROPIC_API_KEY=placeholder", "OTHER=kept"},
			Models:     []workerproto.ModelAPI{{BaseURLVar: "ANTHROPIC_BASE_URL", Base: "http://127.0.0.2:8080", Header: "X-Api-Key", Value: key}},
		}
	})
	eg.root = f.data.Path()
	for _, network := range []string{task.NetworkAllowlist, task.NetworkNone} {
		tk := f.MustCreate(t, task.Spec{Description: "keys", Network: network})
		spec, err := f.r.Prepare(context.Background(), tk)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(fmt.Sprint(spec), key) {
			t.Errorf("%s: the key is in the sandbox's spec: %+v", network, spec)
		}
		if !slices.Contains(spec.Env, "ANTHROPIC_API_KEY=placeholder") || !slices.Contains(spec.Env, "OTHER=kept") ||
			slices.ContainsFunc(spec.Env, func(kv string) bool { return strings.HasPrefix(kv, "ANTHROPIC_BASE_URL=") }) {
			t.Errorf("%s: sandbox env %q", network, spec.Env)
		}
		opts, err := workerproto.ParseArgs(spec.Command[3:])
		if err != nil {
			t.Fatal(err)
		}
		want := []workerproto.ModelAPI{{BaseURLVar: "ANTHROPIC_BASE_URL", Base: "http://127.0.0.2:8080", Header: "X-Api-Key", Value: key}}
		switch network {
		case task.NetworkNone:
			if len(opts.EgressModels) != 0 {
				t.Errorf("network none: worker told to relay %v", opts.EgressModels)
			}
		default:
			if !slices.Equal(opts.EgressModels, []string{"ANTHROPIC_BASE_URL"}) {
				t.Errorf("worker relays %v, want ANTHROPIC_BASE_URL", opts.EgressModels)
			}
			eg.mu.Lock()
			got := eg.policies[tk.ID].Models
			eg.mu.Unlock()
			if !slices.Equal(got, want) {
				t.Errorf("proxy opened with models %+v, want %+v", got, want)
			}
		}
	}
}

// TestEgressFollowsANetworkChange: a task's network policy changed in the
// log (by this server or another) reaches its proxy here, once.
func TestEgressFollowsANetworkChange(t *testing.T) {
	eg := newFakeEgress()
	f := MustNew(t, withEgress(eg))
	eg.root = f.data.Path()
	tk := f.MustCreate(t, task.Spec{Command: []string{"true"}, Network: task.NetworkAllowlist})
	if _, err := f.r.Prepare(context.Background(), tk); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.r.RunEgress(ctx) }()
	defer func() { cancel(); <-done }()
	f.MustAppend(t, tk.ID, projection.NewEvent(task.EventNetworkChanged, task.NetworkChanged{Network: task.NetworkOpen, Allow: []string{"example.com"}}, "test"))
	var p EgressPolicy
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		eg.mu.Lock()
		p, updated := eg.policies[tk.ID], len(eg.updated)
		eg.mu.Unlock()
		if updated > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy never followed the change: %+v", p)
		}
	}
	eg.mu.Lock()
	p = eg.policies[tk.ID]
	eg.mu.Unlock()
	if p.Network != task.NetworkOpen || !slices.Equal(p.Allow, []string{"example.com"}) {
		t.Errorf("the proxy's policy %+v, want open with example.com", p)
	}
	got, _ := f.tasks.Get(tk.ID)
	f.r.ApplyEgress(got)
	eg.mu.Lock()
	defer eg.mu.Unlock()
	if len(eg.updated) != 1 {
		t.Errorf("updates %v: want one, a policy applied is not applied again", eg.updated)
	}
}
