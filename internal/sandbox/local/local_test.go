//go:build linux

package local

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/cgroups"
	"github.com/corral-dev/corral/internal/sandbox/guestetc"
	"github.com/corral-dev/corral/internal/sandbox/hostproc"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/testenv"
)

// MustNew returns a Runtime over a fresh state dir, with cgroups under a
// parent unique to the test binary so parallel packages do not collide.
// The tests' temporary directories are a host root, so the sandboxes that
// bind from them start in the launch namespace.
func MustNew(tb testing.TB, edit ...func(*Options)) (*Runtime, func() *Runtime) {
	tb.Helper()
	testenv.RequireBwrap(tb)
	opts := Options{DataRoot: sandboxtest.DataRoot, HostRoots: []string{os.TempDir()}, StateDir: filepath.Join(testenv.TempDir(tb), "state"), CgroupParent: "corral-test"}
	for _, e := range edit {
		e(&opts)
	}
	newRuntime := func() *Runtime {
		r, err := New(opts, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			tb.Fatalf("New: %v", err)
		}
		if r.launch == nil {
			tb.Fatalf("no launch namespace: %s", r.launchWarn)
		}
		tb.Cleanup(func() { r.Close() })
		return r
	}
	return newRuntime(), newRuntime
}

func TestConformance(t *testing.T) {
	testenv.RequireBwrap(t)
	sandboxtest.Run(t, sandboxtest.Harness{
		Setup: func(t *testing.T) func() sandbox.Runtime {
			_, newRuntime := MustNew(t)
			return func() sandbox.Runtime { return newRuntime() }
		},
	})
}

// run creates a sandbox running script with dir at /out and waits for it.
func run(t *testing.T, r *Runtime, script string, mod func(*sandbox.Spec)) (sandbox.ExitStatus, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := testenv.TempDir(t)
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

func TestIsolation(t *testing.T) {
	r, _ := MustNew(t)
	for _, tc := range []struct {
		name, script, want string
	}{
		{"uid", `id -u > out; id -g >> out; id -un >> out`, "1000\n1000\nworker\n"},
		{"no capabilities", `grep -E '^(CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\t' ' ' > out`,
			"CapPrm: 0000000000000000\nCapEff: 0000000000000000\nCapBnd: 0000000000000000\nCapAmb: 0000000000000000\nNoNewPrivs: 1\nSeccomp: 2\n"},
		// unshare(1) and mount(8) fail in the filter, not on a missing
		// capability: the user namespace would give them one.
		{"seccomp", `unshare -U true 2>&1 | grep -c 'Operation not permitted' > out; unshare -rn true 2>/dev/null || echo denied >> out`, "1\ndenied\n"},
		{"rlimits", `ulimit -c > out; ulimit -n >> out; ulimit -Hn >> out; ulimit -f >> out`, "0\n4096\n4096\nunlimited\n"},
		// bwrap closes the filter and status descriptors before it runs
		// the main process.
		{"no runtime descriptors", `ls -l /proc/self/fd/ | grep -c -e seccomp -e status > out`, "0\n"},
		{"pid 1 memory closed", `for f in /proc/1/mem /proc/1/task/1/mem; do (exec 3<$f) 2>/dev/null && echo open >> out || echo closed >> out; done; cat /proc/1/comm >> out`, "closed\nclosed\nbwrap\n"},
		{"no resolv.conf without network", `test -e /etc/resolv.conf && echo present > out || echo absent > out`, "absent\n"},
		// pid 1 is bwrap's init, 2 the shell; nothing of the host.
		// pid 1 is bwrap's reaper; the rest are this script's own few
		// processes (how many are alive at the moment ls reads /proc
		// varies), never the host's hundreds.
		{"pid namespace", `cat /proc/1/comm > out; ls -d /proc/[0-9]* | wc -l >> out`, ""},
		{"loopback only", `ls /sys/class/net 2>/dev/null > out || cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' > out`, "lo\n"},
		{"hostname", `hostname > out`, "corral\n"},
		{"minimal etc", `ls /etc | tr '\n' ' ' > out`, ""},
		{"read-only root", `if touch /x 2>/dev/null || touch /usr/x 2>/dev/null || touch /etc/x 2>/dev/null; then echo writable > out; else echo ro > out; fi`, "ro\n"},
		{"tmp writable", `echo ok > /tmp/f && cat /tmp/f > out`, "ok\n"},
		{"env cleared", `env | grep -c CORRAL_HOST_SECRET > out`, "0\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CORRAL_HOST_SECRET", "x")
			_, out := run(t, r, tc.script, nil)
			if tc.name == "pid namespace" {
				f := strings.Fields(out)
				if n, err := strconv.Atoi(f[len(f)-1]); len(f) != 2 || f[0] != "bwrap" || err != nil || n > 6 {
					t.Errorf("got %q, want pid 1 bwrap and at most 6 processes", out)
				}
				return
			}
			if tc.name == "minimal etc" {
				for _, name := range strings.Fields(out) {
					switch name {
					case "passwd", "group", "hosts", "hostname", "nsswitch.conf":
					default:
						if !strings.Contains(strings.Join(guestetc.HostBinds, " "), name) {
							t.Errorf("unexpected /etc entry %q in sandbox", name)
						}
					}
				}
				if !strings.Contains(out, "passwd") {
					t.Errorf("/etc = %q, want passwd in it", out)
				}
				return
			}
			if tc.name == "loopback only" && strings.TrimSpace(out) == "" {
				t.Fatalf("no network interfaces listed")
			}
			if out != tc.want {
				t.Errorf("got %q, want %q", out, tc.want)
			}
		})
	}
}

func TestHostProcessesInvisible(t *testing.T) {
	r, _ := MustNew(t)
	_, out := run(t, r, `cat /proc/*/cmdline 2>/dev/null | tr '\0' ' ' > out`, nil)
	if strings.Contains(out, "local.test") || strings.Contains(out, "go test") {
		t.Errorf("sandbox sees host processes: %q", out)
	}
}

// TestProcessesInTheirCgroups checks that the launcher and every process
// of the sandbox are in each of its cgroups: the launcher joins them
// itself (cgroups.JoinFiles) before it forks bwrap.
func TestProcessesInTheirCgroups(t *testing.T) {
	r, _ := MustNew(t)
	if r.cg == nil {
		testenv.Missing(t, "writable cgroups: "+r.cgWarn)
	}
	ctx := context.Background()
	id := sandboxtest.NewID(t)
	if _, err := r.Create(ctx, sandbox.Spec{ID: id, Command: []string{"/bin/sh", "-c", "sleep 1006"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Destroy(context.Background(), id) })
	e, err := r.Lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	// bwrap's pid 1 and the main process, at least.
	inside := hostproc.PidsInNamespace(e.St.PIDNS)
	if len(inside) < 2 {
		t.Fatalf("pids in the sandbox's namespace: %v, want pid 1 and the main process", inside)
	}
	if len(e.St.Cgroups) == 0 {
		t.Fatal("the sandbox has no cgroups")
	}
	for _, dir := range e.St.Cgroups {
		in := cgroups.Pids([]string{dir})
		for _, p := range append([]int{e.St.PID}, inside...) {
			if !slices.Contains(in, p) {
				t.Errorf("pid %d not in %s (which has %v)", p, dir, in)
			}
		}
	}
}

// TestLauncherAsHostIdentity checks that, under a root server, the
// sandbox's processes on the host outside its namespaces (the launcher and
// bwrap's outer process) run as the host identity, with no supplementary
// groups and no capabilities: the server's fork changes identity before
// the launcher starts.
func TestLauncherAsHostIdentity(t *testing.T) {
	testenv.RequireRoot(t)
	r, _ := MustNew(t)
	ctx := context.Background()
	id := sandboxtest.NewID(t)
	if _, err := r.Create(ctx, sandbox.Spec{ID: id, Command: []string{"/bin/sh", "-c", "sleep 1005"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Destroy(context.Background(), id) })
	e, err := r.Lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	children, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", e.St.PID, e.St.PID))
	if err != nil || len(strings.Fields(string(children))) != 1 {
		t.Fatalf("the launcher's children: %q, %v; want bwrap", children, err)
	}
	bwrap, _ := strconv.Atoi(strings.Fields(string(children))[0])
	// Its own identity, of the range above the reserved one.
	if !hostuser.InRange(e.St.Identity.UID) || e.St.Identity.UID == hostuser.Reserved || e.St.Identity.GID != hostuser.Reserved {
		t.Errorf("the sandbox's identity %v, want one of its own above %d", e.St.Identity, hostuser.Reserved)
	}
	uid, gid := strconv.Itoa(e.St.Identity.UID), strconv.Itoa(e.St.Identity.GID)
	want := map[string][]string{
		"Uid:": {uid, uid, uid, uid}, "Gid:": {gid, gid, gid, gid}, "Groups:": nil,
		"CapInh:": {"0000000000000000"}, "CapPrm:": {"0000000000000000"}, "CapEff:": {"0000000000000000"}, "CapAmb:": {"0000000000000000"},
	}
	for name, pid := range map[string]int{"launcher": e.St.PID, "bwrap": bwrap} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if w, ok := want[f0(f)]; ok && !slices.Equal(f[1:], w) {
				t.Errorf("%s (pid %d): %q, want %v", name, pid, line, w)
			}
		}
	}
}

// f0 is the first of fields, or "".
func f0(fields []string) string {
	if len(fields) == 0 {
		return ""
	}
	return fields[0]
}

// TestSurvivesServerDeath runs a sandbox from a child process that is
// killed with SIGKILL, then recovers it from this process.
func TestSurvivesServerDeath(t *testing.T) {
	testenv.RequireBwrap(t)
	setup := func(t *testing.T) (string, string) {
		return filepath.Join(testenv.TempDir(t), "state"), testenv.TempDir(t)
	}
	sandboxtest.ServerDeath(t, setup, func(tb testing.TB, state string) sandbox.Runtime {
		r, err := New(Options{DataRoot: sandboxtest.DataRoot, StateDir: state, CgroupParent: "corral-test"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			tb.Fatal(err)
		}
		return r
	})
}

// TestNoFileAboveServerHardLimit runs a sandbox from a server whose hard
// open-file limit (1024) is below the sandbox's (4096, the default), as
// under docker --ulimit nofile=1024:1024: the sandbox starts with the
// server's limit, and Capabilities says why it is lower. The server is a
// child process that lowers its own limit (which needs no privilege and
// cannot be undone), so this process keeps its own.
func TestNoFileAboveServerHardLimit(t *testing.T) {
	testenv.RequireBwrap(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestNoFileHelper$", "-test.v")
	cmd.Env = append(os.Environ(), "CORRAL_LOCAL_HELPER_NOFILE=1024")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestNoFileHelper") {
		t.Errorf("a sandbox under a server with hard nofile 1024: %v\n%s", err, out)
	}
}

func TestNoFileHelper(t *testing.T) {
	limit, err := strconv.ParseUint(os.Getenv("CORRAL_LOCAL_HELPER_NOFILE"), 10, 64)
	if err != nil {
		t.Skip("helper process for TestNoFileAboveServerHardLimit")
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}); err != nil {
		t.Fatal(err)
	}
	r, _ := MustNew(t)
	c, err := r.Capabilities(context.Background())
	if err != nil || !c.Available {
		t.Fatalf("Capabilities = %+v, %v", c, err)
	}
	if want := fmt.Sprintf("sandboxes get %d open files, not 4096", limit); !strings.Contains(strings.Join(c.Warnings, "; "), want) {
		t.Errorf("warnings %q, want one saying %q", c.Warnings, want)
	}
	es, out := run(t, r, `ulimit -n > out; ulimit -Hn >> out`, nil)
	if want := fmt.Sprintf("%d\n%d\n", limit, limit); es.Code != 0 || out != want {
		t.Errorf("sandbox exited %+v with %q, want 0 with %q", es, out, want)
	}
}

func TestCapabilities(t *testing.T) {
	r, _ := MustNew(t)
	c, err := r.Capabilities(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !c.Available || !strings.HasPrefix(c.Version, "bubblewrap ") || !c.Exec || !c.Network {
		t.Errorf("Capabilities = %+v, want available bubblewrap with exec and network isolation", c)
	}
	if os.Geteuid() == 0 && !c.Limits {
		t.Errorf("Capabilities.Limits = false as root: %v", c.Warnings)
	}
}

// TestCapabilitiesAfterACutProbe: a probe whose caller gave up (a health
// check's request timing out while the server starts) says bwrap did not
// run; the next call probes again instead of keeping that until a restart.
func TestCapabilitiesAfterACutProbe(t *testing.T) {
	r, _ := MustNew(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if c, _ := r.Capabilities(ctx); c.Available {
		t.Fatalf("a probe under an ended context answered %+v; this test needs it cut", c)
	}
	if c, err := r.Capabilities(context.Background()); err != nil || !c.Available {
		t.Fatalf("Capabilities after a cut probe = %+v, %v; want bubblewrap available", c, err)
	}
}

func TestCapabilitiesNoBwrap(t *testing.T) {
	r, err := New(Options{DataRoot: sandboxtest.DataRoot, StateDir: t.TempDir(), Bwrap: "/nonexistent/bwrap", DisableCgroups: true}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := r.Capabilities(context.Background())
	if c.Available || !strings.Contains(c.Reason, "apt-get install -y bubblewrap") || c.Limits {
		t.Errorf("Capabilities = %+v, want unavailable with an install hint", c)
	}
	_, err = r.Create(context.Background(), sandbox.Spec{ID: "x", Command: []string{"true"}})
	if err == nil {
		t.Errorf("Create without bwrap succeeded")
	}
}

// BenchmarkStart compares Create→Wait of /bin/true through the runtime with
// a bare bwrap run of the same namespaces.
func BenchmarkStart(b *testing.B) {
	r, _ := MustNew(b)
	b.Run("runtime", func(b *testing.B) { sandboxtest.BenchStart(b, r) })
	b.Run("bare-bwrap", benchBareBwrap)
}

func benchBareBwrap(b *testing.B) {
	args := append([]string{"--unshare-all", "--uid", "1000", "--gid", "1000"}, rootfsArgs()...)
	args = append(args, "--proc", "/proc", "--dev", "/dev", "--", "/bin/true")
	for b.Loop() {
		if out, err := exec.Command("bwrap", args...).CombinedOutput(); err != nil {
			b.Fatal(err, string(out))
		}
	}
}

// TestRlimitOptions runs a sandbox with a file size limit and a nofile
// limit: a write past the limit fails, and neither limit can be raised.
func TestRlimitOptions(t *testing.T) {
	testenv.RequireBwrap(t)
	r, err := New(Options{DataRoot: sandboxtest.DataRoot, StateDir: filepath.Join(testenv.TempDir(t), "state"), CgroupParent: "corral-test",
		NoFile: 256, FileSizeLimit: 64 << 10}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	_, out := run(t, r, `ulimit -n > out; ulimit -f >> out
(ulimit -n 1024) 2>/dev/null && echo raised >> out
head -c 100000 /dev/zero > big 2>/dev/null; wc -c < big >> out`, nil)
	// 64 KiB in 512-byte blocks; the write stops at 65536 bytes.
	if want := "256\n128\n65536\n"; out != want {
		t.Errorf("got %q, want %q", out, want)
	}
}

// TestResolvConfWithNetwork: a sandbox with a network gets a resolv.conf
// that points at loopback, where lookups fail at once.
func TestResolvConfWithNetwork(t *testing.T) {
	r, _ := MustNew(t)
	_, out := run(t, r, `grep '^nameserver' /etc/resolv.conf > out`, func(sp *sandbox.Spec) { sp.Network = sandbox.NetworkEgress })
	if out != "nameserver 127.0.0.1\n" {
		t.Errorf("resolv.conf nameserver = %q", out)
	}
}

// TestSecretsNotInArguments checks that Spec.Env reaches the sandbox but
// never a host command line, which every host user can read in /proc.
func TestSecretsNotInArguments(t *testing.T) {
	r, _ := MustNew(t)
	const secret = "sk-argv-leak-check-0123456789"
	var seen []string
	scanned := make(chan struct{})
	_, out := run(t, r, `echo "$SOME_API_KEY" > out; touch ready; sleep 0.5`, func(sp *sandbox.Spec) {
		sp.Env = []string{"SOME_API_KEY=" + secret}
		go func() {
			defer close(scanned)
			// Scan every command line while the sandbox runs.
			for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				ents, _ := os.ReadDir("/proc")
				for _, e := range ents {
					b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
					if err == nil && strings.Contains(string(b), secret) {
						seen = append(seen, e.Name())
					}
				}
			}
		}()
	})
	<-scanned
	if out != secret+"\n" {
		t.Errorf("the sandbox's environment lacks the secret: %q", out)
	}
	if len(seen) > 0 {
		t.Errorf("the secret is in the command line of pids %v", seen)
	}
}

// TestRecoverFromStatus is a new server finding a running sandbox: its
// state.json never holds the sandbox's pid 1 (Create writes it before bwrap
// has one), so the new server must learn it from status.jsonl to see the
// sandbox running and stop it.
func TestRecoverFromStatus(t *testing.T) {
	r, newRuntime := MustNew(t)
	ctx := context.Background()
	id := sandboxtest.NewID(t)
	if _, err := r.Create(ctx, sandbox.Spec{ID: id, Command: []string{"/bin/sh", "-c", "sleep 1005"}, Labels: map[string]string{sandbox.LabelManaged: "true"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { newRuntime().Destroy(context.Background(), id) })
	r2 := newRuntime()
	if s, err := r2.Status(ctx, id); err != nil || s.State != sandbox.StateRunning {
		t.Fatalf("Status = %+v, %v; want running", s, err)
	}
	// A SIGTERM to the sandbox's processes, which only its pid namespace
	// (from status.jsonl) finds, ends sleep within the grace: 128+15.
	if err := r2.Stop(ctx, id, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if es, err := r2.Wait(ctx, id); err != nil || es.Code != 143 {
		t.Errorf("Wait after Stop = %+v, %v; want code 143 (SIGTERM)", es, err)
	}
}

// TestStopRightAfterCreate: a sandbox stopped the moment Create returns,
// by another runtime instance (a restarted server), still reports how its
// main process ended: Create returns once the main process runs its
// program, past the point from which bwrap reports the exit code.
func TestStopRightAfterCreate(t *testing.T) {
	r, newRuntime := MustNew(t)
	r2 := newRuntime()
	ctx := context.Background()
	for i := range 20 {
		id := sandboxtest.NewID(t)
		if _, err := r.Create(ctx, sandbox.Spec{ID: id, Command: []string{"/bin/sh", "-c", "sleep 1005"}}); err != nil {
			t.Fatal(err)
		}
		if err := r2.Stop(ctx, id, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		es, err := r2.Wait(ctx, id)
		r.Destroy(ctx, id)
		if err != nil || es.Code != 143 {
			t.Fatalf("run %d: Wait after Stop = %+v, %v; want code 143 (SIGTERM)", i, es, err)
		}
	}
}

// TestStopLeavesNoProcess: once Stop returns, no process of the sandbox
// runs, also when the main process ended within the grace period and a
// child that ignores SIGTERM outlived it. bwrap exits as soon as the main
// process has, and the kernel kills the rest only once the sandbox's pid 1
// gets the CPU to die: Stop returned before that, and under load the
// child ran on (the conformance suite's StopProcessTree saw its file grow
// after Stop and Wait). The children here are busy loops, which keep pid 1
// waiting for the CPU without any other load.
func TestStopLeavesNoProcess(t *testing.T) {
	r, _ := MustNew(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 5 {
		dir := testenv.TempDir(t)
		id := sandboxtest.NewID(t)
		sp := sandbox.Spec{ID: id, Dir: "/out", Mounts: []sandbox.Mount{{Source: sandboxtest.MountSource(dir), Target: "/out"}},
			Command: []string{"/bin/sh", "-c", `for i in 1 2 3 4; do (trap '' TERM; while :; do :; done) & done; touch ready; sleep 1007`}}
		if _, err := r.Create(ctx, sp); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Destroy(context.Background(), id) })
		for _, err := os.Stat(filepath.Join(dir, "ready")); err != nil; _, err = os.Stat(filepath.Join(dir, "ready")) {
			if ctx.Err() != nil {
				t.Fatal("the sandbox did not start its children")
			}
			time.Sleep(5 * time.Millisecond)
		}
		e, err := r.Lookup(id)
		if err != nil {
			t.Fatal(err)
		}
		// Held, so that its number names no other namespace after Stop.
		ns := hostproc.OpenPidNS(e.St.ChildPID, e.St.PIDNS)
		if ns == nil {
			t.Fatal("the sandbox's pid 1 is gone before Stop")
		}
		defer ns.Close()
		if err := r.Stop(ctx, id, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if n := ns.Signal(0); n > 0 {
			t.Fatalf("run %d: %d processes of the sandbox still run after Stop", i, n)
		}
	}
}

// TestCreateCanceledLeavesNothing cancels a Create whose bwrap has not yet
// reached the sandbox's pid 1 and never will: a stand-in that sleeps, as a
// real bwrap setting up when the server shuts down, before it has asked
// to die with its parent. Nothing of the sandbox may outlive the failed
// Create: killing only the launcher's shell left bwrap running and its
// cgroups busy for good (a warm sandbox being started at every shutdown
// leaked its cgroups).
func TestCreateCanceledLeavesNothing(t *testing.T) {
	testenv.RequireBwrap(t)
	real, err := exec.LookPath("bwrap")
	if err != nil {
		t.Fatal(err)
	}
	for _, withCgroups := range []bool{true, false} {
		t.Run(fmt.Sprintf("cgroups=%v", withCgroups), func(t *testing.T) {
			dir := testenv.TempDir(t)
			pidFile := filepath.Join(dir, "pid")
			stand := filepath.Join(dir, "bwrap")
			// The probe (ending in /usr/bin/true) and --version go to the
			// real bwrap; a sandbox's bwrap records its pid and sleeps.
			script := "#!/bin/sh\nfor a; do last=$a; done\n" +
				"if [ \"$1\" = --version ] || [ \"$last\" = /usr/bin/true ]; then exec " + real + " \"$@\"; fi\n" +
				"echo $$ > " + pidFile + "\nexec sleep 1007\n"
			if err := os.WriteFile(stand, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, 0o777); err != nil { // the sandbox identity writes the pid
				t.Fatal(err)
			}
			opts := Options{DataRoot: sandboxtest.DataRoot, StateDir: filepath.Join(testenv.TempDir(t), "state"), CgroupParent: "corral-test", Bwrap: stand, DisableCgroups: !withCgroups}
			r, err := New(opts, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			if withCgroups && r.cg == nil {
				testenv.Missing(t, "writable cgroups: "+r.cgWarn)
			}
			id := sandboxtest.NewID(t)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := r.Create(ctx, sandbox.Spec{ID: id, Command: []string{"/bin/true"}})
				done <- err
			}()
			var pid int
			for deadline := time.Now().Add(10 * time.Second); pid == 0; {
				b, _ := os.ReadFile(pidFile)
				pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
				if pid == 0 && time.Now().After(deadline) {
					t.Fatal("the stand-in bwrap never ran")
				}
				time.Sleep(5 * time.Millisecond)
			}
			start, err := hostproc.StartTime(pid)
			if err != nil {
				t.Fatal(err)
			}
			cancel()
			if err := <-done; err == nil {
				t.Fatal("Create returned no error after its context was canceled")
			}
			// SIGKILLed, it is gone within moments; left alone, it would
			// sleep for 1007 s.
			for deadline := time.Now().Add(10 * time.Second); hostproc.Alive(pid, start); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					syscall.Kill(pid, syscall.SIGKILL)
					t.Fatalf("bwrap (pid %d) outlived the failed Create by 10 s", pid)
				}
			}
			if withCgroups {
				for _, d := range r.cg.Dirs(id) {
					if _, err := os.Stat(d); err == nil {
						t.Errorf("cgroup %s outlived the failed Create", d)
					}
				}
			}
			if _, err := os.Stat(r.Dir.Path(id)); err == nil {
				t.Errorf("state dir %s outlived the failed Create", r.Dir.Path(id))
			}
		})
	}
}

// TestDestroyTornState destroys a sandbox whose state.json does not
// decode, as a power loss can leave it (it is not fsynced): its cgroups
// and state dir go by its name, where Destroy used to fail and leave them.
func TestDestroyTornState(t *testing.T) {
	r, _ := MustNew(t)
	id := sandboxtest.NewID(t)
	if err := os.MkdirAll(r.Dir.Path(id), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.Dir.Path(id), "state.json"), []byte(`{"id":"`+id), 0o600); err != nil {
		t.Fatal(err)
	}
	var dirs []string
	if r.cg != nil {
		var err error
		if dirs, err = r.cg.Create(id, sandbox.Limits{Pids: 10}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Destroy(context.Background(), id); err != nil {
		t.Fatalf("Destroy of a torn state: %v", err)
	}
	for _, d := range append(dirs, r.Dir.Path(id)) {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s outlived Destroy", d)
		}
	}
}
