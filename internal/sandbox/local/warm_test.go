//go:build linux

package local

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/cgroups"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/sandbox/statedir"
	"github.com/corral-dev/corral/internal/sandbox/warmpool"
	"github.com/corral-dev/corral/internal/sandbox/warmstart"
	"github.com/corral-dev/corral/internal/testenv"
)

// warmRuntime keeps one sandbox warm whose main process writes the Start
// it is sent into its per-task mount /out, from a shape over tasksDir.
func warmRuntime(t *testing.T) (r *Runtime, tasksDir string, stop func()) {
	t.Helper()
	r, tasksDir, stop = warmRuntimeIdle(t, 0)
	waitReady(t, r, 1)
	return r, tasksDir, stop
}

// warmRuntimeIdle is warmRuntime with a pool that empties after idle, and
// returns without waiting for the pool to fill: the idle time runs from
// the pool's start, and on a busy host the sandbox can take longer than
// that to start, the pool then emptying before any look sees it full.
func warmRuntimeIdle(t *testing.T, idle time.Duration) (r *Runtime, tasksDir string, stop func()) {
	t.Helper()
	r, _ = MustNew(t)
	tasksDir, stop = keepWarm(t, r, "cat <&5 > /out/start.json", idle)
	return r, tasksDir, stop
}

// keepWarm keeps one sandbox warm in r, of a shape over a new tasks
// directory whose main process runs script, until stop (or the test's
// end); its pool empties after idle (0: never). It does not wait for the
// sandbox to be ready (waitReady).
func keepWarm(tb testing.TB, r *Runtime, script string, idle time.Duration) (tasksDir string, stop func()) {
	tb.Helper()
	tasksDir = testenv.TempDir(tb)
	return tasksDir, sandboxtest.KeepWarm(tb, r, sandbox.WarmPolicy{Size: 1, Idle: idle, Shapes: []sandbox.WarmShape{sandboxtest.WarmShapeOver(tasksDir, script)}})
}

func waitReady(t testing.TB, r *Runtime, n int) {
	t.Helper()
	waitStats(t, r, fmt.Sprintf("%d ready", n), func(st sandbox.WarmStats) bool { return st.Ready == n })
}

func waitStats(t testing.TB, r *Runtime, what string, ok func(sandbox.WarmStats) bool) {
	t.Helper()
	sandboxtest.WaitWarm(t, r, 20*time.Second, what, ok)
}

// TestWarmClaim: a spec that fits the shape is handed to the warm
// sandbox: the task's directory, with what the server put in it, is the
// sandbox's per-task mount, and its main process gets the task's argv,
// environment and working directory. A spec that does not fit starts
// cold and leaves the pool alone.
func TestWarmClaim(t *testing.T) {
	r, tasksDir, _ := warmRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id := sandboxtest.NewID(t)
	dir := filepath.Join(tasksDir, id)
	if err := os.MkdirAll(filepath.Join(dir, "input"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "prompt.md"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := sandbox.Spec{ID: id, Command: []string{"/bin/echo", "hi"}, Env: []string{"A=B"}, Dir: "/out",
		Mounts:  []sandbox.Mount{{Source: sandboxtest.MountSource(dir), Target: "/out"}},
		Network: sandbox.NetworkNone, Labels: map[string]string{"test": id}}
	if r.cg != nil {
		// Started ahead of need, it runs in the background.
		if got := r.cpuWeight(t, r.warmIDs(t)[0]); got != "2" && got != "1" {
			t.Errorf("the warm sandbox's CPU weight is %s, want the least (v1 2, v2 1)", got)
		}
	}
	h, err := r.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if r.cg != nil {
		if got := r.cpuWeight(t, id); got != "1024" && got != "100" {
			t.Errorf("the claimed sandbox's CPU weight is %s, want the default (v1 1024, v2 100)", got)
		}
	}
	if h.ID != id || h.Labels["test"] != id {
		t.Errorf("handle %+v: want the task's id and labels", h)
	}
	if es, err := r.Wait(ctx, id); err != nil || es.Code != 0 {
		t.Fatalf("wait: %+v %v", es, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "start.json"))
	if err != nil {
		t.Fatalf("the warm sandbox's main process wrote nothing into the task's directory: %v", err)
	}
	var got warmstart.Start
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Argv, spec.Command) || !slices.Contains(got.Env, "A=B") || got.Dir != "/out" {
		t.Errorf("start %+v: want the task's argv, environment and directory", got)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "prompt.md")); err != nil || string(b) != "hello" {
		t.Errorf("prompt.md after the claim: %q %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "input")); err != nil || !fi.IsDir() {
		t.Errorf("input/ after the claim: %v", err)
	}
	if hs, _ := r.List(ctx, map[string]string{"test": id}); len(hs) != 1 || hs[0].ID != id {
		t.Errorf("List by the task's label: %+v", hs)
	}
	if st := r.WarmStats()[0]; st.Claims != 1 || st.Misses != 0 {
		t.Errorf("stats %+v: want 1 claim", st)
	}
	if err := r.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(r.Dir.Path(id)); !os.IsNotExist(err) {
		t.Errorf("state dir after Destroy: %v", err)
	}

	// Not the shape (a memory limit): cold, and the pool keeps its one.
	waitReady(t, r, 1)
	cold := sandboxtest.NewID(t)
	cdir := filepath.Join(tasksDir, cold)
	if err := os.Mkdir(cdir, 0o755); err != nil {
		t.Fatal(err)
	}
	spec = sandbox.Spec{ID: cold, Command: []string{"/bin/sh", "-c", "echo cold > /out/cold.txt"}, Dir: "/out",
		Mounts:  []sandbox.Mount{{Source: sandboxtest.MountSource(cdir), Target: "/out"}},
		Network: sandbox.NetworkNone, Limits: sandbox.Limits{MemoryBytes: 64 << 20}}
	if _, err := r.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Destroy(context.Background(), cold) })
	if es, err := r.Wait(ctx, cold); err != nil || es.Code != 0 {
		t.Fatalf("wait: %+v %v", es, err)
	}
	if r.cg != nil {
		if got := r.cpuWeight(t, cold); got != "1024" && got != "100" {
			t.Errorf("the cold sandbox's CPU weight is %s, want the default (v1 1024, v2 100)", got)
		}
	}
	if _, err := os.Stat(filepath.Join(cdir, "cold.txt")); err != nil {
		t.Errorf("the cold sandbox ran nothing: %v", err)
	}
	if st := r.WarmStats()[0]; st.Claims != 1 || st.Misses != 0 || st.Ready != 1 {
		t.Errorf("stats %+v after a spec of another shape: want the pool untouched", st)
	}
}

// TestWarmEndsWithKeepWarm: when KeepWarm returns, its sandboxes and
// their slots are gone.
func TestWarmEndsWithKeepWarm(t *testing.T) {
	r, _, stop := warmRuntime(t)
	ids := r.warmIDs(t)
	if len(ids) != 1 {
		t.Fatalf("warm sandboxes %v, want 1", ids)
	}
	stop()
	if ids := r.warmIDs(t); len(ids) != 0 {
		t.Errorf("warm sandboxes %v after KeepWarm returned", ids)
	}
	ents, _ := os.ReadDir(warmpool.DirOf(r.opts.StateDir))
	if len(ents) != 1 || ents[0].Name() != r.Tag+".lock" {
		t.Errorf("warm slots left: %v, want only the runtime's lock", ents)
	}
}

// TestWarmOfAnotherServerStays: servers on one host share the state dir;
// a runtime starting beside one that keeps sandboxes warm leaves them
// alone, and destroys them once that one is gone.
func TestWarmOfAnotherServerStays(t *testing.T) {
	r, _, _ := warmRuntime(t)
	ids := r.warmIDs(t)
	if len(ids) != 1 || warmpool.TagOf(ids[0]) != r.Tag {
		t.Fatalf("warm sandboxes %v, want one with the runtime's tag %s", ids, r.Tag)
	}
	_, newRuntime := MustNew(t, func(o *Options) { o.StateDir = r.opts.StateDir })
	beside := newRuntime()
	if beside.Tag == r.Tag {
		t.Fatal("two runtimes with one tag")
	}
	if got := r.warmIDs(t); !slices.Equal(got, ids) {
		t.Errorf("warm sandboxes %v after another runtime started, want %v", got, ids)
	}
	r.Close() // as its server's death would, without stopping its pool
	newRuntime()
	if _, err := os.Stat(filepath.Join(r.opts.StateDir, ids[0])); !os.IsNotExist(err) {
		t.Errorf("the warm sandbox of a runtime gone is still there: %v", err)
	}
	if _, err := os.Stat(warmpool.LockPath(warmpool.DirOf(r.opts.StateDir), r.Tag)); !os.IsNotExist(err) {
		t.Errorf("the lock of a runtime gone is still there: %v", err)
	}
}

// cpuWeight reads sandbox id's CPU weight: cpu.shares on v1, cpu.weight
// on v2.
func (r *Runtime) cpuWeight(t *testing.T, id string) string {
	t.Helper()
	e, ok := r.Dir.Cached(id)
	if !ok {
		t.Fatalf("sandbox %s is not known", id)
	}
	for _, name := range []string{"cpu.shares", "cpu.weight"} {
		for _, d := range e.St.Cgroups {
			if b, err := os.ReadFile(filepath.Join(d, name)); err == nil {
				return strings.TrimSpace(string(b))
			}
		}
	}
	t.Fatalf("sandbox %s: no CPU weight in its cgroups %v", id, e.St.Cgroups)
	return ""
}

func (r *Runtime) warmIDs(t *testing.T) []string {
	hs, err := r.List(context.Background(), map[string]string{warmpool.LabelWarm: "true"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, h := range hs {
		ids = append(ids, h.ID)
	}
	return ids
}

// TestLeftoverClaimPutBack: a server that died while it moved a task's
// entries into a warm sandbox's slot left them there; the next runtime
// puts them back into the task's directory and removes the rest.
func TestLeftoverClaimPutBack(t *testing.T) {
	r, newRuntime := MustNew(t)
	task := testenv.TempDir(t)
	if err := os.WriteFile(filepath.Join(task, "prompt.md"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(warmpool.DirOf(r.opts.StateDir), "warm-left")
	slot := filepath.Join(root, "0")
	if err := os.MkdirAll(filepath.Join(slot, "input"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(slot, "input", "data.csv"), []byte("a,b"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, _ := json.Marshal(warmpool.Claim{Task: "task-x", Moves: map[int]string{0: task}})
	if err := os.WriteFile(filepath.Join(root, "claim"), c, 0o600); err != nil {
		t.Fatal(err)
	}
	newRuntime()
	if b, err := os.ReadFile(filepath.Join(task, "input", "data.csv")); err != nil || string(b) != "a,b" {
		t.Errorf("the moved entry is not back in the task's directory: %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(task, "prompt.md")); err != nil || string(b) != "kept" {
		t.Errorf("the entry not yet moved: %q %v", b, err)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("the warm sandbox's slots are still there: %v", err)
	}
}

// TestWarmPoolShrinksWhenIdle: a pool with no claim for its idle time
// destroys its sandboxes; the next task of its shape finds none, starts
// cold, and has the pool fill again. What it waits for are counts, not a
// pool seen full: with an idle time this short, a busy host can start a
// sandbox slower than the pool empties.
func TestWarmPoolShrinksWhenIdle(t *testing.T) {
	r, tasksDir, _ := warmRuntimeIdle(t, 300*time.Millisecond)
	waitStats(t, r, "the one sandbox started, then the pool emptied", func(st sandbox.WarmStats) bool {
		return st.Started == 1 && st.Destroyed == 1 && st.Ready == 0 && st.Target == 0
	})
	if ids := r.warmIDs(t); len(ids) != 0 {
		t.Errorf("warm sandboxes %v after the pool emptied", ids)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id := sandboxtest.NewID(t)
	dir := filepath.Join(tasksDir, id)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := sandbox.Spec{ID: id, Command: []string{"/bin/true"}, Dir: "/out",
		Mounts: []sandbox.Mount{{Source: sandboxtest.MountSource(dir), Target: "/out"}}, Network: sandbox.NetworkNone}
	if _, err := r.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Destroy(context.Background(), id) })
	waitStats(t, r, "a miss and a second sandbox started", func(st sandbox.WarmStats) bool {
		return st.Misses == 1 && st.Claims == 0 && st.Started == 2
	})
}

// TestWarmRefusesAnotherFileSystem: a claim renames a slot in the state
// dir over the task's directory, which cannot cross file systems; a shape
// whose task directories are on another one keeps nothing warm, and says
// why.
func TestWarmRefusesAnotherFileSystem(t *testing.T) {
	r, _ := MustNew(t)
	other, err := os.MkdirTemp("/dev/shm", "corral-warm-")
	if err != nil || warmpool.SameFS(other, r.opts.StateDir) {
		t.Skip("no second file system (/dev/shm) here")
	}
	t.Cleanup(func() { os.RemoveAll(other) })
	shape := sandbox.WarmShape{Name: "elsewhere", Template: sandbox.Spec{
		Command: []string{"/bin/true"},
		Mounts:  []sandbox.Mount{{Source: sandboxtest.MountSource(other) + "/" + sandbox.WarmTaskID, Target: "/out"}},
	}}
	err = r.KeepWarm(context.Background(), sandbox.WarmPolicy{Size: 1, Shapes: []sandbox.WarmShape{shape}})
	if err == nil || !strings.Contains(err.Error(), "not on one file system") {
		t.Fatalf("KeepWarm: %v, want a refusal naming the file systems", err)
	}
}

// BenchmarkWarmClaim: a claimed warm sandbox's run (Create, then Wait for
// its main process, which forks eight short processes) while its pool
// starts the next sandbox. One runtime starts that next one in the
// background (as New does), the other at the default CPU weight (as
// before); they take turns, claim by claim, so both share whatever else
// the host is doing. It reports each one's median and their ratio. Run
// as root with cgroups, or both are the same.
func BenchmarkWarmClaim(b *testing.B) {
	testenv.RequireRoot(b)
	type side struct {
		name  string
		r     *Runtime
		tasks string
		times []time.Duration
	}
	var sides []*side
	for _, fore := range []bool{false, true} {
		r, _ := MustNew(b, func(o *Options) { o.foreWarm = fore })
		if r.cg == nil {
			b.Skip("no cgroups: " + r.cgWarn)
		}
		tasks, _ := keepWarm(b, r, "cat <&5 >/dev/null; i=0; while [ $i -lt 8 ]; do /bin/true; i=$((i+1)); done", 0)
		waitReady(b, r, 1)
		sides = append(sides, &side{name: map[bool]string{false: "background", true: "fore"}[fore], r: r, tasks: tasks})
	}
	ctx := context.Background()
	for b.Loop() {
		for _, s := range sides {
			id := sandboxtest.NewID(b)
			dir := filepath.Join(s.tasks, id)
			if err := os.Mkdir(dir, 0o755); err != nil {
				b.Fatal(err)
			}
			spec := sandbox.Spec{ID: id, Command: []string{"/bin/true"}, Dir: "/out",
				Mounts:  []sandbox.Mount{{Source: sandboxtest.MountSource(dir), Target: "/out"}},
				Network: sandbox.NetworkNone}
			t0 := time.Now()
			if _, err := s.r.Create(ctx, spec); err != nil {
				b.Fatal(err)
			}
			if es, err := s.r.Wait(ctx, id); err != nil || es.Code != 0 {
				b.Fatalf("%s: wait: %+v %v", s.name, es, err)
			}
			s.times = append(s.times, time.Since(t0))
			b.StopTimer()
			if err := s.r.Destroy(ctx, id); err != nil {
				b.Fatal(err)
			}
			waitStats(b, s.r, "refilled", func(st sandbox.WarmStats) bool { return st.Ready == 1 })
			b.StartTimer()
		}
	}
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	bg, fg := median(sides[0].times), median(sides[1].times)
	b.ReportMetric(bg, "background-ms")
	b.ReportMetric(fg, "fore-ms")
	b.ReportMetric(bg/fg, "background/fore")
}

// TestWarmClaimOfAnEndedSandboxOnItsStripe: a warm sandbox that ended
// before its claim is destroyed and the task started cold. The task's
// Create holds its id's lock, and the destroy locks the warm sandbox's:
// the state dir's locks are striped, and the two ids here share a stripe,
// which the destroy waited for forever, the task's start with it.
func TestWarmClaimOfAnEndedSandboxOnItsStripe(t *testing.T) {
	r, tasksDir, _ := warmRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	warm := r.warmIDs(t)[0]
	e, err := r.Lookup(warm)
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range cgroups.Pids(e.St.Cgroups) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	if e.St.Cgroups == nil {
		syscall.Kill(e.St.PID, syscall.SIGKILL)
	}
	for e.Running() {
		if ctx.Err() != nil {
			t.Fatal("the killed warm sandbox is still running")
		}
		time.Sleep(10 * time.Millisecond)
	}
	id := sandboxtest.NewID(t)
	for statedir.Stripe(id) != statedir.Stripe(warm) {
		id = sandboxtest.NewID(t)
	}
	dir := filepath.Join(tasksDir, id)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := sandbox.Spec{ID: id, Command: []string{"/bin/sh", "-c", "echo cold > /out/cold.txt"}, Dir: "/out",
		Mounts:  []sandbox.Mount{{Source: sandboxtest.MountSource(dir), Target: "/out"}},
		Network: sandbox.NetworkNone}
	created := make(chan error, 1)
	go func() {
		_, err := r.Create(ctx, spec)
		created <- err
	}()
	select {
	case err := <-created:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the task's Create waited on its own lock's stripe")
	}
	t.Cleanup(func() { r.Destroy(context.Background(), id) })
	if es, err := r.Wait(ctx, id); err != nil || es.Code != 0 {
		t.Fatalf("wait: %+v %v", es, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "cold.txt")); err != nil || string(b) != "cold\n" {
		t.Errorf("the task started cold wrote %q, %v", b, err)
	}
	if _, err := os.Stat(r.Dir.Path(warm)); !os.IsNotExist(err) {
		t.Errorf("the ended warm sandbox's state dir: %v, want it destroyed", err)
	}
}
