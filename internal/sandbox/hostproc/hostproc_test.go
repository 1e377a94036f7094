//go:build linux

package hostproc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// mustStartSleep starts `sleep d` and kills and reaps it at cleanup.
func mustStartSleep(tb testing.TB, d string) *exec.Cmd {
	tb.Helper()
	cmd := exec.Command("sleep", d)
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start sleep: %v", err)
	}
	tb.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

func TestStartTimeAndAlive(t *testing.T) {
	pid := os.Getpid()
	start, err := StartTime(pid)
	if err != nil || start == 0 {
		t.Fatalf("StartTime(self) = %d, %v", start, err)
	}
	if !Alive(pid, start) {
		t.Errorf("Alive(self) = false")
	}
	if Alive(pid, start+1) {
		t.Errorf("Alive with another start time = true")
	}
	if Alive(0, start) {
		t.Errorf("Alive(0) = true")
	}
	if _, err := StartTime(-1); err == nil {
		t.Errorf("StartTime(-1) succeeded")
	}
}

func TestZombieIsNotAlive(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	pid := cmd.Process.Pid
	start, err := StartTime(pid)
	if err != nil {
		t.Fatalf("StartTime: %v", err)
	}
	// Not reaped yet: the exited process stays a zombie.
	deadline := time.Now().Add(10 * time.Second)
	for Alive(pid, start) {
		if time.Now().After(deadline) {
			t.Fatalf("exited process %d still alive after 10s", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWait(t *testing.T) {
	cmd := mustStartSleep(t, "0.2")
	start, err := StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := Wait(ctx, cmd.Process.Pid, start); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if Alive(cmd.Process.Pid, start) {
		t.Errorf("Wait returned while the process runs")
	}
}

func TestWaitCanceled(t *testing.T) {
	cmd := mustStartSleep(t, "60")
	start, err := StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := Wait(ctx, cmd.Process.Pid, start); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait = %v, want DeadlineExceeded", err)
	}
	// Another start time names another process: nothing to wait for.
	if err := Wait(context.Background(), cmd.Process.Pid, start+1); err != nil {
		t.Errorf("Wait for a reused pid = %v, want nil", err)
	}
}

func TestNamespaceAndChildren(t *testing.T) {
	ns := PidNamespace(os.Getpid())
	if ns == 0 {
		t.Fatalf("PidNamespace(self) = 0")
	}
	if PidNamespace(-1) != 0 {
		t.Errorf("PidNamespace(-1) != 0")
	}
	cmd := mustStartSleep(t, "60")
	pids := PidsInNamespace(ns)
	for _, want := range []int{os.Getpid(), cmd.Process.Pid} {
		if !slices.Contains(pids, want) {
			t.Errorf("PidsInNamespace misses %d", want)
		}
	}
	if PidsInNamespace(0) != nil {
		t.Errorf("PidsInNamespace(0) != nil")
	}
	// A shell is single-threaded: its children file (per thread) lists
	// the sleep it forks.
	sh := startShell(t, ns, "sleep 60 & wait")
	waitDone(t, WatchExec(sh.Process.Pid), "sh that forked sleep")
	if WatchExec(cmd.Process.Pid).Done() {
		t.Errorf("WatchExec(sleep).Done() = true: it has no child")
	}
	// A child that runs the parent's program (as a forked child has until
	// it executes another) does not count.
	sub := startShell(t, ns, "sh -c 'sleep 60; :' & wait")
	for deadline := time.Now().Add(10 * time.Second); !slices.ContainsFunc(PidsInNamespace(ns), func(p int) bool { return ppid(p) == sub.Process.Pid }); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("sh forked no child in 10s")
		}
	}
	if WatchExec(sub.Process.Pid).Done() {
		t.Errorf("WatchExec(sh).Done() = true for a child that runs sh too")
	}
	// One watch, polled: the child is a subshell (sh) first, found and
	// kept, then, once go exists, executes sleep.
	gate := filepath.Join(t.TempDir(), "go")
	later := startShell(t, ns, "(while [ ! -e "+gate+" ]; do sleep 0.01; done; exec sleep 60) & wait")
	w := WatchExec(later.Process.Pid)
	for deadline := time.Now().Add(10 * time.Second); w.child == ""; time.Sleep(time.Millisecond) {
		if w.Done() {
			t.Fatal("WatchExec(sh).Done() = true while its child is a subshell")
		}
		if time.Now().After(deadline) {
			t.Fatal("sh forked no subshell in 10s")
		}
	}
	if w.Done() {
		t.Fatal("WatchExec(sh).Done() = true while its child is a subshell")
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitDone(t, w, "sh whose subshell executes sleep")
}

// TestPidNS: a namespace is held only under its own inode number, and
// Signal reaches its processes (signal 0: none is disturbed).
func TestPidNS(t *testing.T) {
	ns := PidNamespace(os.Getpid())
	if n := OpenPidNS(os.Getpid(), ns+1); n != nil {
		n.Close()
		t.Errorf("OpenPidNS with another namespace's number held one")
	}
	if OpenPidNS(-1, ns) != nil || OpenPidNS(os.Getpid(), 0) != nil {
		t.Errorf("OpenPidNS of no process or no namespace held one")
	}
	n := OpenPidNS(os.Getpid(), ns)
	if n == nil {
		t.Fatal("OpenPidNS(self) = nil")
	}
	defer n.Close()
	mustStartSleep(t, "60")
	if got := n.Signal(0); got < 2 {
		t.Errorf("Signal(0) reached %d processes, want this one and its sleep at least", got)
	}
}

// waitDone polls w for up to 10 s.
func waitDone(t *testing.T, w *ExecWatch, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !w.Done(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("WatchExec(%s).Done() = false after 10 s", what)
		}
	}
}

// startShell runs sh -c script, and kills it and its children (in pid
// namespace ns) when the test ends.
func startShell(t *testing.T, ns uint64, script string) *exec.Cmd {
	t.Helper()
	sh := exec.Command("sh", "-c", script)
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range PidsInNamespace(ns) {
			if ppid(p) == sh.Process.Pid {
				syscall.Kill(p, syscall.SIGKILL)
			}
		}
		sh.Process.Kill()
		sh.Wait()
	})
	return sh
}

// ppid returns pid's parent pid (field 4 of /proc/pid/stat), or 0.
func ppid(pid int) int {
	f, err := stat(pid)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

func TestRunningAndWaitExit(t *testing.T) {
	cmd := mustStartSleep(t, "60")
	pid := cmd.Process.Pid
	start, err := StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	// A started process: done decides, not /proc.
	done := make(chan struct{})
	if !Running(done, pid, start+1) {
		t.Errorf("Running with open done = false")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := WaitExit(ctx, done, pid, start); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitExit with open done = %v, want DeadlineExceeded", err)
	}
	close(done)
	if Running(done, pid, start) {
		t.Errorf("Running with closed done = true")
	}
	if err := WaitExit(context.Background(), done, pid, start); err != nil {
		t.Errorf("WaitExit with closed done = %v", err)
	}
	// A recovered process (done nil): /proc decides.
	if !Running(nil, pid, start) {
		t.Errorf("Running(nil) of a running process = false")
	}
	if Running(nil, pid, start+1) {
		t.Errorf("Running(nil) with another start time = true")
	}
	cmd.Process.Kill()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	if err := WaitExit(ctx2, nil, pid, start); err != nil {
		t.Errorf("WaitExit(nil) of a killed process = %v", err)
	}
}
