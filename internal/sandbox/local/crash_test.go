//go:build linux

package local

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/sandbox/warmpool"
	"github.com/corral-dev/corral/internal/testenv"
)

// The crash helper's environment: the point it dies at, and the state
// and tasks directories and task id the parent test looks at afterwards.
const (
	envCrashPoint = "CORRAL_TEST_LOCAL_CRASH_POINT"
	envCrashState = "CORRAL_TEST_LOCAL_CRASH_STATE"
	envCrashTasks = "CORRAL_TEST_LOCAL_CRASH_TASKS"
	envCrashID    = "CORRAL_TEST_LOCAL_CRASH_ID"
)

// crashOptions are the runtime options of TestCrashPoints over state,
// both the helper's and the parent's.
func crashOptions(state string) Options {
	return Options{DataRoot: sandboxtest.DataRoot, HostRoots: []string{os.TempDir()}, StateDir: state, CgroupParent: "corral-test"}
}

// TestCrashPoints: a server killed with SIGKILL at each point of a task's
// Create, warm (claimed, moved, handed over, sent) and cold (launched,
// gated), leaves what the next runtime tells apart: before the hand-over
// or the state, no sandbox and the task's directory as it was, nothing of
// the task run; handed over or gated, a sandbox that ended without running
// the task's command and says so (ExitStatus.NotStarted); sent, a sandbox
// whose command ran and whose exit is its own. The "server" is this test
// binary again, which kills itself at the point (as the server's
// Options.Crash does).
func TestCrashPoints(t *testing.T) {
	if point := os.Getenv(envCrashPoint); point != "" {
		crashHelper(t, point)
		return
	}
	testenv.RequireBwrap(t)
	for _, tt := range []struct {
		point string
		warm  bool
		found bool // a sandbox is listed for the task
		ran   bool // its command ran
	}{
		{sandbox.CrashClaimed, true, false, false},
		{sandbox.CrashMoved, true, false, false},
		{sandbox.CrashHandedOver, true, true, false},
		{sandbox.CrashSent, true, true, true},
		{sandbox.CrashLaunched, false, false, false},
		{sandbox.CrashGated, false, true, false},
	} {
		t.Run(tt.point, func(t *testing.T) {
			state, tasks := filepath.Join(testenv.TempDir(t), "state"), testenv.TempDir(t)
			id := sandboxtest.NewID(t)
			dir := filepath.Join(tasks, id)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "prompt.md"), []byte("kept"), 0o644); err != nil {
				t.Fatal(err)
			}
			sandboxtest.KilledAt(t, "TestCrashPoints", tt.point, envCrashPoint+"="+tt.point, envCrashState+"="+state, envCrashTasks+"="+tasks, envCrashID+"="+id)

			r, err := New(crashOptions(state), slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
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
			if tt.found {
				if err := r.Recover(ctx, &hs[0]); err != nil {
					t.Fatalf("Recover: %v", err)
				}
				es, err := r.Wait(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if es.NotStarted == tt.ran || (tt.ran && es.Code != 7) {
					t.Errorf("the sandbox's end %+v: want NotStarted %v and, when it ran, code 7", es, !tt.ran)
				}
			} else {
				// What the helper's launcher or warm sandbox may still do
				// happens in milliseconds.
				time.Sleep(500 * time.Millisecond)
			}
			if _, err := os.Stat(filepath.Join(dir, "ran")); (err == nil) != tt.ran {
				t.Errorf("the task's command ran: %v, want %v", err == nil, tt.ran)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "prompt.md")); err != nil || string(b) != "kept" {
				t.Errorf("the task's prompt.md after the restart: %q %v", b, err)
			}
			if err := r.Destroy(ctx, id); err != nil {
				t.Errorf("Destroy: %v", err)
			}
		})
	}
}

// crashHelper is TestCrashPoints' "server": it creates the task's sandbox,
// warm from a pool of one when point is a claim's, and kills itself with
// SIGKILL at point.
func crashHelper(t *testing.T, point string) {
	opts := crashOptions(os.Getenv(envCrashState))
	opts.Crash = sandboxtest.KillAt(point)
	r, err := New(opts, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		t.Fatal(err)
	}
	sandboxtest.CreateUntilKilled(t, r, point, os.Getenv(envCrashTasks), os.Getenv(envCrashID))
}
