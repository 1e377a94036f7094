//go:build linux

package gvisor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/cgroups"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestCheckpointRestoreRunscs: a checkpoint and a restore start no runsc
// but the ones that do the work (checkpoint; restore, by the launcher;
// kill, the SIGCONT): no `runsc state` polled while the restore runs, and
// no `runsc delete` of a container runsc has already forgotten. Each
// runsc started costs about 40 ms here, and the polls ran beside the
// restore on the same cores.
func TestCheckpointRestoreRunscs(t *testing.T) {
	// runsc, through a script that writes down each subcommand.
	calls := filepath.Join(t.TempDir(), "calls")
	wrapper := wrapRunsc(t, `for a; do case $a in -*) ;; *) echo "$a" >> `+calls+`; break;; esac; done`)
	r, err := New(Options{DataRoot: sandboxtest.DataRoot, StateDir: filepath.Join(t.TempDir(), "state"), CgroupParent: "corral-gvisor-test", Runsc: wrapper},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sp := upSandbox(ctx, t, r, "")
	image := checkpointDir(t)
	os.Remove(calls)
	if err := r.Checkpoint(ctx, sp.ID, image); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Restore(ctx, sp, image); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(calls)
	got := strings.Fields(string(b))
	if want := []string{"checkpoint", "restore", "kill"}; !slices.Equal(got, want) {
		t.Errorf("runscs started by a checkpoint and a restore: %q, want %q", got, want)
	}
}

// TestCheckpointFlags: --direct goes with a checkpoint only where runsc
// has it and the image's directory opens a file with O_DIRECT (asked
// with a file removed again); elsewhere (here, a directory that is not
// there) the checkpoint goes through the page cache.
func TestCheckpointFlags(t *testing.T) {
	dir := t.TempDir()
	plain := ImageOptions{Checkpoint: []string{"--compression=none"}}
	direct := plain
	direct.Direct = true
	for _, tc := range []struct {
		o    ImageOptions
		dir  string
		want []string
	}{
		{direct, dir, []string{"--compression=none", "--direct"}},
		{direct, filepath.Join(dir, "missing"), []string{"--compression=none"}},
		{plain, dir, []string{"--compression=none"}},
		{ImageOptions{}, dir, nil},
	} {
		if got := tc.o.CheckpointFlags(tc.dir); !slices.Equal(got, tc.want) {
			t.Errorf("%+v in %s: %q, want %q", tc.o, tc.dir, got, tc.want)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("the O_DIRECT probe left %v", ents)
	}
	if !slices.Equal(direct.Checkpoint, []string{"--compression=none"}) {
		t.Errorf("CheckpointFlags changed the options: %q", direct.Checkpoint)
	}
}

// TestCheckpointAtItsLimit: a sandbox at its memory limit checkpoints
// (with Debian's runsc, whose save writes the image through the page
// cache: the save's room above the limit, cgroups.RaiseMemory) and comes
// back. Without the room its sentry was OOM-killed mid-save.
func TestCheckpointAtItsLimit(t *testing.T) {
	testenv.RequireRunsc(t)
	r, _ := MustNew(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sp := upSandbox(ctx, t, r, ballast)
	limitAtUse(t, memoryCgroup(t, r, sp.ID))
	image := checkpointDir(t)
	if err := r.Checkpoint(ctx, sp.ID, image); err != nil {
		t.Fatalf("checkpoint of a sandbox at its memory limit: %v", err)
	}
	if _, err := r.Restore(ctx, sp, image); err != nil {
		t.Fatal(err)
	}
	whole := `[ "$(wc -c < /tmp/ballast)" = 50331648 ] && [ "$(tr -d x < /tmp/ballast | wc -c)" = 0 ]`
	if st, err := r.Exec(ctx, sp.ID, sandbox.ExecRequest{Command: []string{"/bin/sh", "-c", whole}}); err != nil || st.Code != 0 {
		t.Errorf("the restored sandbox's ballast: exit %d, %v; want its 48 MiB of x", st.Code, err)
	}
}

// TestRecoverPutsTheRaiseBack: a server killed in a checkpoint, after it
// raised the sandbox's memory limit for the save, leaves the sandbox
// running with the raised limit; the next server's Recover puts it back.
func TestRecoverPutsTheRaiseBack(t *testing.T) {
	testenv.RequireRunsc(t)
	r, newRuntime := MustNew(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sp := upSandbox(ctx, t, r, ballast)
	m := memoryCgroup(t, r, sp.ID)
	before, _ := os.ReadFile(filepath.Join(m.dir, m.limit))
	e, err := r.Lookup(sp.ID)
	if err != nil {
		t.Fatal(err)
	}
	// What Checkpoint does first; then its server is killed.
	if _, err := cgroups.RaiseMemory(e.St.Cgroups, raisedRecord(e.Dir)); err != nil {
		t.Fatal(err)
	}
	if raised, _ := os.ReadFile(filepath.Join(m.dir, m.limit)); string(raised) == string(before) {
		t.Fatalf("the limit was not raised: %s", raised)
	}
	sandboxtest.MustRecover(ctx, t, newRuntime(), sp.ID)
	if after, _ := os.ReadFile(filepath.Join(m.dir, m.limit)); string(after) != string(before) {
		t.Errorf("the memory limit after the next server's Recover: %s, want it put back to %s", after, before)
	}
	if _, err := os.Stat(raisedRecord(e.Dir)); !os.IsNotExist(err) {
		t.Errorf("the raise's record after Recover: %v", err)
	}
}

// TestCheckpointOOMSaysSo: a sandbox whose memory cgroup kills its sentry
// while runsc saves it (its limit lowered to what it uses once the save
// has its room, by a runsc wrapper, and its processes first in line for
// the OOM killer) fails its checkpoint, and the error says the memory
// limit did it, not only runsc's EOF (the words a soak on Debian's runsc
// failed with once in some 550 cycles).
func TestCheckpointOOMSaysSo(t *testing.T) {
	cgFile := filepath.Join(t.TempDir(), "cgroup")
	wrapper := wrapRunsc(t, "for a; do case $a in -*) ;; checkpoint) . "+cgFile+"; echo $(( $(cat $mem/$usage) + 1048576 )) > $mem/$limit; "+
		"for p in $(cat $mem/cgroup.procs); do echo 1000 > /proc/$p/oom_score_adj; done; break;; *) break;; esac; done")
	r, _ := MustNew(t, func(o *Options) { o.Runsc = wrapper })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sp := upSandbox(ctx, t, r, ballast)
	m := memoryCgroup(t, r, sp.ID)
	if err := os.WriteFile(cgFile, []byte(fmt.Sprintf("mem=%s usage=%s limit=%s\n", m.dir, m.usage, m.limit)), 0o644); err != nil {
		t.Fatal(err)
	}
	image := checkpointDir(t)
	if err := r.Checkpoint(ctx, sp.ID, image); err == nil || !strings.Contains(err.Error(), "its memory limit was reached while it was saved") {
		t.Errorf("checkpoint of a sandbox OOM-killed in its save: %v, want an error naming the limit", err)
	}
}

// checkpointDir is an empty directory of the test's, 0700, for a
// checkpoint's image.
func checkpointDir(t *testing.T) string {
	t.Helper()
	image := filepath.Join(t.TempDir(), "checkpoint")
	if err := os.Mkdir(image, 0o700); err != nil {
		t.Fatal(err)
	}
	return image
}

// ballast fills 48 MiB of a sandbox's /tmp (the sentry's memory).
const ballast = "head -c 48m /dev/zero | tr '\\0' x > /tmp/ballast; "

// upSandbox starts a sandbox on r, limited to 256 MiB, that runs the shell
// commands first, then says it is up and sleeps; it waits until it is up.
func upSandbox(ctx context.Context, t *testing.T, r *Runtime, first string) sandbox.Spec {
	t.Helper()
	sp := sandbox.Spec{ID: sandboxtest.NewID(t), Command: []string{"/bin/sh", "-c", first + "echo up > /tmp/up; while :; do sleep 1; done"},
		Limits: sandbox.Limits{MemoryBytes: 256 << 20, Pids: 64}}
	if _, err := r.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Destroy(context.Background(), sp.ID) })
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if st, err := r.Exec(ctx, sp.ID, sandbox.ExecRequest{Command: []string{"/usr/bin/test", "-e", "/tmp/up"}}); err == nil && st.Code == 0 {
			return sp
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandbox never came up")
		}
	}
}

// memcg is a sandbox's memory cgroup and its usage and limit files (v1's
// or v2's).
type memcg struct{ dir, usage, limit string }

func memoryCgroup(t *testing.T, r *Runtime, id string) memcg {
	t.Helper()
	e, err := r.Lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range e.St.Cgroups {
		for _, m := range []memcg{{d, "memory.usage_in_bytes", "memory.limit_in_bytes"}, {d, "memory.current", "memory.max"}} {
			if _, err := os.Stat(filepath.Join(d, m.limit)); err == nil {
				return m
			}
		}
	}
	t.Fatalf("no memory cgroup among the sandbox's: %q", e.St.Cgroups)
	return memcg{}
}

// limitAtUse lowers the memory limit of m to 1 MiB above what it uses and
// puts its processes first in line for the OOM killer.
func limitAtUse(t *testing.T, m memcg) {
	t.Helper()
	procs, _ := os.ReadFile(filepath.Join(m.dir, "cgroup.procs"))
	for _, pid := range strings.Fields(string(procs)) {
		os.WriteFile("/proc/"+pid+"/oom_score_adj", []byte("1000"), 0)
	}
	usage, _ := os.ReadFile(filepath.Join(m.dir, m.usage))
	var n int64
	fmt.Sscan(string(usage), &n)
	if err := os.WriteFile(filepath.Join(m.dir, m.limit), []byte(fmt.Sprint(n+(1<<20))), 0); err != nil {
		t.Fatal(err)
	}
}

// wrapRunsc writes a script that runs the shell commands before, then
// Debian's runsc with its arguments, and returns its path.
func wrapRunsc(t *testing.T, before string) string {
	t.Helper()
	testenv.RequireRunsc(t)
	real, err := exec.LookPath("runsc")
	if err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\n"+before+"\nexec "+real+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return wrapper
}
