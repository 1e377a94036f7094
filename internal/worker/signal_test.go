package worker

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// waitForFile polls until name exists, for up to 10 seconds.
func waitForFile(tb testing.TB, name string) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(name); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	tb.Errorf("%s did not appear", name)
}

func readPid(tb testing.TB, name string) int {
	tb.Helper()
	waitForFile(tb, name)
	// The shell creates the file before it writes the pid: wait for a
	// whole line.
	deadline := time.Now().Add(5 * time.Second)
	for {
		content := mustReadFile(tb, name)
		pid, err := strconv.Atoi(strings.TrimSpace(content))
		if err == nil && strings.HasSuffix(content, "\n") {
			return pid
		}
		if time.Now().After(deadline) {
			tb.Fatalf("pid file %s: %q: %v", name, content, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// mustBeDead checks that pid has exited (a zombie nobody reaped yet counts
// as dead), waiting up to 5 seconds for it.
func mustBeDead(tb testing.TB, pid int) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := syscall.Kill(pid, 0)
		if errors.Is(err, syscall.ESRCH) {
			return
		}
		if stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
			if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) > 0 && f[0] == "Z" {
				return
			}
		}
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			tb.Errorf("process %d still alive", pid)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSIGTERMStopsAgentGroup runs a real worker process, sends it SIGTERM,
// and checks that every process of the agent's group ended.
func TestSIGTERMStopsAgentGroup(t *testing.T) {
	dir := MustTaskDir(t)
	args, _ := json.Marshal([]string{
		"--task-id", "task-1", "--task-dir", dir, "--prompt", filepath.Join(dir, "prompt.md"), "--grace", "5s",
		"--", "sh", "-c", `sleep 100 & echo $! > bg.pid; sleep 100 & echo $! > fg.pid; wait`,
	})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperArgsEnv+"="+string(args))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	bg, fg := readPid(t, filepath.Join(dir, "bg.pid")), readPid(t, filepath.Join(dir, "fg.pid"))
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("worker did not exit after SIGTERM; stderr:\n%s", stderr.String())
	}
	if elapsed := time.Since(start); elapsed > 4*time.Second {
		t.Errorf("took %s: the group should end on SIGTERM, not wait for SIGKILL", elapsed)
	}
	if got := cmd.ProcessState.ExitCode(); got != 128+int(syscall.SIGTERM) {
		t.Errorf("worker exit code %d, want %d; stderr:\n%s", got, 128+int(syscall.SIGTERM), stderr.String())
	}
	mustBeDead(t, bg)
	mustBeDead(t, fg)
	st := mustReadStatus(t, dir)
	if st.Status != "failed" || st.ExitCode != 143 || !strings.HasPrefix(st.ErrorMessage, "stopped before the agent finished: exit code 143 (signal: terminated)") {
		t.Errorf("status %q, exit %d, error %q", st.Status, st.ExitCode, st.ErrorMessage)
	}
}

// TestLeftoverChildrenAreEnded checks that a background child the agent
// left behind does not keep the worker waiting on its output.
func TestLeftoverChildrenAreEnded(t *testing.T) {
	dir := MustTaskDir(t)
	start := time.Now()
	code, st := MustRun(t, shOptions(dir, `sleep 100 & echo $! > bg.pid; echo done`))
	if code != 0 || st.Summary != "done" {
		t.Errorf("exit %d, summary %q", code, st.Summary)
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("took %s", elapsed)
	}
	mustBeDead(t, readPid(t, filepath.Join(dir, "bg.pid")))
}
