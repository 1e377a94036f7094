package worker

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/cgroups"
	"github.com/corral-dev/corral/internal/testenv"
)

// threadsHelperEnv makes the test binary the process of
// TestReserveThreads: "reserve" or "none".
const threadsHelperEnv = "WORKER_TEST_THREADS_HELPER"

// blockers is how many goroutines threadsHelper blocks in system calls at
// once once its pids limit is spent: no more than spareThreads.
const blockers = spareThreads

// threadsHelper reserves threads (mode "reserve") or not, says "ready",
// waits for "go" (by then it is in a cgroup whose pids limit is spent),
// blocks goroutines in system calls, each holding a thread, releases them
// and says "done".
func threadsHelper(mode string) {
	if mode == "reserve" {
		ReserveThreads()
	}
	var fds [blockers][2]int
	for i := range fds {
		if err := syscall.Pipe(fds[i][:]); err != nil {
			fmt.Println("pipe:", err)
			os.Exit(1)
		}
	}
	fmt.Println("ready")
	in := bufio.NewReader(os.Stdin)
	if l, _ := in.ReadString('\n'); l != "go\n" {
		os.Exit(1)
	}
	var wg sync.WaitGroup
	for i := range fds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b [1]byte
			syscall.Read(fds[i][0], b[:]) // blocks its thread until written
		}()
	}
	time.Sleep(200 * time.Millisecond)
	for i := range fds {
		syscall.Write(fds[i][1], []byte{1})
	}
	wg.Wait()
	fmt.Println("done")
	os.Exit(0)
}

// TestReserveThreads runs a process in a cgroup whose pids limit it has
// spent, as an agent's fork bomb leaves its worker, and blocks goroutines
// in system calls: with ReserveThreads the runtime has idle threads for
// them; without (the control), it dies unable to start one.
func TestReserveThreads(t *testing.T) {
	testenv.RequireRoot(t)
	cg, err := cgroups.Detect("/sys/fs/cgroup", "corral-test")
	if err == nil {
		err = cg.Prepare()
	}
	if err != nil {
		testenv.Missing(t, "writable cgroup hierarchy: "+err.Error())
	}
	for _, mode := range []string{"reserve", "none"} {
		t.Run(mode, func(t *testing.T) {
			dirs, err := cg.Create("threads-"+mode, sandbox.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cgroups.KillAndRemove(dirs) })
			pidsDir := dirs[0] // v2: the one cgroup
			if !cg.V2() {
				pidsDir = dirs[1] // v1: memory, pids, cpu
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), threadsHelperEnv+"="+mode)
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			out := bufio.NewReader(stdout)
			if l, _ := out.ReadString('\n'); l != "ready\n" {
				cmd.Process.Kill()
				t.Fatalf("helper: %q, %s", l, stderr.String())
			}
			// Every thread of the helper moves into the cgroup, and the
			// limit is set to what it has: no thread or process more.
			write := func(name, v string) {
				if err := os.WriteFile(filepath.Join(pidsDir, name), []byte(v), 0o644); err != nil {
					cmd.Process.Kill()
					t.Fatal(err)
				}
			}
			write("cgroup.procs", strconv.Itoa(cmd.Process.Pid))
			cur, err := os.ReadFile(filepath.Join(pidsDir, "pids.current"))
			if err != nil {
				cmd.Process.Kill()
				t.Fatal(err)
			}
			write("pids.max", strings.TrimSpace(string(cur)))
			fmt.Fprintln(stdin, "go")
			l, _ := out.ReadString('\n')
			err = cmd.Wait()
			switch mode {
			case "reserve":
				if l != "done\n" || err != nil {
					t.Errorf("with threads reserved: %q, %v; stderr:\n%s", l, err, clipLines(stderr.String()))
				}
			case "none":
				// The message of a static build, and of one with cgo.
				if err == nil || !strings.Contains(stderr.String(), "failed to create new OS thread") && !strings.Contains(stderr.String(), "pthread_create failed") {
					t.Errorf("the control, without a reserve, did not fail starting a thread: %q, %v; stderr:\n%s", l, err, clipLines(stderr.String()))
				}
			}
		})
	}
}

// clipLines is the first lines of s.
func clipLines(s string) string {
	lines := strings.SplitN(s, "\n", 6)
	return strings.Join(lines[:min(len(lines), 5)], "\n")
}
