package workercmd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/sandbox/warmstart"
	"github.com/corral-dev/corral/internal/worker"
	"github.com/corral-dev/corral/internal/workerproto"
)

// reaperName is pid 1's command name once it forwards signals.
const reaperName = "corral-reaper"

// reapChildEnv names, in pid 1's environment after reap re-executed it,
// the worker it waits for.
const reapChildEnv = workerproto.EnvPrefix + "REAP_CHILD"

// forwarded are the signals pid 1 passes on to the worker: the runtimes'
// stop (SIGTERM), a terminal's, and the SIGCONT a restored sandbox gets
// (sandbox.Checkpointer), which wakes a session's parked exec agent.
var forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGCONT}

// reap is the worker as its sandbox's pid 1 (the gvisor runtime, and
// docker under runsc, run no init of their own). A process whose parent
// exits becomes pid 1's child; if pid 1 does not wait for it, its zombie
// holds one of the sandbox's pids until the sandbox ends, and an agent
// that leaves many orphans spends its pids limit on them. So pid 1 starts
// the worker again as its child, with the same arguments, then executes
// itself again as the reaper (waitAll), which waits for every child that
// exits until the worker does, and exits as the worker did.
//
// The secrets never reach the agent: the worker gets them on a pipe, and
// reads up to its end before it runs anything. The write end stays open
// in pid 1 until its execve closes it (close-on-exec): by then pid 1's
// environment and memory are the new program's, which never held the
// secrets. The worker's start and pid 1's execve overlap, so a task waits
// for no more process starts than before. A signal that comes before the
// reaper has asked for it (the milliseconds of a process start) is not
// forwarded: it ends pid 1, and so the sandbox, at once (Go's default),
// or, early in the program's start, is dropped, and the runtime's stop
// goes on to SIGKILL after its grace period. Either way the agent had not
// run yet. Once it forwards signals, pid 1 is named reaperName.
//
// A warm sandbox's start pipe and acknowledgement (warmstart.FD and
// warmstart.AckFD) are the worker's, which inherits them; pid 1's execve
// closes its own, so that nothing but the worker holds the
// acknowledgement.
func reap(environ []string, stderr io.Writer) int {
	if v, ok := os.LookupEnv(reapChildEnv); ok {
		child, err := strconv.Atoi(v)
		if err != nil || child <= 1 {
			fmt.Fprintf(stderr, "corral worker (pid 1): %s=%q is not a pid\n", reapChildEnv, v)
			return worker.ExitSetup
		}
		return waitAll(child, stderr)
	}
	// Until the execve, as a worker is: no /proc/1/mem or environ for
	// the sandbox's user (Linux; gVisor shows environ regardless).
	err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	if err == nil {
		err = startWorker(environ, workerproto.EnvWebhookKey, workerproto.EnvSessionToken)
	}
	fmt.Fprintf(stderr, "corral worker (pid 1): %v\n", err)
	return worker.ExitSetup
}

// startWorker starts this executable again, with its arguments and
// environ, the variables names on a pipe instead, then executes itself as
// the reaper of that child. It returns only on error.
func startWorker(environ []string, names ...string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	kept, r, w, err := worker.SecretsPipe(environ, names...)
	if err == nil && r == nil {
		r, w, err = os.Pipe() // nothing to pass; the worker still waits for the execve
	}
	if err != nil {
		return err
	}
	defer w.Close() // only if the execve below fails
	cmd := exec.Command(self)
	cmd.Args = os.Args
	cmd.Env = append(kept, worker.SecretsFDVar(3))
	cmd.ExtraFiles = []*os.File{r} // fd 3
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err = cmd.Start()
	r.Close()
	if err != nil {
		return fmt.Errorf("start the worker: %w", err)
	}
	if len(os.Args) == 3 && os.Args[2] == "warm" {
		unix.CloseOnExec(warmstart.FD)
		unix.CloseOnExec(warmstart.AckFD)
	}
	err = unix.Exec(self, os.Args, append(kept, reapChildEnv+"="+strconv.Itoa(cmd.Process.Pid)))
	return fmt.Errorf("execute %s again as the reaper: %w", self, err)
}

// waitAll reaps every child until child exits, forwarding signals to it,
// and returns child's exit code (128+n for signal n).
func waitAll(child int, stderr io.Writer) int {
	worker.ReserveReaperThreads() // the agent shares the pids limit
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	go func() {
		for sig := range sigs {
			syscall.Kill(child, sig.(syscall.Signal))
		}
	}()
	os.WriteFile("/proc/self/comm", []byte(reaperName), 0) // for ps, and the tests
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		switch {
		case errors.Is(err, unix.EINTR):
		case err != nil:
			fmt.Fprintf(stderr, "corral worker (pid 1): wait for the worker: %v\n", err)
			return worker.ExitSetup
		case pid != child: // an orphan, reaped
		case ws.Exited():
			return ws.ExitStatus()
		case ws.Signaled():
			return 128 + int(ws.Signal())
		}
	}
}

// leftoverWait bounds how long Subreaper waits, once its command has
// exited, for the orphans it adopted that still run.
const leftoverWait = 5 * time.Second

// Subreaper is `corral worker subreaper CMD ARGS...`, on the host: it runs
// CMD as its child, as a child subreaper (PR_SET_CHILD_SUBREAPER), so
// that a process CMD's descendants leave behind becomes its child rather
// than the host init's, and it reaps them as they exit; once CMD exits it
// reaps what is left (waiting up to leftoverWait for those still running)
// and exits as CMD did. The gvisor runtime runs a restore's launcher
// under it: `runsc restore` leaves its gofer an orphan, and runsc's
// delete of the container waits for the gofer's end to be reaped, which a
// host's init may take seconds to do (docs/sessions-suspend.md). CMD gets
// this process's stdin, stdout, stderr and session.
func Subreaper(args []string, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: corral worker subreaper CMD [ARGS...]")
		return worker.ExitUsage
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(stderr, "corral worker subreaper: become a child subreaper: %v\n", err)
		return worker.ExitSetup
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "corral worker subreaper: %v\n", err)
		return worker.ExitSetup
	}
	code := waitAll(cmd.Process.Pid, stderr)
	for deadline := time.Now().Add(leftoverWait); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var ws unix.WaitStatus
		if _, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil); errors.Is(err, unix.ECHILD) {
			break
		}
	}
	return code
}
