//go:build linux

package docker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/cgroups"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/testenv"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

// oci names the engine runtimes the tests run under: the engine's default
// (runc) and gVisor.
var oci = []string{"", "runsc"}

func require(tb testing.TB, runtime string) {
	tb.Helper()
	if runtime == "" {
		testenv.RequireDocker(tb)
	} else {
		testenv.RequireDockerRuntime(tb, runtime)
	}
}

// mustNew returns a Runtime on the test engine with its own instance, so
// tests never see each other's containers.
func mustNew(tb testing.TB, runtime, instance string) *Runtime {
	tb.Helper()
	r, err := New(Options{
		DataRoot:     sandboxtest.DataRoot,
		Host:         "unix://" + testenv.DockerSocket,
		Runtime:      runtime,
		DefaultImage: testenv.DockerImage,
		Instance:     instance,
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() })
	return r
}

// latency is the conformance suite's Harness.Latency for an engine
// runtime. runsc's starts, kills and deletes go through its sentry under
// the ptrace platform, CPU work that a busy machine makes seconds long: in
// a CI run whose two cores were taken by the other packages' tests, a Stop
// came back 5.2 s after its grace and five cuts of DestroyCutShort (a
// Create and two Destroys each) needed more than 50 s, where an idle
// machine takes 1 s and 8 s. runc's bookkeeping is the engine's alone.
func latency(runtime string) time.Duration {
	if runtime == "runsc" {
		return 5 * time.Second
	}
	return 0
}

func name(runtime string) string {
	if runtime == "" {
		return "runc"
	}
	return runtime
}

func TestConformance(t *testing.T) {
	for _, rt := range oci {
		t.Run(name(rt), func(t *testing.T) {
			require(t, rt)
			sandboxtest.Run(t, sandboxtest.Harness{
				Setup: func(t *testing.T) func() sandbox.Runtime {
					inst := sandboxtest.NewID(t)
					return func() sandbox.Runtime { return mustNew(t, rt, inst) }
				},
				Latency: latency(rt),
			})
		})
	}
}

func TestSurvivesServerDeath(t *testing.T) {
	for _, rt := range oci {
		t.Run(name(rt), func(t *testing.T) {
			require(t, rt)
			// The instance travels to the helper process as the "state".
			setup := func(t *testing.T) (string, string) { return sandboxtest.NewID(t), testenv.TempDir(t) }
			sandboxtest.ServerDeath(t, setup, func(tb testing.TB, inst string) sandbox.Runtime {
				return mustNew(tb, rt, inst)
			})
		})
	}
}

// TestCreatedNeverStarted: a server that died between a container's create
// and its start leaves it created; the next one finds it and must tell it
// never ran. The engine answers a wait on such a container at once, with
// exit code 0, and it was reported running ("creating"), then as a
// success of a command that never ran.
func TestCreatedNeverStarted(t *testing.T) {
	require(t, "")
	inst := sandboxtest.NewID(t)
	dead := mustNew(t, "", inst)
	died := make(chan struct{})
	never := make(chan struct{})
	defer close(never)
	dead.opts.Crash = func(point string) {
		if point == sandbox.CrashLaunched {
			close(died)
			<-never // the server is gone: this goroutine goes no further
		}
	}
	dir := testenv.TempDir(t)
	sp := sandbox.Spec{
		ID: sandboxtest.NewID(t), Command: []string{"/bin/sh", "-c", "touch ran"}, Dir: "/out",
		Mounts: []sandbox.Mount{{Source: sandboxtest.MountSource(dir), Target: "/out"}},
	}
	go dead.Create(context.Background(), sp)
	<-died

	r := mustNew(t, "", inst) // the next server
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer r.Destroy(context.Background(), sp.ID)
	list, err := r.List(ctx, nil)
	if err != nil || len(list) != 1 || list[0].ID != sp.ID {
		t.Fatalf("List: %+v, %v; want the created sandbox", list, err)
	}
	if err := r.Recover(ctx, &list[0]); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	st, err := r.Status(ctx, sp.ID)
	if err != nil || st.State != sandbox.StateExited || st.Exit == nil || !st.Exit.NotStarted {
		t.Errorf("Status: %+v (exit %+v), %v; want exited, not started", st, st.Exit, err)
	}
	es, err := r.Wait(ctx, sp.ID)
	if err != nil || !es.NotStarted || es.Code == 0 {
		t.Errorf("Wait: %+v, %v; want not started, no exit code 0", es, err)
	}
	if err := r.Destroy(ctx, sp.ID); err != nil {
		t.Errorf("Destroy: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
		t.Errorf("the command ran")
	}
}

// run creates a sandbox running script with a fresh directory at /out as
// its working directory, waits for it, destroys it and returns its exit
// status and what it wrote to /out/out.
func run(t *testing.T, r *Runtime, script string, mod func(*sandbox.Spec)) (sandbox.ExitStatus, string) {
	t.Helper()
	dir := testenv.TempDir(t)
	sp := sandbox.Spec{
		ID:      sandboxtest.NewID(t),
		Command: []string{"/bin/sh", "-c", script},
		Dir:     "/out",
		Mounts:  []sandbox.Mount{{Source: sandboxtest.MountSource(dir), Target: "/out"}},
	}
	if mod != nil {
		mod(&sp)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := r.Create(ctx, sp); err != nil {
		t.Fatalf("Create: %v", err)
	}
	defer r.Destroy(context.Background(), sp.ID)
	es, err := r.Wait(ctx, sp.ID)
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	out, _ := os.ReadFile(filepath.Join(dir, "out"))
	return es, string(out)
}

// TestHardening checks what a sandbox's process is under each engine
// runtime: its own host identity, no capabilities, no_new_privs, a read-only
// root, a bounded /tmp and no network but loopback.
func TestHardening(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string, r *Runtime) {
		script := `exec > out 2>&1
u=$(id -u); [ "$u" -gt 1900000000 ] && [ "$u" -le 1900065535 ] && echo own uid; id -g
grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status
touch /root-write && echo root writable || echo root read-only
df -k /tmp | tail -1 | awk '{print "tmp", $2}'
echo nets: $(awk 'NR>2{sub(":","",$1); print $1}' /proc/net/dev)
hostname`
		es, out := run(t, r, script, nil)
		if es.Code != 0 {
			t.Fatalf("exit %d: %s", es.Code, out)
		}
		for _, want := range []string{
			"own uid\n1900000000\n", // its own uid of the range, the sandboxes' group
			"CapEff:\t0000000000000000", "CapBnd:\t0000000000000000",
			"root read-only", "tmp 262144", "nets: lo\n", "corral\n",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("sandbox reported %q, want %q in it", out, want)
			}
		}
		if rt == "" && !strings.Contains(out, "NoNewPrivs:\t1") {
			// gVisor's /proc does not show NoNewPrivs.
			t.Errorf("sandbox reported %q, want NoNewPrivs 1", out)
		}
	})
}

// TestThreads: a C program starts a thread under each engine runtime.
// glibc starts threads with clone3 and falls back to clone only on ENOSYS;
// runsc answers EPERM for every refusal of the profile, so under runsc
// the profile must let clone3 through (Python's threads failed with
// "can't start new thread" until 2026-11-30).
func TestThreads(t *testing.T) {
	eachRuntime(t, func(t *testing.T, _ string, r *Runtime) {
		es, out := run(t, r, `python3 -c 'import threading
t = threading.Thread(target=lambda: open("out", "w").write("thread ran\n"))
t.start(); t.join()' 2>> out`, func(sp *sandbox.Spec) { sp.Image = testenv.DockerPythonImage })
		if es.Code != 0 || out != "thread ran\n" {
			t.Errorf("exit %d, %q; want a thread that ran", es.Code, out)
		}
	})
}

// eachRuntime runs fn under each engine runtime in parallel, each on a
// Runtime with an instance of its own.
func eachRuntime(t *testing.T, fn func(t *testing.T, rt string, r *Runtime)) {
	for _, rt := range oci {
		t.Run(name(rt), func(t *testing.T) {
			t.Parallel()
			require(t, rt)
			fn(t, rt, mustNew(t, rt, sandboxtest.NewID(t)))
		})
	}
}

// TestImages: a Spec's image wins over the default; a missing image is a
// clear error while pulling is off.
func TestImages(t *testing.T) {
	require(t, "")
	r := mustNew(t, "", sandboxtest.NewID(t))
	es, out := run(t, r, `. /etc/os-release; echo $VERSION_CODENAME > out`, func(sp *sandbox.Spec) { sp.Image = testenv.DockerImage })
	if es.Code != 0 || out != "bookworm\n" {
		t.Errorf("explicit image: exit %d, %q; want bookworm", es.Code, out)
	}
	ctx := context.Background()
	_, err := r.Create(ctx, sandbox.Spec{ID: sandboxtest.NewID(t), Image: "corral-test/no-such-image:1", Command: []string{"true"}})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "not on the Docker engine") {
		t.Errorf("Create with a missing image = %v, want a failed precondition saying the image is missing", err)
	}
}

// TestOtherInstancesInvisible: two servers on one engine never see each
// other's sandboxes.
func TestOtherInstancesInvisible(t *testing.T) {
	require(t, "")
	a, b := mustNew(t, "", sandboxtest.NewID(t)), mustNew(t, "", sandboxtest.NewID(t))
	ctx := context.Background()
	id := sandboxtest.NewID(t)
	if _, err := a.Create(ctx, sandbox.Spec{ID: id, Command: []string{"sleep", "30"}, Labels: map[string]string{sandbox.LabelManaged: "true"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Destroy(context.Background(), id) })
	if hs, err := b.List(ctx, map[string]string{sandbox.LabelManaged: "true"}); err != nil || len(hs) != 0 {
		t.Errorf("other instance's List = %v, %v; want nothing", hs, err)
	}
	if _, err := b.Status(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("other instance's Status = %v, want ErrNotFound", err)
	}
	if err := b.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if st, err := a.Status(ctx, id); err != nil || st.State != sandbox.StateRunning {
		t.Errorf("after the other instance's Destroy: %+v, %v; want running", st, err)
	}
}

func TestCapabilities(t *testing.T) {
	require(t, "")
	c, err := mustNew(t, "", "caps").Capabilities(context.Background())
	if err != nil || !c.Available || !strings.HasPrefix(c.Version, "Docker Engine ") || !c.Limits || !c.Exec || c.Checkpoint || c.NoCheckpoint != "" {
		t.Errorf("Capabilities = %+v, %v; want an available engine with limits and exec, and no checkpoints under runc", c, err)
	}
	c, _ = mustNew(t, "no-such-runtime", "caps").Capabilities(context.Background())
	if c.Available || !strings.Contains(c.Reason, `no runtime "no-such-runtime"`) {
		t.Errorf("Capabilities with an unregistered runtime = %+v, want unavailable saying so", c)
	}
	r, err := New(Options{DataRoot: "/", Host: "unix:///nonexistent/docker.sock"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	c, _ = r.Capabilities(context.Background())
	if c.Available || !strings.Contains(c.Reason, "cannot be reached") {
		t.Errorf("Capabilities with no engine = %+v, want unavailable saying the engine cannot be reached", c)
	}
}

// TestOOMEvent: the engine's OOM event is found for a container its memory
// limit killed, and not for one killed otherwise (Wait and Status fall
// back on it when the engine's OOMKilled flag misses the kill).
func TestOOMEvent(t *testing.T) {
	require(t, "")
	r := mustNew(t, "", sandboxtest.NewID(t))
	ctx := context.Background()
	for script, want := range map[string]bool{
		// After a moment: containerd before 2.2 misses an OOM kill in a
		// container's first moments (docs/kubernetes.md).
		`sleep 1; x=$(head -c 268435456 /dev/zero | tr '\0' a); echo ${#x}`: true,
		`kill -9 $$`: false,
	} {
		sp := sandbox.Spec{ID: sandboxtest.NewID(t), Command: []string{"/bin/sh", "-c", script}, Limits: sandbox.Limits{MemoryBytes: 32 << 20}}
		if _, err := r.Create(ctx, sp); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Destroy(context.Background(), sp.ID) })
		es, err := r.Wait(ctx, sp.ID)
		if err != nil || es.Code != 137 || es.OOMKilled != want {
			t.Errorf("%s: Wait = %+v, %v; want 137, OOMKilled %v", script, es, err, want)
		}
		c, err := r.inspect(ctx, sp.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.oomEvent(ctx, c); got != want {
			t.Errorf("%s: oomEvent = %v, want %v", script, got, want)
		}
	}
}

func TestMissingRunscArgs(t *testing.T) {
	for _, tc := range []struct {
		path string
		args []string
		want []string
	}{
		{"/usr/bin/runc", nil, nil},
		{"/usr/bin/runsc", nil, []string{"--oci-seccomp", "--host-uds=open"}},
		{"/usr/bin/runsc", []string{"--network=none", "--oci-seccomp"}, []string{"--host-uds=open"}},
		{"/usr/local/bin/runsc", []string{"--oci-seccomp=true", "--host-uds=all"}, nil},
	} {
		if got := missingRunscArgs(tc.path, tc.args); !slices.Equal(got, tc.want) {
			t.Errorf("missingRunscArgs(%s, %q) = %q, want %q", tc.path, tc.args, got, tc.want)
		}
	}
}

// TestCheckpoint: under runsc, on an engine with experimental features, a
// sandbox is checkpointed (gone to Status and Recover, its container
// listed for a server's start to find), restored with its memory (a
// count held by its shell goes on), refused a second checkpoint without
// being touched, and destroyed; one destroyed while checkpointed leaves
// no container.
func TestCheckpoint(t *testing.T) {
	testenv.RequireDockerCheckpoints(t)
	r := mustNew(t, "runsc", sandboxtest.NewID(t))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if c, _ := r.Capabilities(ctx); !c.Checkpoint {
		t.Fatalf("Capabilities = %+v; want checkpoints", c)
	}
	dir := testenv.TempDir(t)
	count := func() int {
		b, _ := os.ReadFile(filepath.Join(dir, "n"))
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	sp := sandbox.Spec{
		ID: sandboxtest.NewID(t), Dir: "/out",
		Command: []string{"/bin/sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > n.tmp; mv n.tmp n; sleep 0.1; done"},
		Mounts:  []sandbox.Mount{{Source: sandboxtest.MountSource(dir), Target: "/out"}},
	}
	h, err := r.Create(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Destroy(context.Background(), sp.ID)
	for count() < 20 {
		time.Sleep(100 * time.Millisecond)
	}
	if err := r.Checkpoint(ctx, sp.ID, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	before := count()
	if _, err := r.Status(ctx, sp.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Status of a checkpointed sandbox: %v; want not found", err)
	}
	if err := r.Recover(ctx, h); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Recover of a checkpointed sandbox: %v; want not found", err)
	}
	if l, err := r.List(ctx, nil); err != nil || !slices.ContainsFunc(l, func(h sandbox.Handle) bool { return h.ID == sp.ID }) {
		t.Errorf("List: %+v, %v; want the checkpointed sandbox", l, err)
	}
	if _, err := r.Restore(ctx, sp, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if st, err := r.Status(ctx, sp.ID); err != nil || st.State != sandbox.StateRunning {
		t.Errorf("Status after the restore: %+v, %v; want running", st, err)
	}
	n := count()
	for ; n == before; n = count() {
		time.Sleep(50 * time.Millisecond)
	}
	// A fresh start would count from 1 again, below before (20 or more).
	if n < before {
		t.Errorf("the count after the restore is %d, after %d: its memory was not kept", n, before)
	}
	if err := r.Checkpoint(ctx, sp.ID, t.TempDir()); !errors.Is(err, sandbox.ErrNoCheckpoint) {
		t.Errorf("a second checkpoint: %v; want ErrNoCheckpoint", err)
	}
	if st, err := r.Status(ctx, sp.ID); err != nil || st.State != sandbox.StateRunning {
		t.Errorf("Status after the refused checkpoint: %+v, %v; want running", st, err)
	}
	if err := r.Destroy(ctx, sp.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(r.restoredMark(sp.ID)); !os.IsNotExist(err) {
		t.Errorf("the restored mark after Destroy: %v", err)
	}

	// Destroyed while checkpointed.
	sp.ID = sandboxtest.NewID(t) + "-2"
	if _, err := r.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	defer r.Destroy(context.Background(), sp.ID)
	if err := r.Checkpoint(ctx, sp.ID, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if err := r.Destroy(ctx, sp.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.inspectCheckpointed(ctx, sp.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the checkpointed container after Destroy: %v; want gone", err)
	}
	if _, err := r.Restore(ctx, sp, t.TempDir()); err == nil {
		t.Errorf("a restore after Destroy succeeded")
	}
}

// TestRecoverPutsTheRaiseBack: a server killed in a checkpoint, after it
// raised the container's memory limit for the save, leaves the container
// running with the raised limit; the next server's Recover puts it back.
func TestRecoverPutsTheRaiseBack(t *testing.T) {
	testenv.RequireDocker(t)
	instance := sandboxtest.NewID(t)
	r := mustNew(t, "", instance)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sp, c, m := upContainer(ctx, t, r, "head -c 8m /dev/zero > /tmp/ballast")
	before, _ := os.ReadFile(m.limit)
	mem, err := r.memoryOf(c)
	if err != nil {
		t.Fatal(err)
	}
	r.roomToSave(sp.ID, mem) // what Checkpoint does first; then its server is killed
	if raised, _ := os.ReadFile(m.limit); string(raised) == string(before) {
		t.Fatalf("the limit was not raised: %s", raised)
	}
	next := mustNew(t, "", instance)
	sandboxtest.MustRecover(ctx, t, next, sp.ID)
	if after, _ := os.ReadFile(m.limit); string(after) != string(before) {
		t.Errorf("the memory limit after the next server's Recover: %s, want it put back to %s", after, before)
	}
	if _, err := os.Stat(next.raisedRecord(sp.ID)); !os.IsNotExist(err) {
		t.Errorf("the raise's record after Recover: %v", err)
	}
}

// TestCheckpointAtItsLimit: a container under runsc at its memory limit
// checkpoints (the save gets room above the limit, roomToSave) and comes
// back whole. Without the room its sentry was OOM-killed mid-save.
func TestCheckpointAtItsLimit(t *testing.T) {
	testenv.RequireDockerCheckpoints(t)
	r := mustNew(t, "runsc", sandboxtest.NewID(t))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sp, m := ballastContainer(ctx, t, r)
	if err := m.lowerToUsage(); err != nil {
		t.Fatal(err)
	}
	if err := r.Checkpoint(ctx, sp.ID, t.TempDir()); err != nil {
		t.Fatalf("checkpoint of a container at its memory limit: %v", err)
	}
	if _, err := r.Restore(ctx, sp, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	whole := `[ "$(wc -c < /tmp/ballast)" = 50331648 ] && [ "$(tr -d x < /tmp/ballast | wc -c)" = 0 ]`
	if st, err := r.Exec(ctx, sp.ID, sandbox.ExecRequest{Command: []string{"/bin/sh", "-c", whole}}); err != nil || st.Code != 0 {
		t.Errorf("the restored container's ballast: exit %d, %v; want its 48 MiB of x", st.Code, err)
	}
}

// containerMemory is a container's memory cgroup and the paths of its
// limit and usage files (v1's or v2's).
type containerMemory struct{ dir, limit, usage string }

// lowerToUsage sets the limit to what the container uses, and 1 MiB.
func (m containerMemory) lowerToUsage() error {
	b, err := os.ReadFile(m.usage)
	if err != nil {
		return err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return err
	}
	return os.WriteFile(m.limit, []byte(strconv.FormatInt(n+(1<<20), 10)), 0)
}

// ballastContainer starts a container on r with 48 MiB of x in its /tmp
// (the sentry's memory, under runsc), its processes first in line for
// the OOM killer.
func ballastContainer(ctx context.Context, t *testing.T, r *Runtime) (sandbox.Spec, containerMemory) {
	t.Helper()
	sp, _, m := upContainer(ctx, t, r, "head -c 48m /dev/zero | tr '\\0' x > /tmp/ballast")
	procs, _ := os.ReadFile(filepath.Join(m.dir, "cgroup.procs"))
	for _, pid := range strings.Fields(string(procs)) {
		os.WriteFile("/proc/"+pid+"/oom_score_adj", []byte("1000"), 0)
	}
	return sp, m
}

// upContainer starts a container on r, limited to 256 MiB, that runs the
// shell commands first, then says it is up and sleeps; it waits until it
// is up and returns its spec, its inspection and its memory cgroup. The
// test's end destroys it.
func upContainer(ctx context.Context, t *testing.T, r *Runtime, first string) (sandbox.Spec, container.InspectResponse, containerMemory) {
	t.Helper()
	dir := testenv.TempDir(t)
	sp := sandbox.Spec{
		ID: sandboxtest.NewID(t), Dir: "/out",
		Command: []string{"/bin/sh", "-c", first + "; touch up; while :; do sleep 1; done"},
		Mounts:  []sandbox.Mount{{Source: sandboxtest.MountSource(dir), Target: "/out"}},
		Limits:  sandbox.Limits{MemoryBytes: 256 << 20},
	}
	if _, err := r.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Destroy(context.Background(), sp.ID) })
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, "up")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the container never came up")
		}
	}
	c, err := r.inspect(ctx, sp.ID)
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := cgroups.MemoryOf("/sys/fs/cgroup", c.State.Pid)
	if err != nil {
		t.Fatal(err)
	}
	m := containerMemory{dirs[0], filepath.Join(dirs[0], "memory.limit_in_bytes"), filepath.Join(dirs[0], "memory.usage_in_bytes")}
	if _, err := os.Stat(m.limit); err != nil {
		m.limit, m.usage = filepath.Join(dirs[0], "memory.max"), filepath.Join(dirs[0], "memory.current")
	}
	return sp, c, m
}

// TestCheckpointOOMSaysSo: a container under runsc whose memory cgroup
// kills its sentry while the engine saves it (its limit lowered to what it
// uses once the save has its room, and its processes first in line for
// the OOM killer) fails its checkpoint, and the error says the memory
// limit did it, not only runsc's EOF, as the gvisor runtime's does.
func TestCheckpointOOMSaysSo(t *testing.T) {
	testenv.RequireDockerCheckpoints(t)
	r := mustNew(t, "runsc", sandboxtest.NewID(t))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sp, m := ballastContainer(ctx, t, r)
	limit, _ := os.ReadFile(m.limit)
	// Once the save has its room (roomToSave raises the limit), the limit
	// goes back down to what the container uses.
	stop := make(chan struct{})
	lowered := make(chan bool, 1)
	go func() {
		for {
			select {
			case <-stop:
				lowered <- false
				return
			default:
			}
			if now, err := os.ReadFile(m.limit); err == nil && string(now) != string(limit) {
				lowered <- m.lowerToUsage() == nil
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	err := r.Checkpoint(ctx, sp.ID, t.TempDir())
	close(stop)
	if !<-lowered {
		t.Fatal("the limit was not lowered during the save")
	}
	if err == nil || !strings.Contains(err.Error(), "its memory limit was reached while it was saved") {
		t.Errorf("checkpoint of a container OOM-killed in its save: %v, want an error naming the limit", err)
	}
}

// TestDestroyAfterTheEngineRemovedIt: a Destroy cut short after the engine
// had removed the container (its request sent, its answer not awaited:
// the conformance suite's DestroyCutShort met it once under load) leaves
// the next Destroy no container to learn the given directories from; it
// hands them back from the cut one's record before its identity goes to
// another sandbox. It released the identity with the directory still its.
func TestDestroyAfterTheEngineRemovedIt(t *testing.T) {
	testenv.RequireDocker(t)
	r := mustNew(t, "", sandboxtest.NewID(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sp, c, _ := upContainer(ctx, t, r, "true")
	trees := ownedTrees(c)
	if len(trees) == 0 {
		t.Fatal("the container was given no directory")
	}
	dir := trees[0].Dir
	if fi, err := os.Lstat(dir); err != nil || fi.Sys().(*syscall.Stat_t).Uid == uint32(os.Geteuid()) {
		t.Fatalf("the sandbox's directory before: %v, %v; want it given to the sandbox's identity", fi, err)
	}
	// What the cut Destroy did: its record, then the engine's removal.
	if err := r.writeDestroying(sp.ID, trees); err != nil {
		t.Fatal(err)
	}
	if _, err := r.cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil {
		t.Fatal(err)
	}
	if err := r.Destroy(ctx, sp.ID); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(dir); err != nil || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid()) {
		t.Errorf("the sandbox's directory after the Destroy: %v, %v; want the server's again", fi, err)
	}
	if _, err := os.Stat(r.destroyingPath(sp.ID)); !os.IsNotExist(err) {
		t.Errorf("the cut Destroy's record after the whole one: %v, want it gone", err)
	}
}
