//go:build linux

package gvisor

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/sandbox/warmpool"
	"github.com/corral-dev/corral/internal/sandbox/warmstart"
	"github.com/corral-dev/corral/internal/testenv"
)

// warmScript is the warm sandboxes' main process in these tests, doing
// what the worker does (workercmd.RunWarm): nothing if its pipe closes
// empty; else it acknowledges the start on warmstart.AckFD, closes it,
// and writes the start and what it sees of the task's directory there.
// (Not with ls: this gVisor fails coreutils' statx with EINVAL.)
const warmScript = `s=$(cat <&5); [ -n "$s" ] || exit 0; echo started >&6; exec 6>&-; printf %s "$s" > /out/start.json; (cd /out && echo * > /out/seen.txt); (cd /proc/self/fd && echo * > /out/fds.txt); exit 3`

// keepWarm keeps size sandboxes warm in r, of a shape over a new tasks
// directory whose main process runs script, until stop (or the test's
// end). It does not wait for them to be ready (waitReady).
func keepWarm(tb testing.TB, r *Runtime, script string, size int) (tasksDir string, stop func()) {
	tb.Helper()
	tasksDir = testenv.TempDir(tb)
	return tasksDir, sandboxtest.KeepWarm(tb, r, sandbox.WarmPolicy{Size: size, Shapes: []sandbox.WarmShape{sandboxtest.WarmShapeOver(tasksDir, script)}})
}

func waitStats(t testing.TB, r *Runtime, what string, ok func(sandbox.WarmStats) bool) {
	t.Helper()
	sandboxtest.WaitWarm(t, r, 60*time.Second, what, ok)
}

func waitReady(t testing.TB, r *Runtime, n int) {
	t.Helper()
	waitStats(t, r, fmt.Sprintf("%d ready", n), func(st sandbox.WarmStats) bool { return st.Ready == n })
}

func (r *Runtime) warmIDs(t *testing.T) []string {
	t.Helper()
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

// taskSpec makes task id's directory in tasksDir, with a prompt in it,
// and returns a spec of the warm shape over it.
func taskSpec(t *testing.T, tasksDir, id string) sandbox.Spec {
	t.Helper()
	dir := filepath.Join(tasksDir, id)
	if err := os.MkdirAll(filepath.Join(dir, "input"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "prompt.md"), []byte("hello "+id), 0o644); err != nil {
		t.Fatal(err)
	}
	return sandbox.Spec{ID: id, Command: []string{"/bin/echo", id}, Env: []string{"A=" + id}, Dir: "/out",
		Mounts:  []sandbox.Mount{{Source: sandboxtest.MountSource(dir), Target: "/out"}},
		Network: sandbox.NetworkNone, Labels: map[string]string{"test": id}}
}

// TestWarmClaim: a spec that fits the shape is handed to a warm gVisor
// sandbox: the task's directory, with what the server put in it, is the
// sandbox's per-task mount (the sentry sees entries moved in after it
// started), its main process gets the task's argv, environment and
// working directory on warmstart.FD, and acknowledges it on
// warmstart.AckFD, the one descriptor of the sandbox on the
// acknowledgement file, closed before the task runs. The sandbox is then
// the task's, by its id and labels, and its end is the task's.
func TestWarmClaim(t *testing.T) {
	r, _ := MustNew(t)
	tasksDir, _ := keepWarm(t, r, warmScript, 1)
	waitReady(t, r, 1)
	warm := r.warmIDs(t)
	if len(warm) != 1 {
		t.Fatalf("warm sandboxes %v, want 1", warm)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id := sandboxtest.NewID(t)
	spec := taskSpec(t, tasksDir, id)
	h, err := r.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Destroy(context.Background(), id) })
	if h.ID != id || h.Labels["test"] != id {
		t.Errorf("handle %+v: want the task's id and labels", h)
	}
	es, err := r.Wait(ctx, id)
	if err != nil || es.Code != 3 || es.NotStarted {
		t.Fatalf("wait: %+v %v; want the main process's exit 3", es, err)
	}
	dir := filepath.Join(tasksDir, id)
	b, err := os.ReadFile(filepath.Join(dir, "start.json"))
	if err != nil {
		t.Fatalf("the warm sandbox's main process wrote nothing into the task's directory: %v", err)
	}
	var got warmstart.Start
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Argv, spec.Command) || !slices.Contains(got.Env, "A="+id) || got.Dir != "/out" {
		t.Errorf("start %+v: want the task's argv, environment and directory", got)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "seen.txt")); err != nil || !strings.Contains(string(b), "prompt.md") || !strings.Contains(string(b), "input") {
		t.Errorf("the sandbox saw %q in its task's directory (%v), want prompt.md and input", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "fds.txt")); err != nil || !slices.Contains(strings.Fields(string(b)), "5") || slices.Contains(strings.Fields(string(b)), "6") {
		t.Errorf("descriptors after the acknowledgement: %q (%v), want 5 open and 6 closed", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(r.Dir.Path(id), warmpool.AckFile)); err != nil || string(b) != "started\n" {
		t.Errorf("acknowledgement %q (%v), want started", b, err)
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
	if out, err := r.runsc(ctx, "list"); err != nil || strings.Contains(string(out), warm[0]) {
		t.Errorf("runsc still knows the claimed sandbox %s after Destroy: %s %v", warm[0], out, err)
	}
}

// TestWarmServesOneTask: a warm sandbox serves one task only. Tasks
// claimed one after another from a pool of two each get a sandbox no
// other task had (its warm id, its processes: the main process ran one
// start and ended), the pool refills with new ones, and one claimed is
// never in the pool again; a task's sandbox holds nothing of another's.
func TestWarmServesOneTask(t *testing.T) {
	r, _ := MustNew(t)
	// Each sandbox's /tmp is its own: a sandbox that served an earlier
	// task would show that task's mark.
	script := `s=$(cat <&5); [ -n "$s" ] || exit 0; echo started >&6; exec 6>&-; for f in /tmp/* /tmp/.??*; do [ -e "$f" ] && echo "$f"; done > /out/seen.txt; touch /tmp/mark; printf %s "$s" > /out/start.json`
	tasksDir, _ := keepWarm(t, r, script, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	claimed := map[string]string{} // warm id -> task
	for i := range 4 {
		waitReady(t, r, 2)
		before := r.warmIDs(t)
		for _, w := range before {
			if task, ok := claimed[w]; ok {
				t.Fatalf("warm sandbox %s, which served task %s, is in the pool again", w, task)
			}
		}
		id := sandboxtest.NewID(t) + fmt.Sprint(i)
		if _, err := r.Create(ctx, taskSpec(t, tasksDir, id)); err != nil {
			t.Fatal(err)
		}
		if es, err := r.Wait(ctx, id); err != nil || es.Code != 0 {
			t.Fatalf("task %d: %+v %v", i, es, err)
		}
		e, ok := r.Dir.Cached(id)
		if !ok || e.St.Warm == "" || !slices.Contains(before, e.St.Warm) {
			t.Fatalf("task %d did not claim one of the warm sandboxes %v: %+v", i, before, e)
		}
		if task, ok := claimed[e.St.Warm]; ok {
			t.Fatalf("warm sandbox %s served task %s and then %s", e.St.Warm, task, id)
		}
		claimed[e.St.Warm] = id
		if b, err := os.ReadFile(filepath.Join(tasksDir, id, "seen.txt")); err != nil || strings.TrimSpace(string(b)) != "" {
			t.Errorf("task %d found %q in its sandbox's /tmp (%v), want nothing", i, b, err)
		}
		if b, err := os.ReadFile(filepath.Join(tasksDir, id, "start.json")); err != nil || !strings.Contains(string(b), `"A=`+id+`"`) {
			t.Errorf("task %d's start %q (%v), want its own", i, b, err)
		}
		if err := r.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	waitStats(t, r, "4 claims, each refilled by a new sandbox", func(st sandbox.WarmStats) bool {
		return st.Claims == 4 && st.Started == 6 && st.Ready == 2
	})
	for _, w := range r.warmIDs(t) {
		if task, ok := claimed[w]; ok {
			t.Errorf("warm sandbox %s, which served task %s, is in the pool again", w, task)
		}
	}
}

// TestWarmRebuiltAfterRestart: warm sandboxes are never reattached. A
// runtime gone (its server killed) leaves them; the next runtime over the
// state dir destroys them, the runsc containers with them, and puts back
// a half-claimed task's entries; it starts its own. A claimed sandbox
// whose worker never had its start (the server died between the claim and
// the start) ends as not started, never as its task's result.
func TestWarmRebuiltAfterRestart(t *testing.T) {
	r, newRuntime := MustNew(t)
	tasksDir, stop := keepWarm(t, r, warmScript, 2)
	waitReady(t, r, 2)
	old := r.warmIDs(t)
	// Half a claim: the task's entries moved into the first sandbox's
	// slot, its claim recorded, and the server dead.
	id := sandboxtest.NewID(t)
	spec := taskSpec(t, tasksDir, id).Resolve(r.opts.DataRoot)
	root := filepath.Join(warmpool.DirOf(r.opts.StateDir), old[0])
	c, _ := json.Marshal(warmpool.Claim{Task: id, Moves: map[int]string{0: spec.Mounts[0].Source}})
	if err := os.WriteFile(filepath.Join(root, warmpool.ClaimFile), c, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(tasksDir, id, "prompt.md"), filepath.Join(root, "0", "prompt.md")); err != nil {
		t.Fatal(err)
	}
	// The server's death: its lock goes, its pipes close (the pool is
	// stopped only after the next runtime has destroyed the sandboxes,
	// so that it is the next runtime that destroys them).
	r.Close()
	next := newRuntime()
	for _, w := range old {
		if _, err := os.Stat(r.Dir.Path(w)); !os.IsNotExist(err) {
			t.Errorf("the warm sandbox %s of the runtime gone is still there: %v", w, err)
		}
	}
	out, err := next.runsc(context.Background(), "list")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range old {
		if strings.Contains(string(out), w) {
			t.Errorf("runsc still runs the warm sandbox %s of the runtime gone: %s", w, out)
		}
	}
	if b, err := os.ReadFile(filepath.Join(tasksDir, id, "prompt.md")); err != nil || string(b) != "hello "+id {
		t.Errorf("the half-claimed task's entry is not back: %q %v", b, err)
	}
	stop()
	if hs := next.warmIDs(t); len(hs) != 0 {
		t.Errorf("warm sandboxes %v reattached by the next runtime", hs)
	}
	// The next runtime keeps its own.
	keepWarm(t, next, warmScript, 1)
	waitReady(t, next, 1)
	if ids := next.warmIDs(t); len(ids) != 1 || warmpool.TagOf(ids[0]) != next.Tag {
		t.Errorf("warm sandboxes %v of the next runtime, want one of its tag %s", ids, next.Tag)
	}
}

// TestWarmClaimedNotStarted: a server that died between a claim and the
// start leaves a sandbox with the task's id whose worker had nothing; it
// ends, and says it ran nothing of its task, after a restart.
func TestWarmClaimedNotStarted(t *testing.T) {
	crash := true
	r, newRuntime := MustNew(t, func(o *Options) {
		o.Crash = func(point string) {
			if crash && point == sandbox.CrashHandedOver {
				panic(point)
			}
		}
	})
	tasksDir, _ := keepWarm(t, r, warmScript, 1)
	waitReady(t, r, 1)
	id := sandboxtest.NewID(t)
	spec := taskSpec(t, tasksDir, id)
	var b *warmpool.Box
	func() {
		defer func() {
			if p := recover(); p != sandbox.CrashHandedOver {
				t.Fatalf("Create did not stop at the hand-over: %v", p)
			}
		}()
		b = r.Take(spec)
		if b == nil {
			t.Fatal("no warm sandbox to claim")
		}
		r.Adopt(context.Background(), spec.Resolve(r.opts.DataRoot), b)
	}()
	b.Drop() // the server's death closes the pipe
	r.Close()
	crash = false
	next := newRuntime()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	es, err := next.Wait(ctx, id)
	if err != nil || !es.NotStarted {
		t.Errorf("the claimed sandbox without a start ended %+v (%v), want not started", es, err)
	}
	next.Destroy(context.Background(), id)
}
