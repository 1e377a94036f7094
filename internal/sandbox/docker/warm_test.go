//go:build linux

package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/sandbox/warmpool"
	"github.com/corral-dev/corral/internal/sandbox/warmstart"
	"github.com/corral-dev/corral/internal/testenv"
)

// warmScript is the warm containers' main process in these tests, doing
// what the worker does (workercmd.RunWarm) with the descriptors warmShim
// gives it: nothing if its start closes empty; else it acknowledges the
// start on warmstart.AckFD, closes it, and writes the start and what it
// sees of the task's directory and of its descriptors there. (Not with
// ls: gVisor fails coreutils' statx with EINVAL.)
const warmScript = `s=$(cat <&5); [ -n "$s" ] || exit 0; echo started >&6; exec 6>&-; printf %s "$s" > /out/start.json; (cd /out && echo * > /out/seen.txt); (cd /proc/self/fd && echo * > /out/fds.txt); exit 3`

// warmRuntime is a runtime of the test engine for warm containers, with
// its own instance and, on the file system of the tests' task
// directories, its own state dir; new makes the runtime a restarted
// server would have over them.
func warmRuntime(tb testing.TB, runtime string, opt ...func(*Options)) (r *Runtime, new func() *Runtime) {
	tb.Helper()
	require(tb, runtime)
	inst, stateDir := sandboxtest.NewID(tb), testenv.TempDir(tb)
	new = func() *Runtime {
		o := Options{
			DataRoot:     sandboxtest.DataRoot,
			Host:         "unix://" + testenv.DockerSocket,
			Runtime:      runtime,
			DefaultImage: testenv.DockerImage,
			Instance:     inst,
			StateDir:     stateDir,
			// One range of identities for every test's containers.
			Identities: hostuser.NewIdentities(hostuser.Default(), "/run/docker/identities"),
		}
		for _, f := range opt {
			f(&o)
		}
		r, err := New(o, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { r.Close() })
		return r
	}
	return new(), new
}

// keepWarm keeps size containers warm in r, of a shape over a new tasks
// directory whose main process runs script, until stop (or the test's end).
func keepWarm(tb testing.TB, r *Runtime, script string, size int) (tasksDir string, stop func()) {
	tb.Helper()
	tasksDir = testenv.TempDir(tb)
	shape := sandboxtest.WarmShapeOver(tasksDir, script)
	shape.Template.Limits = sandbox.Limits{MemoryBytes: 256 << 20, Pids: 64}
	return tasksDir, sandboxtest.KeepWarm(tb, r, sandbox.WarmPolicy{Size: size, Shapes: []sandbox.WarmShape{shape}})
}

func waitStats(t testing.TB, r *Runtime, what string, ok func(sandbox.WarmStats) bool) {
	t.Helper()
	sandboxtest.WaitWarm(t, r, 90*time.Second, what, ok)
}

func waitReady(t testing.TB, r *Runtime, n int) {
	t.Helper()
	waitStats(t, r, fmt.Sprintf("%d ready", n), func(st sandbox.WarmStats) bool { return st.Ready == n })
}

// warmIDs are the ids of r's unclaimed warm containers.
func (r *Runtime) warmIDs(t *testing.T) []string {
	t.Helper()
	hs, err := r.List(context.Background(), map[string]string{labelWarm: "true"})
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
		Network: sandbox.NetworkNone, Limits: sandbox.Limits{MemoryBytes: 256 << 20, Pids: 64},
		Labels: map[string]string{sandbox.LabelManaged: "true", "test": id}}
}

// hardening is what of a container's configuration makes it a sandbox.
func (r *Runtime) hardening(t *testing.T, id string) string {
	t.Helper()
	c, err := r.inspect(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	h := c.HostConfig
	b, _ := json.Marshal([]any{c.Config.Image, h.NetworkMode, h.ReadonlyRootfs, h.Tmpfs, h.CapDrop, h.CapAdd, h.SecurityOpt,
		h.MaskedPaths, h.ReadonlyPaths, h.Init, h.Runtime, h.Memory, h.MemorySwap, h.NanoCPUs, h.PidsLimit, h.Ulimits, h.Privileged})
	return string(b)
}

// TestWarmClaim: a spec that fits the shape is handed to a warm
// container, made as a cold one is (the same hardening, under each engine
// runtime): the task's directory, with what the server put in it, is its
// per-task mount (entries moved in after it started), its worker gets the
// task's argv, environment and working directory on warmstart.FD (its
// stdin) and acknowledges it on warmstart.AckFD, closed before the task
// runs. The container is then the task's, by its id and labels (also to a
// restarted server), its end is the task's, and Destroy removes it and
// gives the task's directory back.
func TestWarmClaim(t *testing.T) {
	for _, rt := range oci {
		t.Run(name(rt), func(t *testing.T) {
			t.Parallel()
			r, newRuntime := warmRuntime(t, rt)
			tasksDir, _ := keepWarm(t, r, warmScript, 1)
			waitReady(t, r, 1)
			warm := r.warmIDs(t)
			if len(warm) != 1 {
				t.Fatalf("warm containers %v, want 1", warm)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			// A cold sandbox of the same shape but for a read-only
			// mount, which no warm container fits.
			coldID := sandboxtest.NewID(t)
			cold := taskSpec(t, tasksDir, coldID)
			cold.Command, cold.Mounts[0].ReadOnly = []string{"sleep", "60"}, true
			if _, err := r.Create(ctx, cold); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Destroy(context.Background(), coldID) })
			if w, c := r.hardening(t, warm[0]), r.hardening(t, coldID); w != c {
				t.Errorf("a warm container is made as\n%s\nand a cold one as\n%s", w, c)
			}

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
			c, err := r.inspect(ctx, id)
			if err != nil || c.Config.Labels[sandbox.LabelSandbox] != warm[0] {
				t.Fatalf("the task's container: %v (labels %v), want the warm container %s", err, c.Config, warm[0])
			}
			es, err := r.Wait(ctx, id)
			if err != nil || es.Code != 3 || es.NotStarted {
				t.Fatalf("wait: %+v %v; want the main process's exit 3", es, err)
			}
			dir := filepath.Join(tasksDir, id)
			b, err := os.ReadFile(filepath.Join(dir, "start.json"))
			if err != nil {
				t.Fatalf("the warm container's main process wrote nothing into the task's directory: %v", err)
			}
			var got warmstart.Start
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Argv, spec.Command) || !slices.Contains(got.Env, "A="+id) || got.Dir != "/out" {
				t.Errorf("start %+v: want the task's argv, environment and directory", got)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "seen.txt")); err != nil || !strings.Contains(string(b), "prompt.md") || !strings.Contains(string(b), "input") {
				t.Errorf("the container saw %q in its task's directory (%v), want prompt.md and input", b, err)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "fds.txt")); err != nil || !slices.Contains(strings.Fields(string(b)), "5") || slices.Contains(strings.Fields(string(b)), "6") {
				t.Errorf("descriptors after the acknowledgement: %q (%v), want 5 open and 6 closed", b, err)
			}
			if rec, err := r.readClaim(id); err != nil || !rec.Acked || rec.Warm != warm[0] {
				t.Errorf("claim record %+v (%v), want the acknowledged claim of %s", rec, err, warm[0])
			}
			if st := r.WarmStats()[0]; st.Claims != 1 || st.Misses != 0 {
				t.Errorf("stats %+v: want 1 claim", st)
			}
			// A restarted server finds it as the task's, ended by its
			// task.
			next := newRuntime()
			if hs, err := next.List(ctx, map[string]string{"test": id}); err != nil || len(hs) != 1 || hs[0].ID != id || hs[0].Labels[sandbox.LabelManaged] != "true" {
				t.Errorf("List of the next server: %+v %v; want the task's sandbox with its labels", hs, err)
			}
			if st, err := next.Status(ctx, id); err != nil || st.Exit == nil || st.Exit.Code != 3 || st.Exit.NotStarted {
				t.Errorf("Status of the next server: %+v %v; want exited 3", st, err)
			}

			if err := r.Destroy(ctx, id); err != nil {
				t.Fatal(err)
			}
			for _, n := range []string{id, warm[0]} {
				if _, err := r.inspect(ctx, n); !errors.Is(err, errdefs.ErrNotFound) {
					t.Errorf("container %s after Destroy: %v", n, err)
				}
			}
			if _, err := os.Stat(r.claimPath(id)); !os.IsNotExist(err) {
				t.Errorf("claim record after Destroy: %v", err)
			}
			var st syscall.Stat_t
			if err := syscall.Stat(filepath.Join(dir, "start.json"), &st); err != nil || int(st.Uid) != os.Geteuid() {
				t.Errorf("the task's file after Destroy: owner %d (%v), want the server's", st.Uid, err)
			}
		})
	}
}

// TestWarmServesOneTask: a warm container serves one task only. Tasks
// claimed one after another from a pool of two each get a container no
// other task had, the pool refills with new ones, and one claimed is
// never in the pool again; a task's container holds nothing of another's.
func TestWarmServesOneTask(t *testing.T) {
	r, _ := warmRuntime(t, "")
	// Each container's /tmp is its own: one that served an earlier task
	// would show that task's mark.
	script := `s=$(cat <&5); [ -n "$s" ] || exit 0; echo started >&6; exec 6>&-; ls -A /tmp > /out/seen.txt; touch /tmp/mark; printf %s "$s" > /out/start.json`
	tasksDir, _ := keepWarm(t, r, script, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	claimed := map[string]string{} // warm id -> task
	for i := range 3 {
		waitReady(t, r, 2)
		before := r.warmIDs(t)
		for _, w := range before {
			if task, ok := claimed[w]; ok {
				t.Fatalf("warm container %s, which served task %s, is in the pool again", w, task)
			}
		}
		id := sandboxtest.NewID(t)
		if _, err := r.Create(ctx, taskSpec(t, tasksDir, id)); err != nil {
			t.Fatal(err)
		}
		if es, err := r.Wait(ctx, id); err != nil || es.Code != 0 {
			t.Fatalf("task %d: %+v %v", i, es, err)
		}
		rec, err := r.readClaim(id)
		if err != nil || !slices.Contains(before, rec.Warm) {
			t.Fatalf("task %d did not claim one of the warm containers %v: %+v %v", i, before, rec, err)
		}
		if task, ok := claimed[rec.Warm]; ok {
			t.Fatalf("warm container %s served task %s and then %s", rec.Warm, task, id)
		}
		claimed[rec.Warm] = id
		if b, err := os.ReadFile(filepath.Join(tasksDir, id, "seen.txt")); err != nil || strings.TrimSpace(string(b)) != "" {
			t.Errorf("task %d found %q in its container's /tmp (%v), want nothing", i, b, err)
		}
		if b, err := os.ReadFile(filepath.Join(tasksDir, id, "start.json")); err != nil || !strings.Contains(string(b), `"A=`+id+`"`) {
			t.Errorf("task %d's start %q (%v), want its own", i, b, err)
		}
		if err := r.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	waitStats(t, r, "3 claims, each refilled by a new container", func(st sandbox.WarmStats) bool {
		return st.Claims == 3 && st.Started == 5 && st.Ready == 2
	})
	for _, w := range r.warmIDs(t) {
		if task, ok := claimed[w]; ok {
			t.Errorf("warm container %s, which served task %s, is in the pool again", w, task)
		}
	}
}

// TestWarmRebuiltAfterRestart: warm containers are never reattached. A
// runtime gone (its server killed) leaves them; the next runtime destroys
// them at its first contact with the engine and puts back a half-claimed
// task's entries; it starts its own.
func TestWarmRebuiltAfterRestart(t *testing.T) {
	r, newRuntime := warmRuntime(t, "")
	tasksDir, stop := keepWarm(t, r, warmScript, 2)
	waitReady(t, r, 2)
	old := r.warmIDs(t)
	// Half a claim: the task's entries moved into the first container's
	// slot, its claim recorded, and the server dead.
	id := sandboxtest.NewID(t)
	spec := taskSpec(t, tasksDir, id).Resolve(r.opts.DataRoot)
	root := filepath.Join(r.warmDir(), old[0])
	c, _ := json.Marshal(warmpool.Claim{Task: id, Moves: map[int]string{0: spec.Mounts[0].Source}})
	if err := os.WriteFile(filepath.Join(root, warmpool.ClaimFile), c, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(tasksDir, id, "prompt.md"), filepath.Join(root, "0", "prompt.md")); err != nil {
		t.Fatal(err)
	}
	// The server's death: its lock goes (the pool is stopped only after
	// the next runtime has destroyed the containers, so that it is the
	// next runtime that destroys them).
	r.Close()
	next := newRuntime()
	ctx := context.Background()
	if caps, _ := next.Capabilities(ctx); !caps.Available {
		t.Fatal(caps.Reason)
	}
	for _, w := range old {
		if _, err := next.inspect(ctx, w); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("the warm container %s of the runtime gone is still there: %v", w, err)
		}
		if _, err := os.Stat(filepath.Join(r.warmDir(), w)); !os.IsNotExist(err) {
			t.Errorf("the slots of %s are still there: %v", w, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(tasksDir, id, "prompt.md")); err != nil || string(b) != "hello "+id {
		t.Errorf("the half-claimed task's entry is not back: %q %v", b, err)
	}
	stop()
	if hs := next.warmIDs(t); len(hs) != 0 {
		t.Errorf("warm containers %v reattached by the next runtime", hs)
	}
	// The next runtime keeps its own.
	keepWarm(t, next, warmScript, 1)
	waitReady(t, next, 1)
	if ids := next.warmIDs(t); len(ids) != 1 || warmpool.TagOf(ids[0]) != next.warmTag {
		t.Errorf("warm containers %v of the next runtime, want one of its tag %s", ids, next.warmTag)
	}
}

// TestWarmClaimedNotStarted: a server that died between a claim's
// hand-over and its start leaves a container with the task's name whose
// worker had nothing: its stdin closes with the server's attachment, it
// ends, and says it ran nothing of its task to the next server. One that
// died after the start, before it read the acknowledgement, leaves one
// whose end is its task's: the container's log holds the acknowledgement.
func TestWarmClaimedNotStarted(t *testing.T) {
	for _, tt := range []struct {
		point      string
		notStarted bool
	}{{sandbox.CrashHandedOver, true}, {sandbox.CrashSent, false}} {
		t.Run(tt.point, func(t *testing.T) {
			t.Parallel()
			crash := true
			r, newRuntime := warmRuntime(t, "", func(o *Options) {
				o.Crash = func(point string) {
					if crash && point == tt.point {
						panic(point)
					}
				}
			})
			tasksDir, _ := keepWarm(t, r, warmScript, 1)
			waitReady(t, r, 1)
			id := sandboxtest.NewID(t)
			spec := taskSpec(t, tasksDir, id)
			var b *warmBox
			func() {
				defer func() {
					if p := recover(); p != tt.point {
						t.Fatalf("Create did not stop at %s: %v", tt.point, p)
					}
				}()
				b = r.claimWarm(spec)
				if b == nil {
					t.Fatal("no warm container to claim")
				}
				r.adopt(context.Background(), spec, b)
			}()
			b.att.Close() // the server's death ends its attachment
			r.Close()
			crash = false
			next := newRuntime()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			t.Cleanup(func() { next.Destroy(context.Background(), id) })
			if hs, err := next.List(ctx, map[string]string{"test": id}); err != nil || len(hs) != 1 {
				t.Errorf("List of the next server: %+v %v; want the task's sandbox", hs, err)
			}
			es, err := next.Wait(ctx, id)
			switch {
			case err != nil:
				t.Fatal(err)
			case tt.notStarted && !es.NotStarted:
				t.Errorf("the claimed container without a start ended %+v, want not started", es)
			case !tt.notStarted && (es.NotStarted || es.Code != 3):
				t.Errorf("the claimed container with its start ended %+v, want its task's exit 3", es)
			}
		})
	}
}
