//go:build linux

package cgroups

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/testenv"
)

// mustFakeCgroupfs builds a fake cgroupfs in a temp dir: v2 has the root's
// cgroup.controllers and subtree_control, v1 has one dir per controller.
func mustFakeCgroupfs(tb testing.TB, v2 bool) string {
	tb.Helper()
	root := tb.TempDir()
	write := func(path, content string) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	if v2 {
		write(filepath.Join(root, "cgroup.controllers"), "cpuset cpu io memory pids\n")
		write(filepath.Join(root, "cgroup.subtree_control"), "memory\n")
		// The kernel creates subtree_control in every new cgroup.
		write(filepath.Join(root, "corral", "cgroup.subtree_control"), "")
		return root
	}
	for _, c := range V1Controllers {
		write(filepath.Join(root, c, "cgroup.procs"), "")
	}
	return root
}

func readFiles(tb testing.TB, dir string) map[string]string {
	tb.Helper()
	got := map[string]string{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		got[e.Name()] = string(b)
	}
	return got
}

func TestV2Fake(t *testing.T) {
	root := mustFakeCgroupfs(t, true)
	cg, err := Detect(root, "corral")
	if err != nil || !cg.V2() {
		t.Fatalf("detectCgroups = %+v, %v; want v2", cg, err)
	}
	if err := cg.Prepare(); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	// Only the controllers not yet enabled are added.
	if got, _ := os.ReadFile(filepath.Join(root, "cgroup.subtree_control")); string(got) != "+pids +cpu" {
		t.Errorf("root subtree_control = %q, want %q", got, "+pids +cpu")
	}
	if got, _ := os.ReadFile(filepath.Join(root, "corral", "cgroup.subtree_control")); string(got) != "+memory +pids +cpu" {
		t.Errorf("corral subtree_control = %q, want %q", got, "+memory +pids +cpu")
	}
	// memory.swap.max exists only with swap accounting; pre-create it.
	if err := os.MkdirAll(filepath.Join(root, "corral", "sb-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "corral", "sb-1", "memory.swap.max"), []byte("max"), 0o644)
	dirs, err := cg.Create("sb-1", sandbox.Limits{MemoryBytes: 64 << 20, CPUMillis: 1500, Pids: 100})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if got, want := cg.Path("sb-1"), "/corral/sb-1"; got != want {
		t.Errorf("Path = %q, want %q", got, want)
	}
	if want := []string{filepath.Join(root, "corral", "sb-1")}; !cmp.Equal(dirs, want) {
		t.Errorf("dirs = %v, want %v", dirs, want)
	}
	want := map[string]string{"memory.max": "67108864", "memory.swap.max": "0", "pids.max": "100", "cpu.max": "150000 100000"}
	if diff := cmp.Diff(want, readFiles(t, dirs[0])); diff != "" {
		t.Errorf("limit files (-want +got):\n%s", diff)
	}

	os.WriteFile(filepath.Join(dirs[0], "memory.events"), []byte("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n"), 0o644)
	if oomKilled(t, dirs) {
		t.Errorf("oomKilled with oom_kill 0")
	}
	os.WriteFile(filepath.Join(dirs[0], "memory.events"), []byte("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n"), 0o644)
	if !oomKilled(t, dirs) {
		t.Errorf("oomKilled with oom_kill 1 = false")
	}
	os.WriteFile(filepath.Join(dirs[0], "cgroup.procs"), []byte("12\n34\n"), 0o644)
	if got := Pids(dirs); !cmp.Equal(got, []int{12, 34}) {
		t.Errorf("cgroupPids = %v", got)
	}
}

func TestV1Fake(t *testing.T) {
	root := mustFakeCgroupfs(t, false)
	cg, err := Detect(root, "corral")
	if err != nil || cg.V2() {
		t.Fatalf("detectCgroups = %+v, %v; want v1", cg, err)
	}
	if err := cg.Prepare(); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	dirs, err := cg.Create("sb-1", sandbox.Limits{MemoryBytes: 1 << 20, CPUMillis: 250, Pids: 7})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if len(dirs) != 3 {
		t.Fatalf("dirs = %v, want memory, pids, cpu", dirs)
	}
	for i, want := range []map[string]string{
		{"memory.limit_in_bytes": "1048576"}, // no memsw file: no swap accounting
		{"pids.max": "7"},
		{"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "25000"},
	} {
		if diff := cmp.Diff(want, readFiles(t, dirs[i])); diff != "" {
			t.Errorf("%s (-want +got):\n%s", dirs[i], diff)
		}
	}
	os.WriteFile(filepath.Join(dirs[0], "memory.oom_control"), []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"), 0o644)
	if !oomKilled(t, dirs) {
		t.Errorf("oomKilled with v1 oom_kill 2 = false")
	}
}

// TestBackgroundFake: a sandbox in the background has the least CPU
// weight of its hierarchy's kind, and the default again in the fore.
func TestBackgroundFake(t *testing.T) {
	for _, tt := range []struct {
		v2               bool
		file, back, fore string
	}{
		{true, "cpu.weight", "1", "100"},
		{false, "cpu.shares", "2", "1024"},
	} {
		cg, err := Detect(mustFakeCgroupfs(t, tt.v2), "corral")
		if err == nil {
			err = cg.Prepare()
		}
		if err != nil {
			t.Fatal(err)
		}
		dirs, err := cg.Create("sb-1", sandbox.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		cpuDir := dirs[len(dirs)-1]
		for _, on := range []bool{true, false} {
			if err := cg.Background(dirs, on); err != nil {
				t.Fatalf("v2 %v: Background(%v): %v", tt.v2, on, err)
			}
			want := map[bool]string{true: tt.back, false: tt.fore}[on]
			if got, _ := os.ReadFile(filepath.Join(cpuDir, tt.file)); string(got) != want {
				t.Errorf("v2 %v: Background(%v): %s = %q, want %q", tt.v2, on, tt.file, got, want)
			}
		}
	}
}

func TestNoLimitsWritesNothing(t *testing.T) {
	root := mustFakeCgroupfs(t, true)
	cg, _ := Detect(root, "corral")
	dirs, err := cg.Create("sb-2", sandbox.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got := readFiles(t, dirs[0]); len(got) != 0 {
		t.Errorf("files written without limits: %v", got)
	}
}

func TestDetect(t *testing.T) {
	if _, err := Detect(t.TempDir(), "corral"); err == nil {
		t.Errorf("detectCgroups of an empty dir succeeded")
	}
	for _, parent := range []string{"/abs", "../up", ""} {
		if _, err := Detect(mustFakeCgroupfs(t, true), parent); err == nil {
			t.Errorf("detectCgroups with parent %q succeeded", parent)
		}
	}
}

// TestReal creates, limits and removes a cgroup on this host's real
// hierarchy (v1 here, v2 on most production hosts).
func TestReal(t *testing.T) {
	testenv.RequireRoot(t)
	cg, err := Detect("/sys/fs/cgroup", "corral-test")
	if err == nil {
		err = cg.Prepare()
	}
	if err != nil {
		testenv.Missing(t, "writable cgroup hierarchy: "+err.Error())
	}
	dirs, err := cg.Create("real-1", sandbox.Limits{MemoryBytes: 64 << 20, CPUMillis: 500, Pids: 10})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { Remove(dirs) })
	read := func(name string) string {
		for _, d := range dirs {
			if b, err := os.ReadFile(filepath.Join(d, name)); err == nil {
				return strings.TrimSpace(string(b))
			}
		}
		return ""
	}
	if cg.V2() {
		if got := read("memory.max"); got != "67108864" {
			t.Errorf("memory.max = %q", got)
		}
		if got := read("cpu.max"); got != "50000 100000" {
			t.Errorf("cpu.max = %q", got)
		}
	} else {
		if got := read("memory.limit_in_bytes"); got != "67108864" {
			t.Errorf("memory.limit_in_bytes = %q", got)
		}
		if got := read("cpu.cfs_quota_us"); got != "50000" {
			t.Errorf("cpu.cfs_quota_us = %q", got)
		}
	}
	if got := read("pids.max"); got != "10" {
		t.Errorf("pids.max = %q", got)
	}
	if oomKilled(t, dirs) {
		t.Errorf("fresh cgroup reports an OOM kill")
	}
	if err := Remove(dirs); err != nil {
		t.Fatalf("removeCgroups: %v", err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s still exists", d)
		}
	}
}

// oomKilled reports whether OOMKills finds a counter and it is above zero;
// a missing counter fails the test.
func oomKilled(tb testing.TB, dirs []string) bool {
	tb.Helper()
	n, ok := OOMKills(dirs)
	if !ok {
		tb.Fatalf("OOMKills(%v): no oom_kill counter", dirs)
	}
	return n > 0
}

func TestOOMKillsWithoutCounterFallsBackToFailcnt(t *testing.T) {
	dir := t.TempDir()
	if n, ok := OOMKills([]string{dir}); ok {
		t.Errorf("OOMKills of a cgroup without counters = %d, true; want false", n)
	}
	if got := Failcnt([]string{dir}); got != 0 {
		t.Errorf("Failcnt without memory.failcnt = %d, want 0", got)
	}
	os.WriteFile(filepath.Join(dir, "memory.failcnt"), []byte("5\n"), 0o644)
	if got := Failcnt([]string{dir}); got != 5 {
		t.Errorf("Failcnt = %d, want 5", got)
	}
}

// TestOpenJoinAndRemove opens a fake v1 sandbox's tasks files and a fake
// v2 sandbox's directory, and refuses a mix.
func TestOpenJoinAndRemove(t *testing.T) {
	root := mustFakeCgroupfs(t, false)
	cg, err := Detect(root, "corral")
	if err != nil {
		t.Fatal(err)
	}
	if err := cg.Prepare(); err != nil {
		t.Fatal(err)
	}
	dirs, err := cg.Create("sb-3", sandbox.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	// The kernel gives every v1 cgroup a tasks file; the fake has none
	// until the test writes them, and a v2 cgroup never has one.
	if _, err := OpenJoin(dirs); err == nil {
		t.Error("OpenJoin of three cgroups without tasks files succeeded")
	}
	j, err := OpenJoin(dirs[2:])
	if err != nil || j.Dir == nil || len(j.Tasks) != 0 {
		t.Errorf("OpenJoin of one cgroup without tasks = %+v, %v; want its directory (v2)", j, err)
	} else {
		j.Close()
	}
	for _, d := range dirs[:2] {
		if err := os.WriteFile(filepath.Join(d, "tasks"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := OpenJoin(dirs); err == nil {
		t.Error("OpenJoin of v1 cgroups and one without a tasks file succeeded")
	}
	j, err = OpenJoin(dirs[:2])
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range j.Tasks {
		names = append(names, f.Name())
	}
	want := []string{
		filepath.Join(root, "memory", "corral", "sb-3", "tasks"),
		filepath.Join(root, "pids", "corral", "sb-3", "tasks"),
	}
	if diff := cmp.Diff(want, names); diff != "" || j.Dir != nil {
		t.Errorf("OpenJoin: Dir %v, Tasks (-want +got):\n%s", j.Dir, diff)
	}
	j.Close()
	for _, d := range dirs[:2] {
		os.Remove(filepath.Join(d, "tasks")) // the kernel's files go with the cgroup
	}
	if err := Remove(dirs); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if err := Remove(dirs); err != nil {
		t.Errorf("Remove of removed cgroups: %v", err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s still exists", d)
		}
	}
}

// joinUID is the unprivileged identity the join tests start processes as.
const joinUID = 1900000000

// TestJoinAsAnotherUser starts a process as an unprivileged identity
// inside real cgroups the way a launcher does (see Join), and reads where
// it ended up from its own /proc/self/cgroup: on this host's hierarchy (v1
// or v2), and on a v2 hierarchy mounted beside v1 where there is one. A
// v1 launcher that opens the tasks file itself is refused, which is why
// the server opens it.
func TestJoinAsAnotherUser(t *testing.T) {
	testenv.RequireRoot(t)
	cred := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: joinUID, Gid: joinUID, Groups: []uint32{}}}
	// launch runs the v1 join of launcherScript's kind, then prints the
	// process's cgroups.
	launch := func(t *testing.T, j *Join) string {
		t.Helper()
		args := []string{"-c", `for fd; do echo 0 >&"$fd" || exit 1; done; cat /proc/self/cgroup`, "sh"}
		cmd := exec.Command("/bin/sh", args...)
		for i, f := range j.Tasks {
			cmd.Args = append(cmd.Args, strconv.Itoa(3+i))
			cmd.ExtraFiles = append(cmd.ExtraFiles, f)
		}
		attr := *cred
		if j.Dir != nil {
			attr.UseCgroupFD, attr.CgroupFD = true, int(j.Dir.Fd())
		}
		cmd.SysProcAttr = &attr
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v: %s", cmd.Args, err, out)
		}
		return string(out)
	}

	t.Run("host", func(t *testing.T) {
		cg, err := Detect("/sys/fs/cgroup", "corral-test")
		if err == nil {
			err = cg.Prepare()
		}
		if err != nil {
			testenv.Missing(t, "writable cgroup hierarchy: "+err.Error())
		}
		dirs, err := cg.Create("join-1", sandbox.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { Remove(dirs) })
		j, err := OpenJoin(dirs)
		if err != nil {
			t.Fatal(err)
		}
		defer j.Close()
		in := inCgroups(launch(t, j))
		want := map[string]string{"": "/corral-test/join-1"}
		if !cg.V2() {
			want = map[string]string{"memory": "/corral-test/join-1", "pids": "/corral-test/join-1", "cpu": "/corral-test/join-1"}
			// The control: the same identity cannot open a tasks file.
			cmd := exec.Command("/bin/sh", "-c", `echo 0 > "$1"`, "sh", filepath.Join(dirs[0], "tasks"))
			cmd.SysProcAttr = cred
			if out, err := cmd.CombinedOutput(); err == nil {
				t.Errorf("an unprivileged shell joined %s by its path (%s)", dirs[0], out)
			}
		}
		for c, path := range want {
			if in[c] != path {
				t.Errorf("in cgroup %q of controller %q, want %q (all: %v)", in[c], c, path, in)
			}
		}
	})

	t.Run("v2 beside v1", func(t *testing.T) {
		mnt := cgroup2Mount(t)
		if mnt == "" || mnt == "/sys/fs/cgroup" {
			t.Skip("no cgroup v2 hierarchy mounted beside v1 (the host subtest covers a v2 host)")
		}
		dir := filepath.Join(mnt, "corral-test", "join-2")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			testenv.Missing(t, "writable cgroup v2 hierarchy: "+err.Error())
		}
		t.Cleanup(func() { Remove([]string{dir}) })
		j, err := OpenJoin([]string{dir})
		if err != nil {
			t.Fatal(err)
		}
		defer j.Close()
		if j.Dir == nil {
			t.Fatalf("OpenJoin(%s) did not take it as v2: %+v", dir, j)
		}
		if in := inCgroups(launch(t, j)); in[""] != "/corral-test/join-2" {
			t.Errorf("in v2 cgroup %q, want /corral-test/join-2 (all: %v)", in[""], in)
		}
	})
}

// inCgroups maps each controller (v1) and "" (v2) to the cgroup a
// /proc/PID/cgroup puts the process in.
func inCgroups(procCgroup string) map[string]string {
	in := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(procCgroup), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			in[c] = f[2]
		}
	}
	return in
}

// cgroup2Mount returns where a cgroup v2 hierarchy is mounted, or "".
func cgroup2Mount(tb testing.TB) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		// ... mount point ... - fstype source options
		pre, post, ok := strings.Cut(line, " - ")
		if f := strings.Fields(pre); ok && len(f) > 4 && strings.HasPrefix(post, "cgroup2 ") {
			return f[4]
		}
	}
	return ""
}

// TestLeftovers finds the sandbox cgroups that hold no process and are
// older than the age given, on v1 and v2.
func TestLeftovers(t *testing.T) {
	for _, v2 := range []bool{false, true} {
		root := mustFakeCgroupfs(t, v2)
		cg, err := Detect(root, "corral")
		if err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-time.Hour)
		// Made by hand, as Create makes them: "not an id" is no sandbox's.
		for _, id := range []string{"task-empty", "task-busy", "task-new", "not an id"} {
			for _, d := range cg.Dirs(id) {
				procs := ""
				if id == "task-busy" {
					procs = "4242\n"
				}
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(procs), 0o644); err != nil {
					t.Fatal(err)
				}
				if id != "task-new" {
					os.Chtimes(d, old, old)
				}
			}
		}
		if got := cg.Leftovers(time.Minute); !slices.Equal(got, []string{"task-empty"}) {
			t.Errorf("v2=%v: Leftovers = %q, want [task-empty]", v2, got)
		}
	}
}

// TestRaiseMemoryFake: the limit goes up by the usage, at most doubled,
// v1's memory+swap limit first, and back again; no limit stays none.
func TestRaiseMemoryFake(t *testing.T) {
	for _, v2 := range []bool{false, true} {
		cg, limit, usage, swap := fakeMemory(t, v2)
		record := filepath.Join(t.TempDir(), "raised")
		for _, c := range []struct{ usage, raised string }{{"300", "1300"}, {"5000", "2000"}} {
			dirs, err := cg.Create("sb-1", sandbox.Limits{MemoryBytes: 1000})
			if err != nil {
				t.Fatal(err)
			}
			if swap != "" {
				os.WriteFile(filepath.Join(dirs[0], swap), []byte("1000"), 0o644)
			}
			os.WriteFile(filepath.Join(dirs[0], usage), []byte(c.usage+"\n"), 0o644)
			putBack, err := RaiseMemory(dirs, record)
			if err != nil {
				t.Fatal(err)
			}
			got := readFiles(t, dirs[0])
			if got[limit] != c.raised || swap != "" && got[swap] != c.raised {
				t.Errorf("v2 %v, usage %s of 1000: raised to %v, want %s", v2, c.usage, got, c.raised)
			}
			if err := putBack(); err != nil {
				t.Fatal(err)
			}
			got = readFiles(t, dirs[0])
			if got[limit] != "1000" || swap != "" && got[swap] != "1000" {
				t.Errorf("v2 %v: put back to %v, want 1000", v2, got)
			}
			if _, err := os.Stat(record); !os.IsNotExist(err) {
				t.Errorf("v2 %v: the raise's record after put back: %v", v2, err)
			}
			os.RemoveAll(dirs[0])
		}
		if swap != "" {
			// An engine's container that may swap above its memory limit
			// keeps its memory+swap limit: above the raised one, it is
			// not touched.
			dirs, err := cg.Create("sb-3", sandbox.Limits{MemoryBytes: 1000})
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(dirs[0], swap), []byte("3000"), 0o644)
			os.WriteFile(filepath.Join(dirs[0], usage), []byte("300\n"), 0o644)
			putBack, err := RaiseMemory(dirs, record)
			if err != nil {
				t.Fatal(err)
			}
			if got := readFiles(t, dirs[0]); got[limit] != "1300" || got[swap] != "3000" {
				t.Errorf("with swap above: raised to %v, want 1300 and the swap limit as it was", got)
			}
			if err := putBack(); err != nil {
				t.Fatal(err)
			}
			if got := readFiles(t, dirs[0]); got[limit] != "1000" || got[swap] != "3000" {
				t.Errorf("with swap above: put back to %v, want 1000 and the swap limit as it was", got)
			}
		}
		dirs, err := cg.Create("sb-2", sandbox.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dirs[0], limit), []byte("max\n"), 0o644)
		os.WriteFile(filepath.Join(dirs[0], usage), []byte("300\n"), 0o644)
		if _, err := RaiseMemory(dirs, record); err != nil {
			t.Fatal(err)
		}
		if got := readFiles(t, dirs[0])[limit]; got != "max\n" {
			t.Errorf("v2 %v: no limit became %q", v2, got)
		}
		if _, err := os.Stat(record); !os.IsNotExist(err) {
			t.Errorf("v2 %v: a raise of no limit left a record: %v", v2, err)
		}
	}
}

// fakeMemory is a prepared hierarchy on a fake cgroupfs of version 2 or
// 1, and the names of its memory limit, usage and (v1) memory+swap limit
// files.
func fakeMemory(t *testing.T, v2 bool) (cg *Hierarchy, limit, usage, swap string) {
	t.Helper()
	cg, err := Detect(mustFakeCgroupfs(t, v2), "corral")
	if err != nil {
		t.Fatal(err)
	}
	if err := cg.Prepare(); err != nil {
		t.Fatal(err)
	}
	if v2 {
		return cg, "memory.max", "memory.current", ""
	}
	return cg, "memory.limit_in_bytes", "memory.usage_in_bytes", "memory.memsw.limit_in_bytes"
}

// TestPutBackAfterADeath: a raise whose maker died before putting it back
// (a server killed in a save) is put back from its record by PutBack, the
// memory+swap limit too, and the record removed; a record of a cgroup gone
// since is removed, and no record is nothing to do.
func TestPutBackAfterADeath(t *testing.T) {
	for _, v2 := range []bool{false, true} {
		cg, limit, usage, swap := fakeMemory(t, v2)
		record := filepath.Join(t.TempDir(), "raised")
		dirs, err := cg.Create("sb-1", sandbox.Limits{MemoryBytes: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if swap != "" {
			os.WriteFile(filepath.Join(dirs[0], swap), []byte("1000"), 0o644)
		}
		os.WriteFile(filepath.Join(dirs[0], usage), []byte("300\n"), 0o644)
		if _, err := RaiseMemory(dirs, record); err != nil { // and its maker dies
			t.Fatal(err)
		}
		if err := PutBack(record); err != nil {
			t.Fatal(err)
		}
		got := readFiles(t, dirs[0])
		if got[limit] != "1000" || swap != "" && got[swap] != "1000" {
			t.Errorf("v2 %v: put back from the record to %v, want 1000", v2, got)
		}
		if _, err := os.Stat(record); !os.IsNotExist(err) {
			t.Errorf("v2 %v: the record after PutBack: %v", v2, err)
		}
		if err := PutBack(record); err != nil {
			t.Errorf("v2 %v: PutBack with no record: %v", v2, err)
		}
		// A record naming another file than a memory limit's is refused
		// and removed, and nothing written.
		os.WriteFile(record, []byte(`{"dir":"`+dirs[0]+`","limit_file":"cgroup.procs","limit":1}`), 0o600)
		if err := PutBack(record); err == nil {
			t.Errorf("v2 %v: PutBack of a record naming cgroup.procs: no error", v2)
		}
		if _, err := os.Stat(record); !os.IsNotExist(err) {
			t.Errorf("v2 %v: a refused record left: %v", v2, err)
		}
		if got := readFiles(t, dirs[0])["cgroup.procs"]; got == "1" {
			t.Errorf("v2 %v: a refused record was written", v2)
		}
		if _, err := RaiseMemory(dirs, record); err != nil {
			t.Fatal(err)
		}
		os.RemoveAll(dirs[0]) // the sandbox ended
		if err := PutBack(record); err != nil {
			t.Errorf("v2 %v: PutBack of a cgroup gone: %v", v2, err)
		}
		if _, err := os.Stat(record); !os.IsNotExist(err) {
			t.Errorf("v2 %v: the record of a cgroup gone: %v", v2, err)
		}
	}
}

// TestMemoryOfSelf: this process's memory cgroup is found, and has the
// limit file of its cgroup version.
func TestMemoryOfSelf(t *testing.T) {
	dirs, err := MemoryOf("/sys/fs/cgroup", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	_, v1 := os.Stat(filepath.Join(dirs[0], "memory.limit_in_bytes"))
	_, v2 := os.Stat(filepath.Join(dirs[0], "memory.max"))
	if v1 != nil && v2 != nil {
		t.Errorf("MemoryOf = %q: no memory limit file there (%v; %v)", dirs, v1, v2)
	}
}
