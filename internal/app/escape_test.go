//go:build integration

package app_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/orchestrator"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// escapeRuntimes are the runtimes the escape suite runs under. A runtime
// joins by adding its name here: every subtest then runs under it too.
var escapeRuntimes = []string{"local", "gvisor"}

// TestEscape runs the escape probe and the resource limit checks under
// every runtime in escapeRuntimes, through the whole server.
func TestEscape(t *testing.T) {
	probe := mustBuildProbe(t)
	for _, rt := range escapeRuntimes {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			if rt == "gvisor" {
				testenv.RequireRunsc(t)
			}
			t.Run("probe", func(t *testing.T) { t.Parallel(); testProbe(t, rt, probe) })
			t.Run("symlink out of output", func(t *testing.T) { t.Parallel(); testSymlinkOut(t, rt) })
			if rt == "gvisor" {
				// gVisor's processes are not host processes, so the fork
				// bomb's host-side count does not apply; its pids and
				// memory limits are in the runtime's conformance suite
				// (internal/sandbox/gvisor).
				return
			}
			t.Run("fork bomb", func(t *testing.T) { t.Parallel(); testForkBomb(t, rt) })
			t.Run("memory bomb", func(t *testing.T) { t.Parallel(); testMemoryBomb(t, rt) })
			// The timeout killing the whole process tree is
			// TestTimeoutKillsTheTree (default runtime).
		})
	}
}

// mustBuildProbe builds the probe program into a temporary directory:
// static, so it runs in any sandbox image.
func mustBuildProbe(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "probe")
	cmd := exec.Command("go", "build", "-o", path, "github.com/corral-dev/corral/internal/sandbox/sandboxtest/probe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build probe: %v\n%s", err, out)
	}
	return path
}

// probeResult is one check of the probe's report.
type probeResult struct {
	OK      bool   `json:"ok"`
	Detail  string `json:"detail"`
	Control bool   `json:"control"`
}

func testProbe(t *testing.T, rt, probe string) {
	s := MustStart(t, nil)
	ctx := context.Background()

	// The probe runs from the shared workspace, which the sandbox sees
	// read-only at /workspace/shared.
	b, err := os.ReadFile(probe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.data, "shared", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.data, "shared", "bin", "probe"), b, 0o755); err != nil {
		t.Fatal(err)
	}

	// Another task, whose directory the probe must not reach.
	victim := s.spawn(t, "the victim", "sh", "-c", "echo secret > output/secret.txt")
	if res := s.wait(t, victim.ID, 60*time.Second); res.Status != task.Success {
		t.Fatalf("victim task: %s %s", res.Status, res.ErrorMessage)
	}
	victimDir := filepath.Join(s.data, "tasks", victim.ID)

	// A service on the host's loopback, counting connections.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var accepted atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()

	// A host process the probe must not see: its $0 is the marker.
	marker := "corral-escape-marker-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	marker = strings.ReplaceAll(marker, " ", "-")
	host := exec.Command("sh", "-c", "sleep 600; :", marker)
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Process.Kill(); host.Wait() })
	if !markerVisible(marker) {
		t.Fatalf("the marker process is not visible on the host either")
	}

	argv := []string{"/workspace/shared/bin/probe", "--sandboxed",
		"--read", filepath.Join(s.data, "corral.db"),
		"--read", s.data,
		"--read", victimDir,
		"--read", filepath.Join(victimDir, "output", "secret.txt"),
		"--read", "/task/../tasks/" + victim.ID + "/output/secret.txt",
		"--write", filepath.Join(victimDir, "output", "x"),
		"--write", filepath.Join(s.data, "x"),
		"--write", "/task/../" + victim.ID + "-x",
		"--connect", ln.Addr().String(),
		"--connect", "1.1.1.1:443",
		"--host-marker=" + marker,
	}
	tk, _, err := s.client.Spawn(ctx, orchestrator.SpawnRequest{TaskDescription: "try to get out", Agent: "command", Command: argv, Runtime: rt})
	if err != nil {
		t.Fatal(err)
	}
	res := s.wait(t, tk.ID, 90*time.Second)
	if res.Status != task.Success {
		t.Fatalf("probe task: %s %s", res.Status, res.ErrorMessage)
	}
	raw, err := os.ReadFile(filepath.Join(s.data, "tasks", tk.ID, "output", "probe.json"))
	if err != nil {
		t.Fatalf("the probe wrote no report: %v", err)
	}
	var report map[string]probeResult
	if err := json.Unmarshal(raw, &report); err != nil {
		t.Fatalf("decode report: %v\n%s", err, raw)
	}

	// Every check must be there: a probe that skipped one proves nothing.
	want := []string{
		"read " + filepath.Join(s.data, "corral.db"), "read " + s.data, "read " + victimDir,
		"write /workspace/shared/x", "write /usr/x", "write /etc/x", "write /x",
		"write " + filepath.Join(victimDir, "output", "x"),
		"connect " + ln.Addr().String(), "connect 1.1.1.1:443", "dns example.com",
		"raw socket AF_PACKET", "raw socket AF_INET", "bash /dev/tcp", "host processes", "capabilities",
		"uid 0", "ptrace traceme", "ptrace attach pid 1", "open /proc/1/mem", "open /proc/1/task/1/mem", "mount tmpfs",
		"unshare user namespace", "unshare network namespace", "unshare user and network namespaces",
		"keyctl", "bpf", "io_uring_setup", "perf_event_open",
		// Controls: these must hold for the rest to mean anything.
		"no_new_privs", "write /tmp/x", "connect own loopback listener",
	}
	for _, name := range want {
		if _, ok := report[name]; !ok {
			t.Errorf("report lacks check %q", name)
		}
	}
	for name, r := range report {
		switch {
		case r.Control && !r.OK:
			t.Errorf("control %q failed: %s", name, r.Detail)
		case !r.Control && r.OK:
			t.Errorf("ESCAPE %q: %s", name, r.Detail)
		case r.Control:
			t.Logf("%-40s control holds: %s", name, r.Detail)
		default:
			t.Logf("%-40s closed: %s", name, r.Detail)
		}
	}
	if d := report["uid 0"].Detail; !strings.HasPrefix(d, "uid 1000 euid 1000") {
		t.Errorf("probe ran as %q, want uid 1000", d)
	}

	// And from outside: nothing reached the host.
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host's loopback listener accepted %d connections", n)
	}
	for _, p := range []string{
		filepath.Join(victimDir, "output", "x"), filepath.Join(s.data, "x"),
		filepath.Join(s.data, "shared", "x"), filepath.Join(s.data, "tasks", victim.ID+"-x"),
	} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("the probe created %s on the host", p)
		}
	}
	if b, err := os.ReadFile("/usr/x"); err == nil && strings.Contains(string(b), "probe was here") {
		t.Errorf("the probe wrote the host's /usr/x")
	}
}

// markerVisible reports whether a host process has an argv element equal
// to marker.
func markerVisible(marker string) bool {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err == nil && slices.Contains(strings.Split(string(b), "\x00"), marker) {
				return true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// countProcesses counts host processes whose argv is exactly argv.
func countProcesses(argv ...string) int {
	want := strings.Join(argv, "\x00") + "\x00"
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && string(b) == want {
			n++
		}
	}
	return n
}

// testForkBomb: processes stop at the pids limit, and the server answers
// while the bomb runs.
func testForkBomb(t *testing.T, rt string) {
	s := MustStart(t, nil)
	ctx := context.Background()
	const pids = 40
	tk, _, err := s.client.Spawn(ctx, orchestrator.SpawnRequest{
		TaskDescription: "fork bomb", Agent: "command", Runtime: rt, TimeoutMinutes: 5,
		// bash, unlike dash, survives a failed fork and keeps trying.
		Command:   []string{"bash", "-c", "while :; do sleep 1004 & done"},
		Resources: &orchestrator.ResourceRequest{PidsLimit: pids, CPULimit: "500m"},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.waitStatus(t, tk.ID, task.Running, 20*time.Second)
	t.Cleanup(func() {
		s.client.Cancel(context.Background(), tk.ID)
		waitGone(t, "sleep", "1004")
	})
	// For 5 s after the first sleep shows, the count never passes the
	// limit (the worker, bash and bwrap's reaper count too) and the
	// server answers every health check within 2 s.
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for countProcesses("sleep", "1004") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the bomb never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	most, checks := 0, 0
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); checks++ {
		start := time.Now()
		resp, err := client.Get(s.url + "/healthz")
		if err != nil {
			t.Fatalf("healthz during the fork bomb: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("healthz during the fork bomb: %d after %s", resp.StatusCode, time.Since(start))
		}
		n := countProcesses("sleep", "1004")
		if n > pids {
			t.Fatalf("%d sleeps run, over the pids limit of %d", n, pids)
		}
		most = max(most, n)
		time.Sleep(50 * time.Millisecond)
	}
	if most < pids/4 {
		t.Errorf("at most %d sleeps ran; the bomb did not reach the limit of %d", most, pids)
	}
	if st, err := s.client.Get(ctx, tk.ID); err != nil || st.Status != task.Running {
		t.Errorf("the bombing task is %v (%v), want still running until cancelled", st.Status, err)
	}
	t.Logf("fork bomb held at %d sleeps (pids limit %d) over %d health checks", most, pids, checks)
}

// testMemoryBomb: a process past the memory limit is killed and the task
// fails saying so.
func testMemoryBomb(t *testing.T, rt string) {
	s := MustStart(t, nil)
	tk, _, err := s.client.Spawn(context.Background(), orchestrator.SpawnRequest{
		TaskDescription: "memory bomb", Agent: "command", Runtime: rt, TimeoutMinutes: 2,
		// The shell holds 400 MB of "a" in a variable.
		Command:   []string{"sh", "-c", `x=$(head -c 400000000 /dev/zero | tr '\0' a); echo survived ${#x} > output/survived.txt`},
		Resources: &orchestrator.ResourceRequest{MemoryLimit: "64Mi"},
	})
	if err != nil {
		t.Fatal(err)
	}
	res := s.wait(t, tk.ID, 100*time.Second)
	if res.Status != task.Failed {
		t.Fatalf("status %s, want failed", res.Status)
	}
	if !strings.Contains(res.ErrorMessage, "memory") {
		t.Errorf("error_message %q does not mention memory", res.ErrorMessage)
	}
	if _, err := os.Stat(filepath.Join(s.data, "tasks", tk.ID, "output", "survived.txt")); err == nil {
		t.Errorf("the memory bomb ran to the end")
	}
}

// testSymlinkOut: a symlink in output/ pointing outside is neither listed
// nor served.
func testSymlinkOut(t *testing.T, rt string) {
	s := MustStart(t, nil)
	tk, _, err := s.client.Spawn(context.Background(), orchestrator.SpawnRequest{
		TaskDescription: "symlinks out", Agent: "command", Runtime: rt,
		Command: []string{"sh", "-c", "ln -s /etc/passwd output/link && ln -s ../../../corral.db output/db && echo hi > output/real.txt"},
	})
	if err != nil {
		t.Fatal(err)
	}
	res := s.wait(t, tk.ID, 60*time.Second)
	if res.Status != task.Success {
		t.Fatalf("status %s: %s", res.Status, res.ErrorMessage)
	}
	var names []string
	for _, f := range res.OutputFiles {
		names = append(names, f.Name)
	}
	if !slices.Contains(names, "real.txt") || slices.Contains(names, "link") || slices.Contains(names, "db") {
		t.Errorf("output_files = %v, want real.txt and no symlinks", names)
	}
	for _, name := range []string{"link", "db"} {
		code, body := s.do(t, "GET", "/api/tasks/"+tk.ID+"/files/"+name, "", nil)
		if code == 200 || code >= 500 || strings.Contains(body, "root:") || strings.Contains(body, "SQLite") {
			t.Errorf("GET files/%s = %d %q, want refused", name, code, body)
		}
	}
	if code, body := s.do(t, "GET", "/api/tasks/"+tk.ID+"/files/real.txt", "", nil); code != 200 || body != "hi\n" {
		t.Errorf("GET files/real.txt = %d %q", code, body)
	}
}
