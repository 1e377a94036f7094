package workercmd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/worker"
	"github.com/corral-dev/corral/internal/workerproto"
)

// forwarded are the signals pid 1 passes on to the worker: the runtimes'
// stop (SIGTERM) and a terminal's.
var forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// reap is the worker as its sandbox's pid 1 (the gvisor runtime, and
// docker under runsc, run no init of their own). A process whose parent
// exits becomes pid 1's child; if pid 1 does not wait for it, its zombie
// holds one of the sandbox's pids until the sandbox ends, and an agent
// that leaves many orphans spends its pids limit on them. So pid 1 starts
// the worker again as its child, with the same arguments, and waits for
// every child that exits until the worker does; then it exits as the
// worker did (128+n for signal n), which ends the sandbox. The signals of
// forwarded go on to the worker.
//
// The secrets stay out of the agent's reach as in the worker: pid 1 hides
// them first (worker.HideFromAgent: non-dumpable, and out of its
// environment where the kernel shows that to all), and passes them to the
// worker on a pipe.
func reap(environ []string, stderr io.Writer) int {
	names := []string{workerproto.EnvWebhookKey, workerproto.EnvSessionToken}
	environ, err := worker.HideFromAgent(environ, names...)
	if err == nil {
		var cmd *exec.Cmd
		if cmd, err = startWorker(environ, names); err == nil {
			return waitAll(cmd.Process.Pid, stderr)
		}
	}
	fmt.Fprintf(stderr, "corral worker (pid 1): start the worker: %v\n", err)
	return worker.ExitSetup
}

// startWorker starts this executable again, with its arguments and
// environ, the variables names passed on a pipe instead (read by the
// child's worker.HideFromAgent).
func startWorker(environ, names []string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	kept, secrets, err := worker.SecretsPipe(environ, names...)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Args = os.Args
	cmd.Env = kept
	if secrets != nil {
		defer secrets.Close()
		cmd.ExtraFiles = []*os.File{secrets} // fd 3
		cmd.Env = append(kept, worker.SecretsFDVar(3))
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	return cmd, cmd.Start()
}

// waitAll reaps every child until child exits, forwarding signals to it,
// and returns child's exit code.
func waitAll(child int, stderr io.Writer) int {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	go func() {
		for sig := range sigs {
			syscall.Kill(child, sig.(syscall.Signal))
		}
	}()
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
