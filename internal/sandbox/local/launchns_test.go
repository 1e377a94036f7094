//go:build linux

package local

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/testenv"
)

// mountTmpfs mounts a tmpfs at dir (made if missing) in the host's
// namespace until the test ends, holding a file named name with content.
func mountTmpfs(tb testing.TB, dir, name, content string) {
	tb.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := unix.Mount("corral-test", dir, "tmpfs", 0, "size=64k,mode=0755"); err != nil {
		tb.Fatalf("mount tmpfs on %s: %v", dir, err)
	}
	tb.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	if name != "" {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
}

// launcherMounts starts a sandbox binding mounts that prints what the file
// at /in/f says, and returns that and the mount points its launcher sees.
func launcherMounts(t *testing.T, r *Runtime, mounts []sandbox.Mount) (string, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id := sandboxtest.NewID(t)
	// The launcher lives as long as the sandbox: it waits for bwrap.
	if _, err := r.Create(ctx, sandbox.Spec{ID: id, Command: []string{"/bin/sh", "-c", "cat /in/f; sleep 30"}, Mounts: mounts}); err != nil {
		t.Fatalf("Create: %v", err)
	}
	defer r.Destroy(context.Background(), id)
	e, err := r.Lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.ReadFile("/proc/" + strconv.Itoa(e.St.PID) + "/mountinfo")
	if err != nil {
		t.Fatalf("the launcher's mount table: %v", err)
	}
	var points []string
	for _, line := range strings.Split(strings.TrimSpace(string(info)), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			points = append(points, f[4])
		}
	}
	var said []byte
	for deadline := time.Now().Add(10 * time.Second); len(said) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		said, _ = os.ReadFile(filepath.Join(r.Dir.Path(id), "output.log"))
	}
	return string(bytes.TrimSpace(said)), points
}

// TestLaunchNamespace: a sandbox's launcher starts where the host's other
// mounts are not seen, and a sandbox that binds from somewhere the launch
// namespace does not show (or shows differently) still gets it, started
// from the server's own namespace.
func TestLaunchNamespace(t *testing.T) {
	testenv.RequireBwrap(t)
	base := testenv.TempDir(t)
	data := filepath.Join(base, "data")
	if err := os.MkdirAll(filepath.Join(data, "in"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "in", "f"), []byte("from the data root"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Another mount of the host's, outside every root, there before the
	// runtime is.
	other := filepath.Join(base, "other")
	mountTmpfs(t, other, "f", "from another mount")

	r, err := New(Options{DataRoot: data, StateDir: filepath.Join(data, "state"), DisableCgroups: true}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); r.Close() }) // twice does no harm
	if r.launch == nil {
		t.Fatalf("no launch namespace: %s", r.launchWarn)
	}
	hostInfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	hostMounts := bytes.Count(hostInfo, []byte("\n"))
	// The server's own threads stay where they were: /proc/self is the
	// process's main thread, which the launch namespace must not take.
	if !bytes.Contains(hostInfo, []byte(" "+other+" ")) {
		t.Fatalf("after New, /proc/self/mountinfo lacks the host's mount %s:\n%s", other, hostInfo)
	}

	t.Run("data root", func(t *testing.T) {
		said, points := launcherMounts(t, r, []sandbox.Mount{{Source: "in", Target: "/in", ReadOnly: true}})
		if said != "from the data root" {
			t.Errorf("the sandbox read %q", said)
		}
		for _, p := range points {
			if sandbox.Within(p, other) {
				t.Errorf("the launcher sees the host's mount %s", p)
			}
		}
		if !slices.Contains(points, data) || len(points) >= hostMounts {
			t.Errorf("the launcher's mounts %v: want the data root's, and fewer than the host's %d", points, hostMounts)
		}
	})
	t.Run("host directory elsewhere", func(t *testing.T) {
		said, points := launcherMounts(t, r, []sandbox.Mount{{Source: other, Target: "/in", ReadOnly: true, HostDir: true}})
		if said != "from another mount" {
			t.Errorf("the sandbox read %q", said)
		}
		if !slices.Contains(points, other) {
			t.Errorf("the launcher's mounts %v: want the host's, %s among them", points, other)
		}
	})
	t.Run("mounted after", func(t *testing.T) {
		// Under the data root, after the namespace was made: where the
		// host's mounts are private it never shows there, where they are
		// shared it does; the sandbox gets it either way.
		mountTmpfs(t, filepath.Join(data, "late"), "f", "from a later mount")
		said, _ := launcherMounts(t, r, []sandbox.Mount{{Source: "late", Target: "/in", ReadOnly: true}})
		if said != "from a later mount" {
			t.Errorf("the sandbox read %q", said)
		}
	})
	t.Run("after Close", func(t *testing.T) {
		r.Close()
		said, points := launcherMounts(t, r, []sandbox.Mount{{Source: "in", Target: "/in", ReadOnly: true}})
		if said != "from the data root" || !slices.Contains(points, other) {
			t.Errorf("the sandbox read %q, its launcher saw %v: want it started from the host's namespace", said, points)
		}
	})
}

func TestLaunchRoots(t *testing.T) {
	got := launchRoots(Options{DataRoot: "/srv/corral", StateDir: "/srv/corral/run/local", HostRoots: []string{"/srv/repos/", "/"}}, "/usr/bin/bwrap")
	var s []string
	for _, r := range got {
		s = append(s, fmt.Sprintf("%s:%v", r.path, r.rec))
	}
	joined := strings.Join(s, " ")
	for _, want := range []string{"/dev:false", "/etc:true", "/proc:false", "/srv/corral:true", "/srv/repos:true", "/usr:true"} {
		if !strings.Contains(" "+joined+" ", " "+want+" ") {
			t.Errorf("launchRoots = %s: want %s", joined, want)
		}
	}
	// Shown by a root above them; "/" would show everything.
	for _, not := range []string{"/srv/corral/run/local:", "/usr/bin:", "/:"} {
		if strings.Contains(" "+joined, " "+not) {
			t.Errorf("launchRoots = %s: want no %s", joined, not)
		}
	}
}

func TestBindSources(t *testing.T) {
	args := []string{"--unshare-pid", "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--ro-bind", "/dev/null", "/proc/kcore",
		"--ro-bind", "/proc/sys", "/proc/sys", "--bind", "/srv/task", "/task", "--chdir", "/task", "--", "echo", "--bind", "/x", "/y"}
	got := strings.Join(bindSources(args), " ")
	if want := "/usr /srv/task"; got != want {
		t.Errorf("bindSources = %q, want %q", got, want)
	}
}

// BenchmarkStartHostMounts is BenchmarkStart on a host with
// CORRAL_BENCH_HOST_MOUNTS (default 200) more mounts than this one has (a
// tmpfs each, outside every root, for the benchmark's duration): through
// the launch namespace, from the server's own namespace (as before it),
// and a bare bwrap.
func BenchmarkStartHostMounts(b *testing.B) {
	testenv.RequireBwrap(b)
	n := 200
	if v := os.Getenv("CORRAL_BENCH_HOST_MOUNTS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	base := testenv.TempDir(b)
	for i := range n {
		mountTmpfs(b, filepath.Join(base, "mounts", strconv.Itoa(i)), "", "")
	}
	data := filepath.Join(base, "data")
	for _, c := range []struct {
		name string
		host bool
	}{{"launch-namespace", false}, {"host-namespace", true}} {
		r, err := New(Options{DataRoot: data, StateDir: filepath.Join(data, "state"), CgroupParent: "corral-test", hostNamespace: c.host},
			slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { r.Close() })
		b.Run(c.name, func(b *testing.B) { sandboxtest.BenchStart(b, r) })
	}
	b.Run("bare-bwrap", benchBareBwrap)
}
