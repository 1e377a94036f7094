package workercmd

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/sandbox/warmstart"
)

// warmIdleTestEnv makes this test binary a warm sandbox's main process
// (Main "warm"), waiting on warmstart.FD.
const warmIdleTestEnv = "CORRAL_TEST_WARM_IDLE"

// TestWarmIdleThreads starts a warm worker as on a host of 64 CPUs and as
// on one of 2 (GOMAXPROCS in its environment, which Go sets from the
// host's CPUs otherwise) and counts its threads once it waits for a task:
// about the same. Without the cap on GOMAXPROCS, the garbage collection
// it runs before it waits started a mark worker's thread per P, and the
// runtime keeps idle threads: 20 threads against 5, each one memory and
// one of its sandbox's pids. With it, 5 to 7 against 5 or 6 (70 runs, most
// beside busy loops): the runtime may start a thread or two while it
// starts with 64 Ps, before Main caps them.
func TestWarmIdleThreads(t *testing.T) {
	few := idleWarmThreads(t, 2)
	many := idleWarmThreads(t, 64)
	t.Logf("threads of an idle warm worker: %d as on 2 CPUs, %d as on 64", few, many)
	if many > few+3 {
		t.Errorf("an idle warm worker has %d threads as on 64 CPUs, %d as on 2", many, few)
	}
}

// idleWarmThreads starts the warm worker with GOMAXPROCS=procs, waits
// until it idles (its threads all asleep, their number the same, over
// four looks 50 ms apart), returns how many threads it has, then closes
// its descriptor, which must end it with 0 (no task).
func idleWarmThreads(t *testing.T, procs int) int {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), warmIdleTestEnv+"=1", "GOMAXPROCS="+strconv.Itoa(procs))
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = make([]*os.File, warmstart.FD-2)
	for i := range cmd.ExtraFiles {
		cmd.ExtraFiles[i] = null
	}
	cmd.ExtraFiles[warmstart.FD-3] = r
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	defer cmd.Process.Kill()
	task := filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "task")
	n, same := 0, 0
	for deadline := time.Now().Add(10 * time.Second); same < 4; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("GOMAXPROCS=%d: the warm worker did not idle in 10 s (%d threads)", procs, n)
		}
		m, asleep := threadsAsleep(t, task)
		if m == n && asleep {
			same++
		} else {
			n, same = m, 0
		}
	}
	w.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("GOMAXPROCS=%d: the warm worker, its descriptor closed: %v", procs, err)
	}
	return n
}

// threadsAsleep returns how many threads a process has (its /proc/PID/task
// dir) and whether all are asleep.
func threadsAsleep(t *testing.T, task string) (int, bool) {
	t.Helper()
	ents, err := os.ReadDir(task)
	if err != nil {
		t.Fatal(err)
	}
	asleep := true
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(task, e.Name(), "stat"))
		if err != nil {
			return 0, false // a thread came or went
		}
		// pid (comm) state ...: comm is this test binary's name.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) == 0 || f[0] != "S" {
			asleep = false
		}
	}
	return len(ents), asleep
}

// startWarm starts this test binary as a warm sandbox's main process (Main
// "warm") with the start pipe on warmstart.FD and ack on
// warmstart.AckFD, and returns the command and the pipe's write end.
func startWarm(t *testing.T, ack *os.File) (*exec.Cmd, *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), warmIdleTestEnv+"=1")
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = []*os.File{null, null, r, ack} // fds 3 to 6
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	t.Cleanup(func() { cmd.Process.Kill() })
	return cmd, w
}

// TestWarmAcknowledgesItsStart: a warm worker that gets a start writes
// warmstart.Ack before it runs any of it, and what it runs has neither
// the start pipe nor the acknowledgement's descriptor; one whose pipe
// closes with no start acknowledges nothing. The server tells from it,
// after a restart, a sandbox that never had its task from one whose
// command ran (sandbox.ExitStatus.NotStarted).
func TestWarmAcknowledgesItsStart(t *testing.T) {
	dir := t.TempDir()
	ackPath, out := filepath.Join(dir, "ack"), filepath.Join(dir, "out")
	ack, err := os.Create(ackPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ack.Close()
	cmd, w := startWarm(t, ack)
	// The command sees the acknowledgement already written, and its own
	// descriptors 5 and 6 closed.
	script := `cat "$ACK" > "$OUT"; for fd in 5 6; do [ -e /proc/$$/fd/$fd ] && echo "fd $fd open" >> "$OUT"; done; exit 0`
	if err := warmstart.Send(w, warmstart.Start{Argv: []string{"/bin/sh", "-c", script}, Env: []string{"ACK=" + ackPath, "OUT=" + out}, Dir: dir}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the warm worker with a start: %v", err)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != warmstart.Ack {
		t.Errorf("what the task's command saw: %q %v; want the acknowledgement written, and no descriptor 5 or 6", b, err)
	}

	noTask := filepath.Join(dir, "no-task")
	ack2, err := os.Create(noTask)
	if err != nil {
		t.Fatal(err)
	}
	defer ack2.Close()
	cmd, w = startWarm(t, ack2)
	w.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the warm worker released without a task: %v", err)
	}
	if b, err := os.ReadFile(noTask); err != nil || len(b) != 0 {
		t.Errorf("a warm worker released without a task acknowledged %q (%v); want nothing", b, err)
	}
}
