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
