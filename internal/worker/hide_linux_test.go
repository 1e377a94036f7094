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
// it is dumpable, and waits for its stdin to close.
const hideHelperEnv = "WORKER_TEST_HIDE"

func hideHelper(name string) {
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

// TestHideFromAgent: a process that hid a variable still has its value,
// is not dumpable, and its environment as /proc shows it (to root, which
// may read it anyway) no longer holds the value.
func TestHideFromAgent(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), hideHelperEnv+"=CORRAL_TEST_SECRET", "CORRAL_TEST_SECRET=s3cret-value")
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
	defer cmd.Wait()
	defer stdin.Close()
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if line != "s3cret-value dumpable=0\n" {
		t.Fatalf("the helper said %q, want the value and not dumpable", line)
	}
	// The same process (the re-execution keeps its pid).
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", cmd.Process.Pid))
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
}
