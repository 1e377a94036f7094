//go:build linux

package gvisor

import (
	"context"
	"os"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/warmpool"
)

// Warm sandboxes (sandbox.Warmer), kept and claimed as the local
// runtime's are (warmpool.Host); what is gVisor's own is how one starts.
//
// A warm sandbox is a gVisor sandbox of a shape's Template that runsc has
// started: the sentry and the gofer run, and the main process (the
// Template's Command, the worker waiting in `corral worker warm`) waits
// for its task. Each of the Template's per-task mounts is a bind mount of
// an empty slot directory; the gofer binds the slot's inode, so a claim's
// rename of the slot over the task's directory shows the task's entries
// there (runsc serves mounts other than the root with shared file access:
// the sentry revalidates what it has cached of them against the host).
//
// runsc hands a sandbox's main process its own stdin, stdout and stderr
// and no other descriptor, so the start pipe is runsc's stdin and the
// acknowledgement file (warmpool.AckFile) its stdout
// (warmLauncherScript); warmShim, the main process, moves them to
// warmstart.FD and warmstart.AckFD and makes its stdout its stderr, the
// sandbox's output, before it runs the Template's Command. No descriptor
// of the sandbox names the acknowledgement file once the worker has
// closed warmstart.AckFD.
//
// A claimed sandbox keeps the name runsc knows it by, its warm id
// (state.Warm), under the task's state dir. A claimed sandbox that ended
// without its worker's acknowledgement ran nothing of its task, and says
// so (sandbox.ExitStatus.NotStarted).

var _ sandbox.Warmer = (*Runtime)(nil)

// warmShim is a warm sandbox's main process: /bin/sh with the Template's
// Command as its arguments.
const warmShim = `exec "$@" 5<&0 6>&1 1>&2 0<&-`

// newWarm makes the runtime's warm sandboxes' keeper.
func (r *Runtime) newWarm() (*warmpool.Host[state], error) {
	return warmpool.NewHost(warmpool.HostConfig[state]{
		Start: func(ctx context.Context, spec sandbox.Spec, start *os.File) error {
			spec.Command = append([]string{"/bin/sh", "-c", warmShim, "sh"}, spec.Command...)
			_, err := r.create(ctx, spec, "", start)
			return err
		},
		// The rest as every host runtime has it.
		Name: Name, StateDir: r.opts.StateDir, DataRoot: r.opts.DataRoot,
		Sandboxes: r.Sandboxes, Identities: r.opts.Identities, Log: r.log,
		Capabilities: r.Capabilities,
		Crash:        r.crash,
	})
}
