//go:build linux

package gvisor

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
	"github.com/corral-dev/corral/internal/testenv"
)

// The crash helper's environment: the point it dies at, the state and
// task directories and the task id the parent test looks at afterwards.
const (
	envCrashPoint = "CORRAL_TEST_GVISOR_CRASH_POINT"
	envCrashState = "CORRAL_TEST_GVISOR_CRASH_STATE"
	envCrashDir   = "CORRAL_TEST_GVISOR_CRASH_DIR"
	envCrashID    = "CORRAL_TEST_GVISOR_CRASH_ID"
)

func crashOptions(state string) Options {
	return Options{DataRoot: sandboxtest.DataRoot, StateDir: state, CgroupParent: "corral-gvisor-test"}
}

// TestCrashPoints: a server killed with SIGKILL while its launcher waits
// at its gate leaves nothing that runs the task's command: killed before
// the sandbox's state is written (launched), no sandbox at all; after it
// (gated), a sandbox that ended without running it and says so
// (ExitStatus.NotStarted), so the scheduler starts its task again instead
// of taking its end for the task's. The "server" is this test binary
// again, which kills itself at the point.
func TestCrashPoints(t *testing.T) {
	if point := os.Getenv(envCrashPoint); point != "" {
		crashHelper(t, point)
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
			state, dir := filepath.Join(t.TempDir(), "state"), mountDir(t)
			id := sandboxtest.NewID(t)
			sandboxtest.KilledAt(t, "TestCrashPoints", tt.point, envCrashPoint+"="+tt.point, envCrashState+"="+state, envCrashDir+"="+dir, envCrashID+"="+id)

			r, err := New(crashOptions(state), slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			t.Cleanup(func() { r.Destroy(context.Background(), id) })
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
				if !es.NotStarted {
					t.Errorf("the sandbox's end %+v: want NotStarted", es)
				}
			} else {
				time.Sleep(time.Second) // what a launcher let go would do takes about as long
			}
			if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
				t.Errorf("the task's command ran")
			}
			if err := r.Destroy(ctx, id); err != nil {
				t.Errorf("Destroy: %v", err)
			}
		})
	}
}

// crashHelper is TestCrashPoints' "server": it creates the task's sandbox
// and kills itself with SIGKILL at point.
func crashHelper(t *testing.T, point string) {
	opts := crashOptions(os.Getenv(envCrashState))
	opts.Crash = sandboxtest.KillAt(point)
	r, err := New(opts, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		t.Fatal(err)
	}
	id := os.Getenv(envCrashID)
	_, err = r.Create(context.Background(), sandbox.Spec{ID: id, Command: []string{"/bin/sh", "-c", "touch /out/ran"}, Dir: "/out",
		Mounts: []sandbox.Mount{{Source: sandboxtest.MountSource(os.Getenv(envCrashDir)), Target: "/out"}},
		Labels: map[string]string{sandbox.LabelManaged: "true", "test": id}})
	if err != nil {
		t.Fatal(err)
	}
	t.Fatalf("Create returned without passing %s", point)
}
