//go:build linux

package local

import (
	"context"
	"fmt"
	"os"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/statedir"
	"github.com/corral-dev/corral/internal/sandbox/warmpool"
)

// Warm sandboxes (sandbox.Warmer), kept and claimed by warmpool.Host;
// what is this runtime's own is how one starts and that it waits in the
// background.
//
// A warm sandbox is a sandbox of a shape's Template started ahead of need:
// bwrap has set it up and its main process (the Template's Command, the
// worker waiting in `corral worker warm`) waits on warmstart.FD, its
// acknowledgement file open as warmstart.AckFD. Its per-task mounts are
// bound from the slots, given to the sandbox identity; bwrap binds the
// slot's inode, so a claim's rename of the slot over the task's
// directory shows the task's entries where the task's mounts say. It
// waits in the background (cgroups.Background: a low CPU weight), and a
// claim brings it to the fore before anything of the task moves in.

var _ sandbox.Warmer = (*Runtime)(nil)

// newWarm makes the runtime's warm sandboxes' keeper.
func (r *Runtime) newWarm() (*warmpool.Host[state], error) {
	return warmpool.NewHost(warmpool.HostConfig[state]{
		Start: func(ctx context.Context, spec sandbox.Spec, start *os.File) error {
			_, err := r.create(ctx, spec, start)
			return err
		},
		Fore: func(e *statedir.Entry[state]) error {
			if r.cg == nil {
				return nil
			}
			// It started in the background; the task runs in the fore.
			if err := r.cg.Background(e.St.Cgroups, false); err != nil {
				return fmt.Errorf("bring it to the fore: %w", err)
			}
			return nil
		},
		// The rest as every host runtime has it.
		Name: Name, StateDir: r.opts.StateDir, DataRoot: r.opts.DataRoot,
		Sandboxes: r.Sandboxes, Identities: r.opts.Identities, Log: r.log,
		Capabilities: r.Capabilities,
		Crash:        r.crash,
	})
}
