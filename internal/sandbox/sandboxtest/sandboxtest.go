// Package sandboxtest holds the conformance suite every sandbox.Runtime runs
// (Run) and Fake, an in-memory Runtime for other packages' unit tests.
package sandboxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/testenv"
)

// Harness is what a backend gives the conformance suite.
type Harness struct {
	// Setup prepares fresh host state for one test (a state dir in
	// t.TempDir(), say) and returns a function that builds a Runtime over
	// that state. Each call builds a new instance over the same state, as
	// a restarted server would; the suite drops the old instance without
	// closing it, as a server killed with SIGKILL would.
	Setup func(t *testing.T) (newRuntime func() sandbox.Runtime)

	// MountDir returns an empty host directory the backend can mount into
	// a sandbox read-write (Create gives it to the sandbox's identity). Default: testenv.TempDir(t).
	MountDir func(t *testing.T) string

	// NoHostDirs says the runtime refuses HostDir mounts (it runs
	// sandboxes on other machines): the check expects the refusal.
	NoHostDirs bool

	// MinGrace is the shortest grace period the runtime gives a process
	// it stops, whatever Stop asks (a kubelet's is 2 s); 0: Stop's own.
	MinGrace time.Duration

	// Latency is how late the runtime may learn what its sandboxes did,
	// and how long it may take to remove one, beyond a local runtime's
	// moment: a cluster's node reports a container's exit to its API
	// server, and deletes a pod, seconds later when it is busy (a stop
	// reported after 7 s and a gVisor pod not deleted within 10 s, at a
	// load of 8 to 12), and start a sandbox's process late. The bounds on
	// Stop and Destroy, and the waits for a process's first signs, allow it.
	Latency time.Duration

	// Unisolated says the runtime runs commands on the host without
	// isolation (Fake): checks that need a read-only mount to be enforced
	// or a path to exist only inside the sandbox are skipped.
	Unisolated bool
}

// DataRoot is the data root the suite's runtimes are given: "/", so that
// any host directory can be mounted (MountSource).
const DataRoot = "/"

// MountSource is a host path as a mount's Source under DataRoot.
func MountSource(hostPath string) string { return strings.TrimPrefix(hostPath, "/") }

// Shell is the shell every suite command runs with.
const Shell = "/bin/sh"

// Run runs the conformance suite against h. Checks run in parallel and each
// takes well under a second unless it waits for a stop grace period.
func Run(t *testing.T, h Harness) {
	if h.MountDir == nil {
		h.MountDir = func(t *testing.T) string { return testenv.TempDir(t) }
	}
	s := &suite{h: h}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"ExitCodes", s.testExitCodes},
		{"ExitMessage", s.testExitMessage},
		{"ReadWriteMount", s.testReadWriteMount},
		{"ReadOnlyMount", s.testReadOnlyMount},
		{"HostDirMount", s.testHostDirMount},
		{"CreateIdempotent", s.testCreateIdempotent},
		{"WaitMany", s.testWaitMany},
		{"WaitContext", s.testWaitContext},
		{"StopTrapsTerm", s.testStopTrapsTerm},
		{"StopIgnoresTerm", s.testStopIgnoresTerm},
		{"StopProcessTree", s.testStopProcessTree},
		{"Destroy", s.testDestroy},
		{"DestroyCutShort", s.testDestroyCutShort},
		{"NotFound", s.testNotFound},
		{"InvalidSpec", s.testInvalidSpec},
		{"Recover", s.testRecover},
		{"ListByLabel", s.testListByLabel},
		{"Exec", s.testExec},
		{"PidsLimit", s.testPidsLimit},
		{"MemoryLimit", s.testMemoryLimit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t)
		})
	}
}

type suite struct{ h Harness }

// env is one test's runtime and helpers.
type env struct {
	t          *testing.T
	newRuntime func() sandbox.Runtime
	rt         sandbox.Runtime
	ctx        context.Context
	latency    time.Duration // Harness.Latency
}

func (s *suite) env(t *testing.T) *env {
	t.Helper()
	return s.envWithin(t, 30*time.Second+2*s.h.Latency)
}

// envWithin is env for a test whose runtime calls may take up to d in all.
func (s *suite) envWithin(t *testing.T, d time.Duration) *env {
	t.Helper()
	newRuntime := s.h.Setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return &env{t: t, newRuntime: newRuntime, rt: newRuntime(), ctx: ctx, latency: s.h.Latency}
}

// NewID returns a unique sandbox id for tb.
func NewID(tb testing.TB) string {
	tb.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	return "t-" + hex.EncodeToString(b)
}

// MustRecover has rt, a runtime started after the one that made sandbox
// id (the next server's), find it in its List and Recover it.
func MustRecover(ctx context.Context, tb testing.TB, rt sandbox.Runtime, id string) {
	tb.Helper()
	hs, err := rt.List(ctx, nil)
	if err != nil {
		tb.Fatal(err)
	}
	i := slices.IndexFunc(hs, func(h sandbox.Handle) bool { return h.ID == id })
	if i < 0 {
		tb.Fatalf("the next runtime does not list sandbox %s", id)
	}
	if err := rt.Recover(ctx, &hs[i]); err != nil {
		tb.Fatal(err)
	}
}

// BenchStart times Create→Wait of /bin/true on r, each sandbox destroyed
// outside the timer: a runtime's BenchmarkStart.
func BenchStart(b *testing.B, r sandbox.Runtime) {
	ctx := context.Background()
	for b.Loop() {
		id := NewID(b)
		if _, err := r.Create(ctx, sandbox.Spec{ID: id, Command: []string{"/bin/true"}}); err != nil {
			b.Fatal(err)
		}
		if es, err := r.Wait(ctx, id); err != nil || es.Code != 0 {
			b.Fatal(es, err)
		}
		b.StopTimer()
		r.Destroy(ctx, id)
		b.StartTimer()
	}
}

// spec returns a spec running script in the shell with dir mounted at /out
// as the working directory.
func (e *env) spec(script, dir string) sandbox.Spec {
	sp := sandbox.Spec{
		ID:      NewID(e.t),
		Command: []string{Shell, "-c", script},
		Labels:  map[string]string{sandbox.LabelManaged: "true"},
		Network: sandbox.NetworkNone,
	}
	if dir != "" {
		sp.Dir = "/out"
		sp.Mounts = []sandbox.Mount{{Source: MountSource(dir), Target: "/out"}}
	}
	return sp
}

// create creates spec and destroys it when the test ends.
func (e *env) create(sp sandbox.Spec) *sandbox.Handle {
	e.t.Helper()
	h, err := e.rt.Create(e.ctx, sp)
	if err != nil {
		e.t.Fatalf("Create(%s): %v", sp.ID, err)
	}
	if h.ID != sp.ID {
		e.t.Errorf("Create returned handle id %q, want %q", h.ID, sp.ID)
	}
	rt, within := e.rt, 10*time.Second+2*e.latency
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		if err := rt.Destroy(ctx, sp.ID); err != nil {
			e.t.Errorf("cleanup: Destroy(%s): %v", sp.ID, err)
		}
	})
	return h
}

func (e *env) wait(id string) sandbox.ExitStatus {
	e.t.Helper()
	es, err := e.rt.Wait(e.ctx, id)
	if err != nil {
		e.t.Fatalf("Wait(%s): %v", id, err)
	}
	return es
}

// waitFile waits until path exists on the host (a script signals that it
// has set up its traps): 10 s, and the runtime's Latency twice over (a
// gVisor pod's process started after 10 s on a node at a load of 8).
func (e *env) waitFile(path string) {
	e.t.Helper()
	limit := 10*time.Second + 2*e.latency
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.t.Fatalf("%s did not appear within %s", path, limit)
}

func (e *env) caps() sandbox.Capabilities {
	e.t.Helper()
	c, err := e.rt.Capabilities(e.ctx)
	if err != nil {
		e.t.Fatalf("Capabilities: %v", err)
	}
	if !c.Available {
		e.t.Fatalf("runtime not available: %s", c.Reason)
	}
	return c
}

func (s *suite) testExitCodes(t *testing.T) {
	e := s.env(t)
	for _, tc := range []struct {
		script string
		want   int
	}{
		{"true", 0},
		{"exit 3", 3},
		{"kill -KILL $$", 137},
	} {
		sp := e.spec(tc.script, "")
		e.create(sp)
		es := e.wait(sp.ID)
		if es.Code != tc.want {
			t.Errorf("%q: exit code %d, want %d", tc.script, es.Code, tc.want)
		}
		if es.ExitedAt.IsZero() {
			t.Errorf("%q: ExitedAt is zero", tc.script)
		}
		st, err := e.rt.Status(e.ctx, sp.ID)
		if err != nil {
			t.Fatalf("Status: %v", err)
		}
		if st.State != sandbox.StateExited || st.Exit == nil || st.Exit.Code != tc.want {
			t.Errorf("%q: Status = %+v, want exited with code %d", tc.script, st, tc.want)
		}
	}
}

// testExitMessage: a main process that fails says why in its exit
// status: what it wrote last (a Go panic's line, not the trace after it),
// made one safe line.
func (s *suite) testExitMessage(t *testing.T) {
	e := s.env(t)
	for _, tc := range []struct{ script, want string }{
		{`echo "panic: boom" >&2; echo "goroutine 1 [running]:" >&2; echo "main.main()" >&2; exit 2`, "panic: boom"},
		{`printf 'starting\n\033]52;c;AAAA\007 gave up\n' >&2; exit 3`, "]52;c;AAAA gave up"},
	} {
		sp := e.spec(tc.script, "")
		e.create(sp)
		if es := e.wait(sp.ID); es.Code == 0 || es.Message != tc.want {
			t.Errorf("%q: ExitStatus = %+v, want a failure with message %q", tc.script, es, tc.want)
		}
	}
}

func (s *suite) testReadWriteMount(t *testing.T) {
	e := s.env(t)
	dir := s.h.MountDir(t)
	sp := e.spec(`printf '%s\n' "$CORRAL_TEST" > result`, dir)
	sp.Env = []string{"CORRAL_TEST=hello from the sandbox"}
	e.create(sp)
	if es := e.wait(sp.ID); es.Code != 0 {
		t.Fatalf("exit code %d, want 0", es.Code)
	}
	got, err := os.ReadFile(filepath.Join(dir, "result"))
	if err != nil {
		t.Fatalf("read output on host: %v", err)
	}
	if string(got) != "hello from the sandbox\n" {
		t.Errorf("output = %q, want %q", got, "hello from the sandbox\n")
	}
}

// A host directory outside the data root (a workspace under an
// operator's root) is mounted read-write from its absolute path, and once
// the sandbox is destroyed all of it belongs to its owner again, a person
// (uid 1000) here.
func (s *suite) testHostDirMount(t *testing.T) {
	e := s.env(t)
	dir := s.h.MountDir(t)
	const person = 1000
	owned := os.Geteuid() == 0 && !s.h.Unisolated
	if owned {
		if err := os.Chown(dir, person, person); err != nil {
			t.Fatal(err)
		}
	}
	sp := e.spec(`echo written > result`, "")
	sp.Dir = "/out"
	sp.Mounts = []sandbox.Mount{{Source: dir, Target: "/out", HostDir: true}}
	if s.h.NoHostDirs {
		if _, err := e.rt.Create(e.ctx, sp); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Create with a host directory = %v, want ErrInvalidArgument", err)
		}
		return
	}
	e.create(sp)
	if es := e.wait(sp.ID); es.Code != 0 {
		t.Fatalf("exit code %d, want 0", es.Code)
	}
	if err := e.rt.Destroy(e.ctx, sp.ID); err != nil {
		t.Fatal(err)
	}
	result := filepath.Join(dir, "result")
	if got, err := os.ReadFile(result); err != nil || string(got) != "written\n" {
		t.Fatalf("result = %q, %v", got, err)
	}
	if !owned {
		return
	}
	for _, p := range []string{dir, result} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != person || st.Gid != person {
			t.Errorf("%s owned by %d:%d after Destroy, want the person's %d:%d", p, st.Uid, st.Gid, person, person)
		}
	}
}

func (s *suite) testReadOnlyMount(t *testing.T) {
	if s.h.Unisolated {
		t.Skip("runtime does not enforce read-only mounts")
	}
	e := s.env(t)
	in, out := s.h.MountDir(t), s.h.MountDir(t)
	if err := os.WriteFile(filepath.Join(in, "data"), []byte("input"), 0o644); err != nil {
		t.Fatal(err)
	}
	sp := e.spec(`cat /in/data > copy; if echo x > /in/written; then exit 1; fi; exit 0`, out)
	sp.Mounts = append(sp.Mounts, sandbox.Mount{Source: MountSource(in), Target: "/in", ReadOnly: true})
	e.create(sp)
	if es := e.wait(sp.ID); es.Code != 0 {
		t.Errorf("exit code %d, want 0 (write to read-only mount must fail)", es.Code)
	}
	if _, err := os.Stat(filepath.Join(in, "written")); err == nil {
		t.Errorf("sandbox wrote to a read-only mount")
	}
	if got, _ := os.ReadFile(filepath.Join(out, "copy")); string(got) != "input" {
		t.Errorf("read-only mount content seen in sandbox = %q, want %q", got, "input")
	}
}

func (s *suite) testCreateIdempotent(t *testing.T) {
	e := s.env(t)
	dir := s.h.MountDir(t)
	sp := e.spec(`echo run >> runs; sleep 0.3`, dir)
	h1 := e.create(sp)
	h2, err := e.rt.Create(e.ctx, sp)
	if err != nil {
		t.Fatalf("second Create: %v", err)
	}
	if h1.ID != h2.ID || h1.Runtime != h2.Runtime {
		t.Errorf("second Create returned %+v, want %+v", h2, h1)
	}
	e.wait(sp.ID)
	// Also after exit: the sandbox exists until destroyed.
	if _, err := e.rt.Create(e.ctx, sp); err != nil {
		t.Fatalf("Create after exit: %v", err)
	}
	e.wait(sp.ID)
	got, _ := os.ReadFile(filepath.Join(dir, "runs"))
	if string(got) != "run\n" {
		t.Errorf("main process ran %d times, want once", strings.Count(string(got), "run"))
	}
}

func (s *suite) testWaitMany(t *testing.T) {
	e := s.env(t)
	sp := e.spec(`sleep 0.2; exit 4`, "")
	e.create(sp)
	var wg sync.WaitGroup
	results := make([]sandbox.ExitStatus, 4)
	errs := make([]error, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = e.rt.Wait(e.ctx, sp.ID)
		}()
	}
	wg.Wait()
	for i := range results {
		if errs[i] != nil || results[i].Code != 4 {
			t.Errorf("concurrent Wait %d = %+v, %v; want code 4", i, results[i], errs[i])
		}
	}
	again := e.wait(sp.ID)
	if again.Code != 4 || !again.ExitedAt.Equal(results[0].ExitedAt) {
		t.Errorf("Wait after exit = %+v, want %+v", again, results[0])
	}
}

func (s *suite) testWaitContext(t *testing.T) {
	e := s.env(t)
	sp := e.spec(`sleep 100`, "")
	e.create(sp)
	ctx, cancel := context.WithTimeout(e.ctx, 50*time.Millisecond)
	defer cancel()
	_, err := e.rt.Wait(ctx, sp.ID)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait with expiring ctx = %v, want context.DeadlineExceeded", err)
	}
	if st, err := running(e.ctx, e.rt, sp.ID); err != nil || st.State != sandbox.StateRunning {
		t.Errorf("Status = %+v, %v; want running", st, err)
	}
}

// running returns sandbox id's Status once it is running. A runtime on a
// cluster reports its pod's state as the node last told the API server,
// a moment late: it gets until ctx ends, not one look; one that says
// exited meanwhile is answered at once.
func running(ctx context.Context, rt sandbox.Runtime, id string) (sandbox.Status, error) {
	for {
		st, err := rt.Status(ctx, id)
		if err != nil || st.State == sandbox.StateRunning || st.State == sandbox.StateExited || ctx.Err() != nil {
			return st, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *suite) testStopTrapsTerm(t *testing.T) {
	e := s.env(t)
	dir := s.h.MountDir(t)
	sp := e.spec(`trap 'exit 7' TERM; touch ready; while :; do sleep 0.05; done`, dir)
	e.create(sp)
	e.waitFile(filepath.Join(dir, "ready"))
	grace := 10*time.Second + 2*s.h.Latency
	start := time.Now()
	if err := e.rt.Stop(e.ctx, sp.ID, grace); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second+s.h.Latency {
		t.Errorf("Stop took %v of a %v grace; a process that exits on SIGTERM must not wait it out", d, grace)
	}
	if es := e.wait(sp.ID); es.Code != 7 {
		t.Errorf("exit code %d, want 7 (from the TERM trap)", es.Code)
	}
	if err := e.rt.Stop(e.ctx, sp.ID, time.Second); err != nil {
		t.Errorf("Stop of a stopped sandbox: %v", err)
	}
}

func (s *suite) testStopIgnoresTerm(t *testing.T) {
	e := s.env(t)
	dir := s.h.MountDir(t)
	sp := e.spec(`trap '' TERM; touch ready; while :; do sleep 0.05; done`, dir)
	e.create(sp)
	e.waitFile(filepath.Join(dir, "ready"))
	const grace = 300 * time.Millisecond
	start := time.Now()
	if err := e.rt.Stop(e.ctx, sp.ID, grace); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	// The runtime may wait longer than asked, never less.
	want := max(grace, s.h.MinGrace)
	if d := time.Since(start); d < grace || d > want+5*time.Second+s.h.Latency {
		t.Errorf("Stop took %v, want about the %v grace (%v asked)", d, want, grace)
	}
	if es := e.wait(sp.ID); es.Code != 137 {
		t.Errorf("exit code %d, want 137 (SIGKILL)", es.Code)
	}
}

func (s *suite) testStopProcessTree(t *testing.T) {
	e := s.env(t)
	dir := s.h.MountDir(t)
	// A background child that ignores SIGTERM keeps appending to a file
	// while it lives; after Stop the file must stop growing.
	sp := e.spec(`(trap '' TERM; while :; do echo x >> tick; sleep 0.02; done) & sleep 1000 & touch ready; sleep 1000`, dir)
	e.create(sp)
	e.waitFile(filepath.Join(dir, "ready"))
	e.waitFile(filepath.Join(dir, "tick"))
	if err := e.rt.Stop(e.ctx, sp.ID, 200*time.Millisecond); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	e.wait(sp.ID)
	size := func() int64 {
		fi, err := os.Stat(filepath.Join(dir, "tick"))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	before := size()
	time.Sleep(200 * time.Millisecond)
	if after := size(); after != before {
		t.Errorf("a process of the stopped sandbox still runs (tick file grew %d -> %d)", before, after)
	}
}

func (s *suite) testDestroy(t *testing.T) {
	e := s.env(t)
	sp := e.spec(`sleep 100`, "")
	if _, err := e.rt.Create(e.ctx, sp); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := e.rt.Destroy(e.ctx, sp.ID); err != nil {
		t.Fatalf("Destroy of a running sandbox: %v", err)
	}
	if err := e.rt.Destroy(e.ctx, sp.ID); err != nil {
		t.Errorf("second Destroy: %v", err)
	}
	if _, err := e.rt.Status(e.ctx, sp.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Status after Destroy = %v, want ErrNotFound", err)
	}
	hs, err := e.rt.List(e.ctx, nil)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, h := range hs {
		if h.ID == sp.ID {
			t.Errorf("List after Destroy still has %s", sp.ID)
		}
	}
	if err := e.rt.Destroy(e.ctx, NewID(t)); err != nil {
		t.Errorf("Destroy of an unknown id: %v", err)
	}
}

// testDestroyCutShort: a Destroy whose context ends part way (a server
// stopping while it destroys a task's sandbox) leaves what a later Destroy
// finishes, by this instance or a new one (the next start's reconcile):
// no error, the sandbox gone and its directory taken back.
func (s *suite) testDestroyCutShort(t *testing.T) {
	cuts := []time.Duration{time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond, 150 * time.Millisecond}
	// Each cut is a Create and two Destroys: a pod's start and deletion
	// on a busy node take up to a Latency each.
	e := s.envWithin(t, time.Duration(len(cuts))*(10*time.Second+3*s.h.Latency))
	for i, cut := range cuts {
		dir := s.h.MountDir(t)
		sp := e.spec(`sleep 100`, dir)
		if _, err := e.rt.Create(e.ctx, sp); err != nil {
			t.Fatalf("Create: %v", err)
		}
		ctx, cancel := context.WithTimeout(e.ctx, cut)
		err := e.rt.Destroy(ctx, sp.ID)
		cancel()
		t.Logf("Destroy cut after %s: %v", cut, err)
		if err == nil {
			// It says it is done: then it is.
			if _, err := e.rt.Status(e.ctx, sp.ID); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("Status after a Destroy cut after %s answered nil = %v, want ErrNotFound", cut, err)
			}
		}
		rt := e.rt
		if i%2 == 1 {
			rt = e.newRuntime()
		}
		if err := rt.Destroy(e.ctx, sp.ID); err != nil {
			t.Errorf("Destroy after one cut after %s: %v", cut, err)
		}
		if _, err := rt.Status(e.ctx, sp.ID); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Status after a Destroy cut after %s, then a whole one = %v, want ErrNotFound", cut, err)
		}
		if fi, err := os.Lstat(dir); err != nil {
			t.Error(err)
		} else if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != uint32(os.Geteuid()) {
			t.Errorf("the sandbox's directory is uid %d's after a Destroy cut after %s, then a whole one, want the server's (%d) again", uid, cut, os.Geteuid())
		}
	}
}

func (s *suite) testNotFound(t *testing.T) {
	e := s.env(t)
	id := NewID(t)
	if _, err := e.rt.Wait(e.ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Wait = %v, want ErrNotFound", err)
	}
	if _, err := e.rt.Status(e.ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Status = %v, want ErrNotFound", err)
	}
	if err := e.rt.Stop(e.ctx, id, time.Second); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stop = %v, want ErrNotFound", err)
	}
	if _, err := e.rt.Exec(e.ctx, id, sandbox.ExecRequest{Command: []string{"true"}}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Exec = %v, want ErrNotFound", err)
	}
}

func (s *suite) testInvalidSpec(t *testing.T) {
	e := s.env(t)
	for name, sp := range map[string]sandbox.Spec{
		"empty id":       {Command: []string{"true"}},
		"uppercase id":   {ID: "Bad-ID", Command: []string{"true"}},
		"no command":     {ID: NewID(t)},
		"relative mount": {ID: NewID(t), Command: []string{"true"}, Mounts: []sandbox.Mount{{Source: MountSource(t.TempDir()), Target: "out"}}},
	} {
		if _, err := e.rt.Create(e.ctx, sp); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: Create = %v, want ErrInvalidArgument", name, err)
			e.rt.Destroy(e.ctx, sp.ID)
		}
	}
}

func (s *suite) testRecover(t *testing.T) {
	e := s.env(t)
	dir := s.h.MountDir(t)
	sp := e.spec(`touch ready; while [ ! -e stop ]; do sleep 0.02; done; exit 5`, dir)
	sp.Labels["corral.test"] = "recover"
	h := e.create(sp)
	e.waitFile(filepath.Join(dir, "ready"))

	// The first instance is dropped while the sandbox runs.
	e.rt = e.newRuntime()
	hs, err := e.rt.List(e.ctx, map[string]string{"corral.test": "recover"})
	if err != nil || len(hs) != 1 || hs[0].ID != sp.ID {
		t.Fatalf("List after restart = %+v, %v; want the one sandbox", hs, err)
	}
	if err := e.rt.Recover(e.ctx, &hs[0]); err != nil {
		t.Fatalf("Recover from List's handle: %v", err)
	}
	if err := e.rt.Recover(e.ctx, h); err != nil {
		t.Fatalf("Recover from Create's handle: %v", err)
	}
	if st, err := running(e.ctx, e.rt, sp.ID); err != nil || st.State != sandbox.StateRunning {
		t.Fatalf("Status after Recover = %+v, %v; want running", st, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if es := e.wait(sp.ID); es.Code != 5 {
		t.Errorf("exit code after Recover = %d, want 5", es.Code)
	}
	if err := e.rt.Destroy(e.ctx, sp.ID); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if err := e.newRuntime().Recover(e.ctx, h); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Recover of a destroyed sandbox = %v, want ErrNotFound", err)
	}
}

func (s *suite) testListByLabel(t *testing.T) {
	e := s.env(t)
	run := NewID(t)
	var ids []string
	for _, group := range []string{"a", "a", "b"} {
		sp := e.spec(`sleep 100`, "")
		sp.Labels["corral.test-run"] = run
		sp.Labels["corral.test-group"] = group
		e.create(sp)
		ids = append(ids, sp.ID)
	}
	list := func(sel map[string]string) []string {
		hs, err := e.rt.List(e.ctx, sel)
		if err != nil {
			t.Fatalf("List(%v): %v", sel, err)
		}
		var got []string
		for _, h := range hs {
			if sel["corral.test-run"] != "" || slices.Contains(ids, h.ID) {
				got = append(got, h.ID)
			}
		}
		slices.Sort(got)
		return got
	}
	want := func(ids ...string) []string { return slices.Sorted(slices.Values(ids)) }
	if got := list(map[string]string{"corral.test-run": run, "corral.test-group": "a"}); !slices.Equal(got, want(ids[0], ids[1])) {
		t.Errorf("List(group a) = %v, want %v", got, want(ids[0], ids[1]))
	}
	if got := list(map[string]string{"corral.test-run": run}); !slices.Equal(got, want(ids...)) {
		t.Errorf("List(run) = %v, want %v", got, want(ids...))
	}
	if got := list(nil); !slices.Equal(got, want(ids...)) {
		t.Errorf("List(nil) = %v, want all of %v", got, want(ids...))
	}
	if got := list(map[string]string{"corral.test-run": "no-such-run"}); len(got) != 0 {
		t.Errorf("List(no match) = %v, want none", got)
	}
}

func (s *suite) testExec(t *testing.T) {
	e := s.env(t)
	if !e.caps().Exec {
		t.Skip("runtime does not support Exec")
	}
	dir := s.h.MountDir(t)
	sp := e.spec(`sleep 100`, dir)
	e.create(sp)
	ExecTable(t, func(ctx context.Context, argv []string, dir string, env []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
		es, err := e.rt.Exec(ctx, sp.ID, sandbox.ExecRequest{Command: argv, Dir: dir, Env: env, Stdin: stdin, Stdout: stdout, Stderr: stderr})
		return es.Code, err
	}, "/out", dir)
	if err := e.rt.Stop(e.ctx, sp.ID, 0); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	e.wait(sp.ID)
	if _, err := e.rt.Exec(e.ctx, sp.ID, sandbox.ExecRequest{Command: []string{"true"}}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Exec in an exited sandbox = %v, want ErrFailedPrecondition", err)
	}
}

func (s *suite) testPidsLimit(t *testing.T) {
	e := s.env(t)
	if c := e.caps(); !c.Limits || c.NoPidsLimit {
		t.Skip("runtime does not enforce a pids limit")
	}
	dir := s.h.MountDir(t)
	sp := e.spec(`n=0; while [ $n -lt 64 ]; do sleep 10 & n=$((n+1)); done; touch forked-all`, dir)
	sp.Limits.Pids = 16
	e.create(sp)
	es := e.wait(sp.ID)
	if _, err := os.Stat(filepath.Join(dir, "forked-all")); err == nil || es.Code == 0 {
		t.Errorf("64 forks succeeded under a limit of 16 pids (exit %d)", es.Code)
	}
}

func (s *suite) testMemoryLimit(t *testing.T) {
	// Not the suite's 30 s: the bomb is slow under gVisor. dash reads a
	// command substitution 128 bytes at a time, and the sentry and gofer
	// hold about 17 of the 32 MiB, so the limit comes after some 120,000
	// reads, each a system call the ptrace platform traps: 20 to 22
	// CPU-seconds of the sandbox, its memory growing steadily by about
	// 0.7 MiB per CPU-second, never throttled (measured at a load of 15 on
	// 2 cores). A busy host gives the sandbox a fraction of a core, and
	// the wait what those CPU-seconds then take: the gVisor suite run with
	// the local one on such a host ran out of 30 s.
	e := s.envWithin(t, 3*time.Minute)
	if !e.caps().Limits {
		t.Skip("runtime does not enforce limits")
	}
	// The shell holds the whole command substitution in memory: 256 MiB
	// under a 32 MiB limit. It first sleeps a second: containerd's runc
	// shim before 2.2 watches a container's memory cgroup for OOM kills
	// only once its start call returns (containerd issue 8180), so an
	// OOM kill in a container's first moments goes unreported under
	// docker and kubernetes, and the container ends "Error", code 137.
	sp := e.spec(`sleep 1; x=$(head -c 268435456 /dev/zero | tr '\0' a); echo ${#x}`, "")
	sp.Limits.MemoryBytes = 32 << 20
	e.create(sp)
	es := e.wait(sp.ID)
	if !es.OOMKilled || es.Code == 0 {
		t.Errorf("ExitStatus = %+v, want OOMKilled with a non-zero code", es)
	}
	st, err := e.rt.Status(e.ctx, sp.ID)
	if err != nil || st.Exit == nil || !st.Exit.OOMKilled {
		t.Errorf("Status = %+v, %v; want Exit.OOMKilled", st, err)
	}
}

// The environment of ServerDeath's helper process.
const (
	envHelperState = "CORRAL_SANDBOXTEST_SERVER_STATE"
	envHelperDir   = "CORRAL_SANDBOXTEST_SERVER_DIR"
	envHelperID    = "CORRAL_SANDBOXTEST_SERVER_ID"
)

// ServerDeath checks that a sandbox outlives the server that created it. A
// helper process (this test binary, run again for the calling test alone)
// creates a sandbox with newRuntime and is killed with SIGKILL once Create
// has returned; this process then builds a new Runtime over the same state,
// finds the sandbox with List, recovers it, sees it running and sees it end
// with its own exit code. setup, run in this process only, returns state,
// what both processes give newRuntime (a host path for the runtime's state,
// say), and dir, a host directory the sandbox gets read-write: the helper
// makes nothing of its own that its SIGKILL would leave behind.
// In the helper process ServerDeath creates the sandbox and never returns.
func ServerDeath(t *testing.T, setup func(t *testing.T) (state, dir string), newRuntime func(tb testing.TB, state string) sandbox.Runtime) {
	if s := os.Getenv(envHelperState); s != "" {
		serverDeathHelper(t, newRuntime(t, s), os.Getenv(envHelperDir), os.Getenv(envHelperID))
		return
	}
	state, dir := setup(t)
	id := NewID(t)
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.v")
	cmd.Env = append(os.Environ(), envHelperState+"="+state, envHelperDir+"="+dir, envHelperID+"="+id)
	var out testenv.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		// The sandbox runs (it wrote ready) and Create returned (the helper
		// wrote created): the sandbox's command can run before Create has
		// recorded it, and a server killed in between leaves nothing for
		// List (the scheduler then destroys the sandbox by its id).
		_, rerr := os.Stat(filepath.Join(dir, "ready"))
		_, cerr := os.Stat(filepath.Join(dir, "created"))
		if rerr == nil && cerr == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("helper did not start the sandbox: %s", out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cmd.Process.Kill() // the "server" dies with SIGKILL
	cmd.Wait()

	r := newRuntime(t, state)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t.Cleanup(func() { r.Destroy(context.Background(), id) })
	hs, err := r.List(ctx, map[string]string{sandbox.LabelManaged: "true", "test": id})
	if err != nil || len(hs) != 1 {
		t.Fatalf("List after server death = %v, %v; want one sandbox", hs, err)
	}
	if err := r.Recover(ctx, &hs[0]); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if st, err := running(ctx, r, id); err != nil || st.State != sandbox.StateRunning {
		t.Fatalf("Status = %+v, %v; want running after the server died", st, err)
	}
	os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644)
	es, err := r.Wait(ctx, id)
	if err != nil || es.Code != 9 {
		t.Errorf("Wait = %+v, %v; want code 9", es, err)
	}
}

// serverDeathHelper is ServerDeath's "server": it creates the sandbox,
// says so, and waits to be killed.
func serverDeathHelper(t *testing.T, r sandbox.Runtime, dir, id string) {
	_, err := r.Create(context.Background(), sandbox.Spec{
		ID: id, Command: []string{Shell, "-c", `touch ready; while [ ! -e stop ]; do sleep 0.02; done; exit 9`},
		Dir: "/out", Mounts: []sandbox.Mount{{Source: MountSource(dir), Target: "/out"}},
		Labels: map[string]string{sandbox.LabelManaged: "true", "test": id},
	})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "created"), nil, 0o644)
	time.Sleep(2 * time.Minute) // killed by the parent test
	t.Fatal("not killed by the parent test")
}

// KilledAt runs this test binary again for the test named run alone, with
// env added, and waits up to 60 s for it to die of SIGKILL, as a helper
// that kills itself at crash point does; anything else fails tb with the
// helper's output.
func KilledAt(tb testing.TB, run, point string, env ...string) {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$", "-test.v")
	cmd.Env = append(os.Environ(), env...)
	var out testenv.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			tb.Fatalf("the helper ended with %v, not killed at %s: %s", err, point, out.String())
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		tb.Fatalf("the helper never reached %s: %s", point, out.String())
	}
}

// KillAt is a runtime's Options.Crash for KilledAt's helper: at point it
// kills this process with SIGKILL, as the server's hook does.
func KillAt(point string) func(string) {
	return func(p string) {
		if p == point {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
}

// The host runtimes' crash tests (TestCrashPoints): a task's command, run
// cold, marks /out/ran and exits 7; a warm sandbox's main process does
// what the worker does (workercmd.RunWarm): nothing if its pipe closes
// empty, else it acknowledges the start on warmstart.AckFD, closes it,
// and runs the task's command (here, the same).
const (
	CrashTaskScript = `touch /out/ran; exit 7`
	CrashWarmScript = `s=$(cat <&5); [ -n "$s" ] || exit 0; echo started >&6; exec 6>&-; ` + CrashTaskScript
)

// CrashSpec is the spec of a crash test's task id: its directory under
// tasks at /out, running CrashTaskScript, labelled test=id.
func CrashSpec(tasks, id string) sandbox.Spec {
	return sandbox.Spec{ID: id, Command: []string{Shell, "-c", CrashTaskScript}, Dir: "/out",
		Mounts:  []sandbox.Mount{{Source: MountSource(filepath.Join(tasks, id)), Target: "/out"}},
		Network: sandbox.NetworkNone, Labels: map[string]string{sandbox.LabelManaged: "true", "test": id}}
}

// WarmRuntime is a Runtime that keeps sandboxes warm.
type WarmRuntime interface {
	sandbox.Runtime
	sandbox.Warmer
}

// CreateUntilKilled is a crash test's helper "server": it creates task
// id's sandbox (CrashSpec) in r, whose Options.Crash is KillAt(point),
// from a warm pool of one when point is a claim's, and fails tb if Create
// returns without killing it.
func CreateUntilKilled(tb testing.TB, r WarmRuntime, point, tasks, id string) {
	if slices.Contains([]string{sandbox.CrashClaimed, sandbox.CrashMoved, sandbox.CrashHandedOver, sandbox.CrashSent}, point) {
		shape := sandbox.WarmShape{Name: "test", Template: sandbox.Spec{
			Command: []string{Shell, "-c", CrashWarmScript},
			Dir:     "/out",
			Mounts:  []sandbox.Mount{{Source: MountSource(tasks) + "/" + sandbox.WarmTaskID, Target: "/out"}},
			Network: sandbox.NetworkNone,
		}}
		go r.KeepWarm(context.Background(), sandbox.WarmPolicy{Size: 1, Shapes: []sandbox.WarmShape{shape}})
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if st := r.WarmStats(); len(st) == 1 && st[0].Ready == 1 {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("warm pool: %+v, want 1 ready", r.WarmStats())
			}
		}
	}
	if _, err := r.Create(context.Background(), CrashSpec(tasks, id)); err != nil {
		tb.Fatal(err)
	}
	tb.Fatalf("Create returned without passing %s", point)
}

// WarmShapeOver is a warm test shape over tasksDir: its one per-task
// mount is the task's directory there at /out, and its main process runs
// script with /bin/sh, with no network.
func WarmShapeOver(tasksDir, script string) sandbox.WarmShape {
	return sandbox.WarmShape{Name: "test", Template: sandbox.Spec{
		Command: []string{Shell, "-c", script},
		Dir:     "/out",
		Mounts:  []sandbox.Mount{{Source: MountSource(tasksDir) + "/" + sandbox.WarmTaskID, Target: "/out"}},
		Network: sandbox.NetworkNone,
	}}
}

// KeepWarm keeps r's pools of p until stop, or the test's end. It does
// not wait for them to fill (WaitWarm).
func KeepWarm(tb testing.TB, r sandbox.Warmer, p sandbox.WarmPolicy) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.KeepWarm(ctx, p) }()
	stop = func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("KeepWarm: %v", err)
		}
	}
	tb.Cleanup(func() {
		if ctx.Err() == nil {
			stop()
		}
	})
	return stop
}

// WaitWarm waits up to within until r keeps one pool whose stats are ok,
// and fails tb, saying what it waited for, if it never does.
func WaitWarm(tb testing.TB, r sandbox.Warmer, within time.Duration, what string, ok func(sandbox.WarmStats) bool) {
	tb.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(5 * time.Millisecond) {
		st := r.WarmStats()
		if len(st) == 1 && ok(st[0]) {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("warm pool: %+v, want %s", st, what)
		}
	}
}
