package worker

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
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
// TestReserveThreads, in one of threadCases' modes.
const threadsHelperEnv = "WORKER_TEST_THREADS_HELPER"

type threadCase struct {
	mode     string
	reserve  func() // nil: none (a control)
	blockers int
	gc       bool
	env      string
}

// threadCases are TestReserveThreads' helper processes: the worker's
// reserve and the reaper's, each with its control, which reserves none.
// Once its pids limit is spent, a worker blocks as many goroutines in
// system calls as it has spare threads; a reaper, on a host of 16 CPUs,
// blocks one (its wait) and collects garbage, which starts a mark worker
// per P.
var threadCases = []threadCase{
	{"worker", ReserveThreads, spareThreads, false, ""},
	{"worker-control", nil, spareThreads, false, ""},
	{"reaper", ReserveReaperThreads, 1, true, "GOMAXPROCS=16"},
	{"reaper-control", nil, 1, true, "GOMAXPROCS=16"},
}

// threadsHelper reserves threads as its mode says, says "ready", waits
// for "go" (by then it is in a cgroup whose pids limit is spent), blocks
// goroutines in system calls, each holding a thread, collects garbage if
// its mode says, releases them and says "done".
func threadsHelper(mode string) {
	i := slices.IndexFunc(threadCases, func(c threadCase) bool { return c.mode == mode })
	if i < 0 {
		fmt.Println("no mode", mode)
		os.Exit(1)
	}
	c := threadCases[i]
	if c.reserve != nil {
		c.reserve()
	}
	fds := make([][2]int, c.blockers)
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
	if c.gc {
		runtime.GC()
	}
	for i := range fds {
		syscall.Write(fds[i][1], []byte{1})
	}
	wg.Wait()
	fmt.Println("done")
	os.Exit(0)
}

// TestReserveThreads runs a process in a cgroup whose pids limit it has
// spent, as an agent's fork bomb leaves its worker and pid 1, and blocks
// goroutines in system calls (and, as pid 1, collects garbage): with
// ReserveThreads or ReserveReaperThreads the runtime has idle threads
// for them; without (the controls), it dies unable to start one.
func TestReserveThreads(t *testing.T) {
	testenv.RequireRoot(t)
	cg, err := cgroups.Detect("/sys/fs/cgroup", "corral-test")
	if err == nil {
		err = cg.Prepare()
	}
	if err != nil {
		testenv.Missing(t, "writable cgroup hierarchy: "+err.Error())
	}
	for _, c := range threadCases {
		t.Run(c.mode, func(t *testing.T) {
			dirs, err := cg.Create("threads-"+c.mode, sandbox.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cgroups.KillAndRemove(dirs) })
			pidsDir := dirs[0] // v2: the one cgroup
			if !cg.V2() {
				pidsDir = dirs[1] // v1: memory, pids, cpu
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), threadsHelperEnv+"="+c.mode)
			if c.env != "" {
				cmd.Env = append(cmd.Env, c.env)
			}
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
			switch {
			case c.reserve != nil:
				if l != "done\n" || err != nil {
					t.Errorf("with threads reserved: %q, %v; stderr:\n%s", l, err, clipLines(stderr.String()))
				}
			default:
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
