package worker

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// hideHelperEnv makes the test binary a process that hides the variable
// it names with HideFromAgent, prints the value it got back and whether
// it is dumpable, and waits for its stdin to close. With hideReexecEnv
// set it takes gVisor's path (re-execution) on any kernel.
const (
	hideHelperEnv = "WORKER_TEST_HIDE"
	hideReexecEnv = "WORKER_TEST_HIDE_REEXEC"
)

func hideHelper(name string) {
	if os.Getenv(hideReexecEnv) != "" {
		environGuarded = func() bool { return false }
	}
	env, err := HideFromAgent(os.Environ(), name)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	v, _ := lookupEnv(env, name)
	dumpable, _ := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	fmt.Printf("%s dumpable=%d\n", v, dumpable)
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// TestHideFromAgent: a process that hid a variable still has its value
// and is not dumpable. On Linux (environGuarded) that is all: the kernel
// then closes its environ and memory to the agent's uid (the escape probe
// checks it, as that uid, under every runtime). On gVisor's path it also
// executes itself again, and its environment as /proc shows it (to root,
// which may read it anyway) no longer holds the value.
func TestHideFromAgent(t *testing.T) {
	if !environGuarded() {
		t.Errorf("environGuarded is false on this Linux kernel: every worker would start twice")
	}
	t.Run("linux", func(t *testing.T) {
		pid := runHideHelper(t, false)
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err == nil && !strings.Contains(string(environ), "s3cret-value") {
			t.Errorf("the helper executed itself again on Linux: %q", environ)
		}
	})
	t.Run("gvisor", func(t *testing.T) {
		pid := runHideHelper(t, true)
		// The same process (the re-execution keeps its pid).
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		switch {
		case err != nil && !errors.Is(err, fs.ErrPermission):
			t.Fatal(err)
		case err != nil:
			// Not root: a non-dumpable process's environ is closed to us.
		case strings.Contains(string(environ), "s3cret-value"):
			t.Errorf("the helper's environment still holds the secret: %q", environ)
		case !strings.Contains(string(environ), hideHelperEnv+"="):
			t.Errorf("read no environment of the helper: %q", environ)
		}
	})
}

// runHideHelper starts the helper process (on gVisor's path if reexec),
// checks what it says, and returns its pid; it ends with the test.
func runHideHelper(t *testing.T, reexec bool) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), hideHelperEnv+"=CORRAL_TEST_SECRET", "CORRAL_TEST_SECRET=s3cret-value")
	if reexec {
		cmd.Env = append(cmd.Env, hideReexecEnv+"=1")
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if line != "s3cret-value dumpable=0\n" {
		t.Fatalf("the helper said %q, want the value and not dumpable", line)
	}
	return cmd.Process.Pid
}
