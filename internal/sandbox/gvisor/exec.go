//go:build linux

package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
)

// Exec runs req.Command in the running sandbox id with `runsc exec`: as the
// sandbox user, without capabilities, with no_new_privs and the sandbox's
// rlimits. The environment is the defaults (PATH, HOME, ...) plus req.Env;
// the sandbox's own Spec.Env is not inherited. It goes to runsc in a
// process.json (0600, in the state dir) that is removed when the command
// ends. When ctx is done the command is killed inside the sandbox.
//
// The bundle's seccomp profile does not apply to the command: runsc exec
// (20221219) installs it for the sandbox's first process only.
func (r *Runtime) Exec(ctx context.Context, id string, req sandbox.ExecRequest) (sandbox.ExitStatus, error) {
	e, err := r.Lookup(id)
	if err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("exec: %w", err)
	}
	if err := req.Validate(); err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: %w", id, err)
	}
	if !e.Running() {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	tmp, err := os.MkdirTemp(e.Dir, "exec-")
	if err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: %w", id, err)
	}
	defer os.RemoveAll(tmp)
	var pids int64
	if b, err := os.ReadFile(filepath.Join(e.Dir, "bundle", "config.json")); err == nil {
		var s ociSpec
		if json.Unmarshal(b, &s) == nil && s.Process != nil {
			for _, rl := range s.Process.Rlimits {
				if rl.Type == "RLIMIT_NPROC" {
					pids = int64(rl.Hard)
				}
			}
		}
	}
	o := r.opts
	if e.St.Identity != (hostuser.Identity{}) {
		o.Host = e.St.Identity // the sandbox's own
	}
	b, err := json.Marshal(newProcess(req.Command, req.Env, req.Dir, o, pids))
	if err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("encode exec process: %w", err)
	}
	procFile, pidFile := filepath.Join(tmp, "process.json"), filepath.Join(tmp, "pid")
	if err := os.WriteFile(procFile, b, 0o600); err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("write exec process: %w", err)
	}
	args := append(r.globalArgs(), "exec", "--process", procFile, "--internal-pid-file", pidFile, e.St.container())
	cmd := exec.CommandContext(ctx, r.opts.Runsc, args...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = req.Stdin, req.Stdout, req.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Killing runsc exec would leave the command running in the sandbox:
	// kill the command there (its pid in the sandbox is in pidFile), then
	// runsc exec.
	cmd.Cancel = func() error {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
				kctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				r.runsc(kctx, "kill", "--pid", strconv.Itoa(pid), e.St.container(), "KILL")
				cancel()
			}
		}
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = time.Second
	err = cmd.Run()
	if ctx.Err() != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: %w", id, ctx.Err())
	}
	var xe *exec.ExitError
	if err != nil && !errors.As(err, &xe) {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: %w", id, err)
	}
	if err != nil && !e.Running() {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: sandbox exited: %w", id, errdefs.ErrFailedPrecondition)
	}
	code := cmd.ProcessState.ExitCode()
	if _, err := os.Stat(pidFile); code == 128 && errors.Is(err, fs.ErrNotExist) {
		// runsc made no process (it writes the pid as it does): the
		// command is not there, or cannot run; say so as a shell would.
		code = 127
	}
	return sandbox.ExitStatus{Code: code, ExitedAt: time.Now().UTC(), Message: sandbox.ExitMessage(code, nil)}, nil
}
