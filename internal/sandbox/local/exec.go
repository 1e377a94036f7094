//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/cgroups"
	"github.com/corral-dev/corral/internal/sandbox/hostproc"
)

// Exec runs req.Command inside the running sandbox id with nsenter: in its
// user, mount, pid, network, IPC and UTS namespaces, as the sandbox user, in
// its cgroups. The environment is the defaults (PATH, HOME, ...) plus
// req.Env; the sandbox's own Spec.Env is not inherited (it may hold secrets
// and is never written to disk). When ctx is done the command's process
// group is killed.
func (r *Runtime) Exec(ctx context.Context, id string, req sandbox.ExecRequest) (sandbox.ExitStatus, error) {
	e, err := r.Lookup(id)
	if err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("exec: %w", err)
	}
	if err := req.Validate(); err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: %w", id, err)
	}
	dir := req.Dir
	if dir == "" {
		dir = "/tmp"
	}
	if caps, _ := r.Capabilities(ctx); !caps.Exec {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: nsenter not available: %w", id, errdefs.ErrNotImplemented)
	}
	// The pid namespace check guards against a reused pid: nsenter must
	// never join some other process's namespaces.
	if !e.Running() || e.St.ChildPID == 0 || hostproc.PidNamespace(e.St.ChildPID) != e.St.PIDNS {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	argv := []string{r.opts.Nsenter, "--target", strconv.Itoa(e.St.ChildPID),
		"--user", "--mount", "--pid", "--net", "--ipc", "--uts",
		"--setuid", strconv.Itoa(r.opts.UID), "--setgid", strconv.Itoa(r.opts.GID),
		// nsenter opens --wd before it enters the mount namespace, so the
		// path goes through the sandbox's root as /proc shows it.
		"--wd=/proc/" + strconv.Itoa(e.St.ChildPID) + "/root" + dir, "--"}
	argv = append(argv, req.Command...)
	join, err := cgroups.OpenJoin(e.St.Cgroups)
	if err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: %w", id, err)
	}
	defer join.Close()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = sandbox.DefaultEnv(req.Env)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = req.Stdin, req.Stdout, req.Stderr
	// Its own process group, so cancelling kills nsenter and the command
	// it forked (which stays in the group across the namespace change).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	underLauncher(cmd, r.opts, join, nil, nil)
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	err = cmd.Run()
	if ctx.Err() != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: %w", id, ctx.Err())
	}
	var xe *exec.ExitError
	if err != nil && !errors.As(err, &xe) {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: %w", id, err)
	}
	code := cmd.ProcessState.ExitCode()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	return sandbox.ExitStatus{Code: code, ExitedAt: time.Now().UTC(), Message: sandbox.ExitMessage(code, nil)}, nil
}
