//go:build linux

package gvisor

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/sandbox/warmpool"
	"github.com/corral-dev/corral/internal/testenv"
)

// The crash helper's environment: the point it dies at, the state and
// tasks directories and the task id the parent test looks at afterwards.
const (
	envCrashPoint = "CORRAL_TEST_GVISOR_CRASH_POINT"
	envCrashState = "CORRAL_TEST_GVISOR_CRASH_STATE"
	envCrashTasks = "CORRAL_TEST_GVISOR_CRASH_TASKS"
	envCrashID    = "CORRAL_TEST_GVISOR_CRASH_ID"
	envCrashCg    = "CORRAL_TEST_GVISOR_CRASH_CGROUP"
)

// crashOptions are the runtime options of TestCrashPoints over state,
// both the helper's and the parent's: the sandboxes' cgroups under
// cgParent, the subtest's own.
func crashOptions(state, cgParent string) Options {
	return Options{DataRoot: sandboxtest.DataRoot, StateDir: state, CgroupParent: cgParent,
		Subreaper: filepath.Join(filepath.Dir(corralBin), "corral-worker")}
}

// TestCrashPoints: a server killed with SIGKILL at each point of a task's
// Create, warm (claimed: the warm sandbox taken from its pool; moved: the
// task's directory moved into its slot; handed over: its state dir named
// after the task; sent: the start written to its worker) and cold
// (launched, gated), leaves what the next runtime tells apart, as the
// local runtime's do: before the hand-over or the state, no sandbox of the
// task, nothing of it run; handed over or gated, a sandbox that ends
// without running the task's command and says so (ExitStatus.NotStarted,
// with its reason), so that the scheduler starts the task again instead of
// taking that end for the task's; sent, a sandbox whose command ran and
// whose exit is its own. In every case the task's files are back in its
// directory, runsc runs no warm sandbox of the server gone (the next
// runtime destroyed them, or the one claimed is the task's), and once the
// task's sandbox is destroyed nothing is left: no runsc container, no
// slot, no identity's lease, no pin. The "server" is this test binary
// again, which kills itself at the point (as the server's Options.Crash
// does).
func TestCrashPoints(t *testing.T) {
	if point := os.Getenv(envCrashPoint); point != "" {
		crashHelper(t, point)
		return
	}
	testenv.RequireRunsc(t)
	for _, tt := range []struct {
		point string
		found bool // a sandbox is listed for the task
		ran   bool // its command ran
	}{
		{sandbox.CrashClaimed, false, false},
		{sandbox.CrashMoved, false, false},
		{sandbox.CrashHandedOver, true, false},
		{sandbox.CrashSent, true, true},
		{sandbox.CrashLaunched, false, false},
		{sandbox.CrashGated, true, false},
	} {
		t.Run(tt.point, func(t *testing.T) {
			r, state, id, dir := afterCrash(t, "TestCrashPoints", tt.point)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			t.Cleanup(func() { r.Destroy(context.Background(), id) })
			if ids := r.warmIDs(t); len(ids) != 0 {
				t.Errorf("warm sandboxes %v left after the restart", ids)
			}
			if ents, _ := os.ReadDir(warmpool.DirOf(state)); len(ents) != 1 || ents[0].Name() != r.Tag+".lock" {
				t.Errorf("warm slots left after the restart: %v, want only the runtime's lock", ents)
			}
			hs, err := r.List(ctx, map[string]string{"test": id})
			if err != nil {
				t.Fatal(err)
			}
			if got := len(hs) == 1; got != tt.found || len(hs) > 1 {
				t.Fatalf("sandboxes of the task after the restart: %+v, want found %v", hs, tt.found)
			}
			// runsc knows the task's sandbox (a claimed one by its warm
			// id), and no other.
			var mine []string
			if tt.found {
				e, err := r.Lookup(id)
				if err != nil {
					t.Fatal(err)
				}
				mine = append(mine, e.St.container())
			}
			got := r.runscList(t)
			if slices.ContainsFunc(got, func(c runscContainer) bool { return !slices.Contains(mine, c.ID) }) {
				t.Errorf("runsc after the restart: %+v, want only the task's %v", got, mine)
			}
			for pid, cmd := range processesMentioning(state) {
				if !slices.ContainsFunc(mine, func(c string) bool { return strings.Contains(cmd, c) }) {
					t.Errorf("process %d runs after the restart, of no sandbox of the task's: %s", pid, cmd)
				}
			}
			if tt.found {
				if err := r.Recover(ctx, &hs[0]); err != nil {
					t.Fatalf("Recover: %v", err)
				}
				es, err := r.Wait(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if es.NotStarted == tt.ran || (tt.ran && es.Code != 7) || (!tt.ran && es.Message == "") {
					t.Errorf("the sandbox's end %+v: want NotStarted %v, with its reason, and, when it ran, code 7", es, !tt.ran)
				}
			} else {
				time.Sleep(time.Second) // what a launcher let go would do takes about as long
			}
			if _, err := os.Stat(filepath.Join(dir, "ran")); (err == nil) != tt.ran {
				t.Errorf("the task's command ran: %v, want %v", err == nil, tt.ran)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "prompt.md")); err != nil || string(b) != "kept" {
				t.Errorf("the task's prompt.md after the restart: %q %v", b, err)
			}
			if fi, err := os.Stat(filepath.Join(dir, "input")); err != nil || !fi.IsDir() {
				t.Errorf("the task's input/ after the restart: %v", err)
			}
			if err := r.Destroy(ctx, id); err != nil {
				t.Errorf("Destroy: %v", err)
			}
			if got := r.runscList(t); len(got) != 0 {
				t.Errorf("runsc after the task's sandbox is destroyed: %+v, want nothing", got)
			}
			for pid, cmd := range processesMentioning(state) {
				t.Errorf("process %d runs after the task's sandbox is destroyed: %s", pid, cmd)
			}
			// Nothing else of the task's sandbox or of the warm ones: no
			// cgroup, and the state dir holds runsc's directory, the
			// slots' (with the runtime's lock alone) and the leases'
			// (empty).
			if r.cg != nil {
				for _, d := range r.cg.Dirs("") {
					ents, _ := os.ReadDir(d)
					for _, e := range ents {
						if e.IsDir() {
							t.Errorf("cgroup left after the task's sandbox is destroyed: %s", filepath.Join(d, e.Name()))
						}
					}
				}
			}
			for _, d := range []string{state, filepath.Join(state, "identities"), filepath.Join(state, ".pins")} {
				ents, _ := os.ReadDir(d)
				for _, e := range ents {
					if d != state || !slices.Contains([]string{"runsc", "_warm", "identities", ".pins"}, e.Name()) {
						t.Errorf("left in %s after the task's sandbox is destroyed: %s", d, e.Name())
					}
				}
			}
		})
	}
}

// afterCrash has this test binary, as the "server" of test run, die at
// point over a fresh state dir and a task whose directory holds input/
// and prompt.md ("kept"), and returns a runtime over that state (the
// restarted server's), the state dir, the task's id and its directory.
func afterCrash(t *testing.T, run, point string) (r *Runtime, state, id, dir string) {
	t.Helper()
	state, tasks := filepath.Join(testenv.TempDir(t), "state"), testenv.TempDir(t)
	id = sandboxtest.NewID(t)
	dir = filepath.Join(tasks, id)
	if err := os.MkdirAll(filepath.Join(dir, "input"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "prompt.md"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	cgParent := "corral-gvisor-test/" + id
	sandboxtest.KilledAt(t, run, point, envCrashPoint+"="+point, envCrashState+"="+state, envCrashTasks+"="+tasks, envCrashID+"="+id, envCrashCg+"="+cgParent)
	r, err := New(crashOptions(state, cgParent), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.Close()
		if r.cg != nil {
			for _, d := range r.cg.Dirs("") {
				os.Remove(d)
			}
		}
	})
	return r, state, id, dir
}

// runscContainer is a container `runsc list` reports.
type runscContainer struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// runscList lists the containers runsc knows in r's state dir, running or
// not.
func (r *Runtime) runscList(t *testing.T) []runscContainer {
	t.Helper()
	out, err := r.runsc(context.Background(), "list", "-format=json")
	if err != nil {
		t.Fatalf("runsc list: %v: %s", err, out)
	}
	var cs []runscContainer
	if err := json.Unmarshal(out, &cs); err != nil {
		t.Fatalf("runsc list: %v: %s", err, out)
	}
	return cs
}

// processesMentioning returns the processes whose command line holds s
// (a sandbox's launcher, runsc, its sentry and gofer name its state dir),
// by pid, their command lines with spaces.
func processesMentioning(s string) map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), s) {
			out[pid] = strings.ReplaceAll(string(b), "\x00", " ")
		}
	}
	return out
}

// crashHelper is TestCrashPoints' "server": it creates the task's sandbox,
// warm from a pool of one when point is a claim's, and kills itself with
// SIGKILL at point.
func crashHelper(t *testing.T, point string) {
	opts := crashOptions(os.Getenv(envCrashState), os.Getenv(envCrashCg))
	opts.Crash = sandboxtest.KillAt(point)
	r, err := New(opts, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		t.Fatal(err)
	}
	sandboxtest.CreateUntilKilled(t, r, point, os.Getenv(envCrashTasks), os.Getenv(envCrashID))
}

// TestRestoreCrashPoints: a server killed with SIGKILL in a restore (a
// session's resume), once its launcher runs under the subreaper
// (launched) and once the sandbox's state names it (gated), leaves what
// the next runtime tells apart, as a cold start's crash points do:
// launched, no sandbox, and the launcher, its gate closed, gone with
// nothing run; gated, a sandbox that ends without running (NotStarted,
// with its reason). Either way, once it is destroyed, no runsc
// container and no process of it is left, subreaper included.
func TestRestoreCrashPoints(t *testing.T) {
	if point := os.Getenv(envCrashPoint); point != "" {
		restoreCrashHelper(t, point)
		return
	}
	testenv.RequireRunsc(t)
	for _, tt := range []struct {
		point string
		found bool
	}{
		{sandbox.CrashLaunched, false},
		{sandbox.CrashGated, true},
	} {
		t.Run(tt.point, func(t *testing.T) {
			r, state, id, _ := afterCrash(t, "TestRestoreCrashPoints", tt.point)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			hs, err := r.List(ctx, map[string]string{"test": id})
			if err != nil {
				t.Fatal(err)
			}
			if got := len(hs) == 1; got != tt.found || len(hs) > 1 {
				t.Fatalf("sandboxes after the restart: %+v, want found %v", hs, tt.found)
			}
			if tt.found {
				if err := r.Recover(ctx, &hs[0]); err != nil {
					t.Fatalf("Recover: %v", err)
				}
				if es, err := r.Wait(ctx, id); err != nil || !es.NotStarted || es.Message == "" {
					t.Errorf("the restored sandbox's end %+v (%v): want NotStarted, with its reason", es, err)
				}
			} else {
				time.Sleep(time.Second) // what a launcher let go would do takes about as long
			}
			if err := r.Destroy(ctx, id); err != nil {
				t.Errorf("Destroy: %v", err)
			}
			if got := r.runscList(t); len(got) != 0 {
				t.Errorf("runsc after the sandbox is destroyed: %+v, want nothing", got)
			}
			for pid, cmd := range processesMentioning(state) {
				t.Errorf("process %d runs after the sandbox is destroyed: %s", pid, cmd)
			}
		})
	}
}

// restoreCrashHelper is TestRestoreCrashPoints' "server": it creates a
// sandbox that counts, checkpoints it, and restores it, killing itself
// with SIGKILL at point of the restore.
func restoreCrashHelper(t *testing.T, point string) {
	r, err := New(crashOptions(os.Getenv(envCrashState), os.Getenv(envCrashCg)), slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sp := sandboxtest.CrashSpec(os.Getenv(envCrashTasks), os.Getenv(envCrashID))
	sp.Command = []string{sandboxtest.Shell, "-c", `i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.05; done`}
	if _, err := r.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(os.Getenv(envCrashState), "image")
	if err := os.Mkdir(image, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := r.Checkpoint(ctx, sp.ID, image); err != nil {
		t.Fatal(err)
	}
	r.opts.Crash = sandboxtest.KillAt(point)
	if _, err := r.Restore(ctx, sp, image); err != nil {
		t.Fatal(err)
	}
	t.Fatalf("Restore returned without passing %s", point)
}
