package workercmd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/testenv"
	"github.com/corral-dev/corral/internal/worker"
	"github.com/corral-dev/corral/internal/workerproto"
)

// reapTestEnv selects what this test binary does when it runs as a
// sandbox's pid 1 (reap) and as the worker reap starts again.
const reapTestEnv = "CORRAL_TEST_REAP"

// The webhook key pid 1 is started with, which the worker must get on
// the pipe, never in its environment.
const reapTestKey = "key-for-the-reap-test"

func TestMain(m *testing.M) {
	if mode := os.Getenv(reapTestEnv); mode != "" {
		if os.Getpid() == 1 {
			os.Exit(reap(os.Environ(), os.Stderr))
		}
		os.Exit(reapTestWorker(mode))
	}
	if os.Getenv(subreaperTestEnv) != "" {
		os.Exit(Main(context.Background(), append([]string{"subreaper"}, os.Args[1:]...), os.Stderr))
	}
	if os.Getenv(warmIdleTestEnv) != "" {
		os.Exit(Main(context.Background(), []string{"warm"}, os.Stderr))
	}
	os.Exit(m.Run())
}

// reapTestWorker is the worker under reap, for mode: "orphans" leaves 8
// orphans that exit, then exits 7 once all are reaped (3 if one is not
// after 5 s); "sigterm" says "ready" once pid 1 forwards signals, waits
// for SIGTERM and exits 42. Both first check that the webhook key came on the
// pipe, out of the environment (exit 5 if not), and that pid 1 had
// executed itself again, without it, by then (exit 4 if not).
func reapTestWorker(mode string) int {
	env, err := worker.HideFromAgent(os.Environ(), workerproto.EnvWebhookKey)
	if err != nil || os.Getenv(workerproto.EnvWebhookKey) != "" || !slices.Contains(env, workerproto.EnvWebhookKey+"="+reapTestKey) {
		fmt.Fprintf(os.Stderr, "the key: %v; in the environment: %q\n", err, os.Getenv(workerproto.EnvWebhookKey))
		return 5
	}
	// The key arrived: pid 1 (whose environment root reads) holds it no
	// more.
	if b, err := os.ReadFile("/proc/1/environ"); err != nil || bytes.Contains(b, []byte(reapTestKey)) || !bytes.Contains(b, []byte(reapChildEnv+"=")) {
		fmt.Fprintf(os.Stderr, "pid 1's environment once the key arrived: %q, %v\n", b, err)
		return 4
	}
	switch mode {
	case "orphans":
		// The shell exits at once; its sleeps are orphans, pid 1's. A pid
		// stays in /proc until its process is reaped.
		out, err := exec.Command("/bin/sh", "-c", "for i in 1 2 3 4 5 6 7 8; do sleep 0.1 & echo $!; done").Output()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 6
		}
		pids := strings.Fields(string(out))
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			pids = slices.DeleteFunc(pids, func(pid string) bool {
				_, err := os.Stat("/proc/" + pid)
				return errors.Is(err, os.ErrNotExist)
			})
			if len(pids) == 0 {
				return 7
			}
			if time.Now().After(deadline) {
				fmt.Fprintf(os.Stderr, "orphans not reaped 5 s on: %v\n", pids)
				return 3
			}
		}
	case "sigterm":
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM)
		// Ready once pid 1 forwards signals.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if b, _ := os.ReadFile("/proc/1/comm"); string(b) == reaperName+"\n" {
				break
			}
			if time.Now().After(deadline) {
				fmt.Fprintln(os.Stderr, "pid 1 is not named "+reaperName+" 5 s on")
				return 8
			}
		}
		fmt.Println("ready")
		<-ch
		return 42
	}
	return 2
}

// startAsPid1 runs this test binary as pid 1 of a new pid namespace (with
// its own /proc) in mode, and returns the command, pid 1's host pid and
// its stdout.
func startAsPid1(t *testing.T, mode string) (*exec.Cmd, int, *bufio.Reader) {
	t.Helper()
	testenv.RequireRoot(t)
	bwrap := testenv.RequireBwrap(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	info, infoW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer info.Close()
	cmd := exec.Command(bwrap, "--unshare-pid", "--as-pid-1", "--die-with-parent", "--dev-bind", "/", "/", "--proc", "/proc", "--info-fd", "3", "--", self, "-test.run=^$")
	cmd.Env = append(os.Environ(), reapTestEnv+"="+mode, workerproto.EnvWebhookKey+"="+reapTestKey)
	cmd.ExtraFiles = []*os.File{infoW}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	infoW.Close()
	// A pid 1 that hangs is killed: bwrap's children die with it.
	stop := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	t.Cleanup(func() {
		stop.Stop()
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("stderr: %s", stderr.String())
		}
	})
	var pid1 struct {
		ChildPID int `json:"child-pid"`
	}
	if err := json.NewDecoder(info).Decode(&pid1); err != nil || pid1.ChildPID == 0 {
		t.Fatalf("bwrap's info: %+v, %v", pid1, err)
	}
	return cmd, pid1.ChildPID, bufio.NewReader(stdout)
}

// exitCode is err's exit code, or -1.
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// TestPid1ReapsOrphans runs the worker as its sandbox's pid 1: it starts
// the worker again as its child, with the secrets on a pipe, reaps the
// orphans the worker's children leave, and exits as the worker did.
func TestPid1ReapsOrphans(t *testing.T) {
	cmd, _, stdout := startAsPid1(t, "orphans")
	io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); exitCode(err) != 7 {
		t.Fatalf("pid 1 exited with %v, want 7 (the worker's exit code: every orphan reaped)", err)
	}
}

// TestPid1ForwardsSIGTERM: a runtime stops a sandbox by signalling its pid
// 1; the worker, pid 1's child now, must get the signal.
func TestPid1ForwardsSIGTERM(t *testing.T) {
	cmd, pid1, stdout := startAsPid1(t, "sigterm")
	if line, err := stdout.ReadString('\n'); line != "ready\n" {
		t.Fatalf("the worker said %q, %v; want ready", line, err)
	}
	if err := syscall.Kill(pid1, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); exitCode(err) != 42 {
		t.Fatalf("pid 1 exited with %v, want 42 (the worker's, on SIGTERM)", err)
	}
}

// subreaperTestEnv has this test binary run `corral worker subreaper` with
// its arguments.
const subreaperTestEnv = "CORRAL_TEST_SUBREAPER"

// TestSubreaper: the subreaper adopts what its command leaves behind and
// reaps it before it exits, with the command's exit code. The command, a
// shell, exits 3 at once; its background job, orphaned, records its own
// pid and its parent's a moment later, then exits.
func TestSubreaper(t *testing.T) {
	out := filepath.Join(t.TempDir(), "pids")
	cmd := exec.Command(os.Args[0], "/bin/sh", "-c", `(sleep 0.3; exec awk '/^Pid:/ {p=$2} /^PPid:/ {pp=$2} END {print p, pp}' /proc/self/status > "$0") & exit 3`, out)
	cmd.Env = append(os.Environ(), subreaperTestEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("subreaper: %v %s; want exit code 3, the command's", err, stderr.Bytes())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("the orphan had not run when the subreaper exited: %v", err)
	}
	var orphan, parent int
	if _, err := fmt.Sscan(string(b), &orphan, &parent); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	if parent != cmd.Process.Pid {
		t.Errorf("the orphan's parent was %d, not the subreaper (%d)", parent, cmd.Process.Pid)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", orphan)); !os.IsNotExist(err) {
		t.Errorf("the orphan (pid %d) is still on the host after the subreaper exited: %v", orphan, err)
	}
}
