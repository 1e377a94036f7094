//go:build linux

package gvisor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/testenv"
)

// corralBin is the corral binary TestMain built; corral-worker, which a
// restore's launcher runs under (Options.Subreaper), is beside it.
var corralBin string

func TestMain(m *testing.M) {
	// In a sandbox, as TestHelperDial or TestHelperSeccomp: nothing to
	// build, and no go to build it with.
	if os.Getenv("CORRAL_GVISOR_DIAL") != "" || os.Getenv("CORRAL_GVISOR_SECCOMP") != "" {
		os.Exit(m.Run())
	}
	testenv.MainWithCorral(m, &corralBin)
}

// MustNew returns a Runtime over a fresh state dir, with cgroups under a
// parent unique to this package's tests and the subreaper the server
// gives it, and a function that builds another instance over the same
// state (a restarted server). mods change the options.
func MustNew(tb testing.TB, mods ...func(*Options)) (*Runtime, func() *Runtime) {
	tb.Helper()
	testenv.RequireRunsc(tb)
	opts := Options{DataRoot: sandboxtest.DataRoot, StateDir: filepath.Join(tb.TempDir(), "state"), CgroupParent: "corral-gvisor-test",
		Subreaper: filepath.Join(filepath.Dir(corralBin), "corral-worker")}
	for _, mod := range mods {
		mod(&opts)
	}
	newRuntime := func() *Runtime {
		r, err := New(opts, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			tb.Fatalf("New: %v", err)
		}
		return r
	}
	return newRuntime(), newRuntime
}

// mountDir is a host directory the sandbox user can read: t.TempDir() is
// 0700 and owned by root, and gVisor checks the host's owners and modes.
// (Read-write mounts are given to the sandbox user by Create.)
func mountDir(t *testing.T) string {
	d := t.TempDir()
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestConformance(t *testing.T) {
	testenv.RequireRunsc(t)
	sandboxtest.Run(t, sandboxtest.Harness{
		Setup: func(t *testing.T) func() sandbox.Runtime {
			_, newRuntime := MustNew(t)
			return func() sandbox.Runtime { return newRuntime() }
		},
		MountDir: mountDir,
	})
}

// TestConformanceSystrap runs the suite on a runsc of 2025 with the
// systrap platform, which a server picks where its runsc has it; the rest
// of this package's tests use Debian's runsc (ptrace). What differs
// between the two inside the sandbox is said in seccomp.go.
func TestConformanceSystrap(t *testing.T) {
	runsc := testenv.RequireSystrapRunsc(t)
	if p := DefaultPlatform(runsc); p != "systrap" {
		t.Fatalf("DefaultPlatform(%s) = %q, want systrap", runsc, p)
	}
	sandboxtest.Run(t, sandboxtest.Harness{
		Setup: func(t *testing.T) func() sandbox.Runtime {
			_, newRuntime := MustNew(t, func(o *Options) { o.Runsc = runsc })
			return func() sandbox.Runtime { return newRuntime() }
		},
		MountDir: mountDir,
	})
}

// TestDefaultPlatform: systrap where runsc lists it, else ptrace, also
// when runsc cannot be run.
func TestDefaultPlatform(t *testing.T) {
	dir := t.TempDir()
	fake := func(name, platforms string) string {
		p := filepath.Join(dir, name)
		script := "#!/bin/sh\n[ \"$1 $2\" = \"help platforms\" ] || exit 2\nprintf '" + platforms + "'\n"
		if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct{ runsc, want string }{
		{fake("debian", `kvm\nptrace\n`), "ptrace"},
		{fake("new", `ptrace\nkvm\nsystrap\n`), "systrap"},
		{fake("systrapper", `systrapper\n`), "ptrace"},
		{filepath.Join(dir, "none"), "ptrace"},
	} {
		if got := DefaultPlatform(tc.runsc); got != tc.want {
			t.Errorf("DefaultPlatform(%s) = %q, want %q", filepath.Base(tc.runsc), got, tc.want)
		}
	}
	_, err := New(Options{DataRoot: sandboxtest.DataRoot, StateDir: t.TempDir(), Platform: "xen", DisableCgroups: true}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("New with platform xen = %v, want ErrInvalidArgument", err)
	}
}

// run creates a sandbox running script with a fresh directory at /out as
// its working directory, waits for it, and returns its exit status and the
// content of /out/out.
func run(t *testing.T, r *Runtime, script string, mod func(*sandbox.Spec)) (sandbox.ExitStatus, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := mountDir(t)
	sp := sandbox.Spec{ID: sandboxtest.NewID(t), Command: []string{"/bin/sh", "-c", script}, Dir: "/out",
		Mounts: []sandbox.Mount{{Source: sandboxtest.MountSource(dir), Target: "/out"}}}
	if mod != nil {
		mod(&sp)
	}
	if _, err := r.Create(ctx, sp); err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { r.Destroy(context.Background(), sp.ID) })
	es, err := r.Wait(ctx, sp.ID)
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	out, _ := os.ReadFile(filepath.Join(dir, "out"))
	return es, string(out)
}

// TestCreateCancelledLeavesNothing: a Create whose context ends while
// runsc starts the sandbox (a server stopping while its warm pool fills)
// leaves nothing in runsc's root. Before, a start cut short left runsc's
// record of the container (its lock file, when runsc run was killed before
// it wrote the state), which nothing cleared for an id never created
// again. The deadlines span runsc's start, so some cut it in the middle.
func TestCreateCancelledLeavesNothing(t *testing.T) {
	r, _ := MustNew(t)
	// The probe first, uncut: Create probes when nothing has, and a
	// probe cut short answers "unavailable" before runsc starts.
	if caps, err := r.Capabilities(context.Background()); err != nil || !caps.Available {
		t.Fatalf("Capabilities: %+v, %v", caps, err)
	}
	failed := 0
	for _, d := range []time.Duration{20, 50, 80, 120, 170, 250, 350, 500} {
		ctx, cancel := context.WithTimeout(context.Background(), d*time.Millisecond)
		sp := sandbox.Spec{ID: sandboxtest.NewID(t), Command: []string{"/bin/sh", "-c", "sleep 100"}}
		_, err := r.Create(ctx, sp)
		cancel()
		if err == nil {
			if err := r.Destroy(context.Background(), sp.ID); err != nil {
				t.Fatalf("Destroy: %v", err)
			}
			continue
		}
		failed++
		t.Logf("cut after %v: %v", d*time.Millisecond, err)
		if r.runscKnows(sp.ID) {
			t.Errorf("Create cut after %v (%v): runsc's root still holds %s", d*time.Millisecond, err, sp.ID)
		}
	}
	t.Logf("%d of 8 Creates cut short", failed)
}

// TestDestroyCancelledLeavesNothing: a Destroy cut short (a server
// stopping while it destroys a task's sandbox) either says so, leaving
// what a later Destroy finishes, or is done: runsc's root holds nothing of
// the sandbox once a Destroy has answered nil.
func TestDestroyCancelledLeavesNothing(t *testing.T) {
	r, _ := MustNew(t)
	for _, d := range []time.Duration{1, 5, 10, 20, 40, 80, 150} {
		sp := sandbox.Spec{ID: sandboxtest.NewID(t), Command: []string{"/bin/sh", "-c", "sleep 100"}}
		if _, err := r.Create(context.Background(), sp); err != nil {
			t.Fatalf("Create: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), d*time.Millisecond)
		err := r.Destroy(ctx, sp.ID)
		cancel()
		t.Logf("cut after %v: %v", d*time.Millisecond, err)
		if err != nil {
			if err := r.Destroy(context.Background(), sp.ID); err != nil {
				t.Fatalf("Destroy after one cut after %v: %v", d*time.Millisecond, err)
			}
		}
		if r.runscKnows(sp.ID) {
			t.Errorf("Destroy cut after %v answered %v, then: runsc's root still holds %s", d*time.Millisecond, err, sp.ID)
		}
	}
}

func TestIsolation(t *testing.T) {
	r, _ := MustNew(t)
	for _, tc := range []struct {
		name, script, want string
	}{
		// Its own uid of the range above the reserved one, the sandboxes'
		// group.
		{"uid", `u=$(id -u); [ "$u" -gt 1900000000 ] && [ "$u" -le 1900065535 ] && echo own > out; id -g >> out; id -un >> out`, "own\n1900000000\nworker\n"},
		{"no capabilities", `grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status | tr -s '\t' ' ' > out`, "CapPrm: 0000000000000000\nCapEff: 0000000000000000\nCapBnd: 0000000000000000\n"},
		{"loopback only", `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' > out`, "lo\n"},
		{"hostname", `hostname > out`, "corral\n"},
		{"worker in passwd", `grep -c "^worker:x:$(id -u):1900000000:" /etc/passwd > out`, "1\n"},
		{"read-only root", `if touch /x 2>/dev/null || touch /usr/x 2>/dev/null || touch /etc/x 2>/dev/null; then echo writable > out; else echo ro > out; fi`, "ro\n"},
		{"tmp writable", `echo ok > /tmp/f && cat /tmp/f > out`, "ok\n"},
		{"env cleared", `env | grep -c CORRAL_HOST_SECRET > out`, "0\n"},
		// The shell, its subshell and ls: nothing of the host.
		{"host processes invisible", `n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; [ "$n" -ge 1 ] && [ "$n" -le 4 ] && echo few > out || echo "$n" > out`, "few\n"},
		{"pids rlimit", `ulimit -p > out`, "unlimited\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CORRAL_HOST_SECRET", "x")
			_, out := run(t, r, tc.script, nil)
			if tc.want == "" {
				if strings.TrimSpace(out) == "" || strings.TrimSpace(out) == "0" {
					t.Errorf("got %q, want a non-zero count", out)
				}
				return
			}
			if out != tc.want {
				t.Errorf("got %q, want %q", out, tc.want)
			}
		})
	}
}

func TestPidsRlimit(t *testing.T) {
	r, _ := MustNew(t)
	_, out := run(t, r, `ulimit -p > out`, func(sp *sandbox.Spec) { sp.Limits.Pids = 40 })
	if out != "40\n" {
		t.Errorf("ulimit -p = %q, want 40", out)
	}
}

// TestSecretsStayInBundle checks that Spec.Env reaches the process and is
// written nowhere in the state dir but the bundle's config.json, which only
// root can read.
func TestSecretsStayInBundle(t *testing.T) {
	r, _ := MustNew(t)
	const secret = "sk-corral-test-8c1e5b"
	var id string
	es, out := run(t, r, `printf '%s' "$API_KEY" > out`, func(sp *sandbox.Spec) {
		sp.Env = []string{"API_KEY=" + secret}
		id = sp.ID
	})
	if es.Code != 0 || out != secret {
		t.Fatalf("exit %d, out %q; want the key in the environment", es.Code, out)
	}
	dir := r.Dir.Path(id)
	err := filepath.WalkDir(r.opts.StateDir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Type()&os.ModeType != 0 {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		if bytes.Contains(b, []byte(secret)) && p != filepath.Join(dir, "bundle", "config.json") {
			t.Errorf("secret found in %s", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "bundle", "config.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("config.json: %v, mode %v; want 0600", err, fi.Mode())
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("state dir: %v, mode %v; want 0700", err, fi.Mode())
	}
}

// TestHostUnixSocket is the path the completion webhook and the egress
// relay take: a process in the sandbox connects to a unix socket the host
// listens on, in a directory mounted read-only. The client is this test
// binary, mounted into the sandbox (TestHelperDial).
func TestHostUnixSocket(t *testing.T) {
	r, _ := MustNew(t)
	sockDir := mountDir(t)
	sock := filepath.Join(sockDir, "corral.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- "accept: " + err.Error()
			return
		}
		defer c.Close()
		line, _ := bufio.NewReader(c).ReadString('\n')
		fmt.Fprintf(c, "ack %s", line)
		got <- line
	}()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	es, out := run(t, r, `/run/probe/client -test.run='^TestHelperDial$' > out 2>&1`, func(sp *sandbox.Spec) {
		sp.Env = []string{"CORRAL_GVISOR_DIAL=/run/corral/sock/corral.sock"}
		sp.Mounts = append(sp.Mounts,
			sandbox.Mount{Source: sandboxtest.MountSource(sockDir), Target: "/run/corral/sock", ReadOnly: true},
			sandbox.Mount{Source: sandboxtest.MountSource(self), Target: "/run/probe/client", ReadOnly: true})
	})
	if es.Code != 0 || !strings.Contains(out, "reply: ack hello from the sandbox") {
		t.Fatalf("client exit %d, output %q; want the host's reply", es.Code, out)
	}
	select {
	case line := <-got:
		if line != "hello from the sandbox\n" {
			t.Errorf("host got %q", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("host got no connection")
	}
}

// TestHelperDial runs inside the sandbox for TestHostUnixSocket.
func TestHelperDial(t *testing.T) {
	path := os.Getenv("CORRAL_GVISOR_DIAL")
	if path == "" {
		t.Skip("helper for TestHostUnixSocket")
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	fmt.Fprintf(c, "hello from the sandbox\n")
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && line == "" {
		t.Fatalf("read: %v", err)
	}
	fmt.Printf("reply: %s\n", line)
}

// TestSurvivesServerDeath runs a sandbox from a child process that is
// killed with SIGKILL, then recovers it from this process.
func TestSurvivesServerDeath(t *testing.T) {
	testenv.RequireRunsc(t)
	setup := func(t *testing.T) (string, string) { return filepath.Join(t.TempDir(), "state"), mountDir(t) }
	sandboxtest.ServerDeath(t, setup, func(tb testing.TB, state string) sandbox.Runtime {
		r, err := New(Options{DataRoot: sandboxtest.DataRoot, StateDir: state, CgroupParent: "corral-gvisor-test"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			tb.Fatal(err)
		}
		return r
	})
}

func TestCapabilities(t *testing.T) {
	r, _ := MustNew(t)
	c, err := r.Capabilities(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !c.Available || !strings.HasPrefix(c.Version, "gVisor runsc version") || !c.Exec || !c.Network {
		t.Errorf("Capabilities = %+v, want available runsc with exec and network isolation", c)
	}
	if want := ", platform " + DefaultPlatform("runsc"); !strings.HasSuffix(c.Version, want) {
		t.Errorf("Capabilities.Version = %q, want it to end with %q", c.Version, want)
	}
	if !c.Limits {
		t.Errorf("Capabilities.Limits = false as root: %v", c.Warnings)
	}
}

func TestCapabilitiesNoRunsc(t *testing.T) {
	r, err := New(Options{DataRoot: sandboxtest.DataRoot, StateDir: t.TempDir(), Runsc: "/nonexistent/runsc", DisableCgroups: true}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := r.Capabilities(context.Background())
	if c.Available || !strings.Contains(c.Reason, "apt-get install -y runsc") || c.Limits {
		t.Errorf("Capabilities = %+v, want unavailable with an install hint", c)
	}
	if _, err := r.Create(context.Background(), sandbox.Spec{ID: "x", Command: []string{"true"}}); err == nil {
		t.Errorf("Create without runsc succeeded")
	}
}

// BenchmarkStart times Create→Wait of /bin/true through the runtime
// (`corral bench --gvisor` runs a bare `runsc run` beside a task).
func BenchmarkStart(b *testing.B) {
	r, _ := MustNew(b)
	b.Run("runtime", func(b *testing.B) { sandboxtest.BenchStart(b, r) })
}

// TestCheckpointRestore: a checkpointed sandbox holds nothing on the host
// but its identity's lease, and comes back restored with its memory (a
// counter kept in its /tmp, which is the sentry's), its processes (the
// loop that counts) and its mount, its main process told by SIGCONT; on
// Debian's runsc (ptrace) and on a runsc of 2025 (systrap), which saves
// the memory uncompressed (its pages in a file of their own) and restores
// it in the background.
func TestCheckpointRestore(t *testing.T) {
	t.Run("debian", func(t *testing.T) {
		testenv.RequireRunsc(t)
		checkpointRestore(t, "runsc", false)
	})
	t.Run("systrap", func(t *testing.T) { checkpointRestore(t, testenv.RequireSystrapRunsc(t), true) })
}

func checkpointRestore(t *testing.T, runsc string, uncompressed bool) {
	r, _ := MustNew(t, func(o *Options) { o.Runsc = runsc })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := mountDir(t)
	sp := sandbox.Spec{ID: sandboxtest.NewID(t), Dir: "/out",
		Command: []string{"/bin/sh", "-c", `trap 'echo woke >> /out/woke' CONT; i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.05; done`},
		Mounts:  []sandbox.Mount{{Source: sandboxtest.MountSource(dir), Target: "/out"}},
		Limits:  sandbox.Limits{MemoryBytes: 256 << 20, Pids: 64}}
	if _, err := r.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Destroy(context.Background(), sp.ID) })
	count := func() int {
		t.Helper()
		var out bytes.Buffer
		if _, err := r.Exec(ctx, sp.ID, sandbox.ExecRequest{Command: []string{"/bin/cat", "/tmp/c"}, Stdout: &out}); err != nil {
			t.Fatal(err)
		}
		var n int
		fmt.Sscan(out.String(), &n)
		return n
	}
	for count() < 5 {
		time.Sleep(50 * time.Millisecond)
	}
	e, err := r.Lookup(sp.ID)
	if err != nil {
		t.Fatal(err)
	}
	who := e.St.Identity
	before := count()
	image := checkpointDir(t)
	if err := r.Checkpoint(ctx, sp.ID, image); err != nil {
		t.Fatal(err)
	}
	if hs, _ := r.List(ctx, nil); len(hs) != 0 {
		t.Errorf("a checkpointed sandbox is listed: %+v", hs)
	}
	if _, err := os.Stat(filepath.Join(image, "pages.img")); (err == nil) != uncompressed {
		t.Errorf("the image's pages in a file of their own (uncompressed): %v, want %v", err == nil, uncompressed)
	}
	if uncompressed {
		if pages, cached := pageCache(t, filepath.Join(image, "pages.img")); pages == 0 || cached > 0 {
			t.Errorf("the image's pages file: %d of its %d pages in the page cache, want none (written with O_DIRECT)", cached, pages)
		}
	}
	if procs := processesOf(t, who.UID); len(procs) > 0 {
		t.Errorf("processes of the sandbox's identity %s after its checkpoint: %v", who, procs)
	}
	if b, err := os.ReadFile(filepath.Join(r.opts.StateDir, "identities", fmt.Sprint(who.UID))); err != nil || string(b) != sp.ID {
		t.Errorf("the identity's lease after the checkpoint: %q, %v", b, err)
	}
	if _, err := r.Restore(ctx, sp, image); err != nil {
		t.Fatal(err)
	}
	if e, err := r.Lookup(sp.ID); err != nil || e.St.Identity != who {
		t.Fatalf("restored as %+v (%v), checkpointed as %s", e, err, who)
	}
	after := count()
	if after < before || after > before+20 {
		t.Errorf("the counter went from %d to %d over the checkpoint: not the same memory", before, after)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join(dir, "woke"))
		if string(b) == "woke\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the main process was not sent SIGCONT once restored: %q", b)
		}
	}
	// runsc restore leaves its gofer an orphan when the sandbox ends; the
	// launcher, a subreaper, adopts and reaps it before it exits, so none
	// is left for the host's init to reap (runsc delete, a checkpoint's
	// last step, would wait for that: seconds on some hosts).
	gofer := goferPID(t, r, sp.ID)
	if err := r.Stop(ctx, sp.ID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Wait(ctx, sp.ID); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", gofer)); err == nil {
		t.Errorf("the restored sandbox's gofer (pid %d) is still on the host once its launcher has exited: %s", gofer, b)
	}
	if err := r.Destroy(ctx, sp.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r.opts.StateDir, "identities", fmt.Sprint(who.UID))); !os.IsNotExist(err) {
		t.Errorf("the identity's lease after Destroy: %v", err)
	}
}

// pageCache is how many pages file path has, and how many of them are in
// the host's page cache.
func pageCache(t *testing.T, path string) (pages, cached int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		t.Fatalf("%s: %v, size %d", path, err, fi.Size())
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatalf("mincore %s: %v", path, e)
	}
	for _, v := range vec {
		cached += int(v & 1)
	}
	return len(vec), cached
}

// goferPID is the host pid of the gofer of running sandbox id, from
// runsc's record of it.
func goferPID(t *testing.T, r *Runtime, id string) int {
	t.Helper()
	b, err := os.ReadFile(r.runscRecord(id) + ".state")
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		GoferPid int `json:"goferPid"`
	}
	if err := json.Unmarshal(b, &rec); err != nil || rec.GoferPid <= 0 {
		t.Fatalf("runsc's record of %s names no gofer (%v): %s", id, err, b)
	}
	return rec.GoferPid
}

// processesOf are the host's processes running as uid.
func processesOf(t *testing.T, uid int) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" && f[1] == fmt.Sprint(uid) {
				out = append(out, e.Name())
			}
		}
	}
	return out
}
