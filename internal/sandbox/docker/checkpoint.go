//go:build linux

package docker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/cgroups"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
)

// Checkpoints (sandbox.Checkpointer), where the engine runs its containers
// under runsc and has its experimental features on (Capabilities says
// Checkpoint): the engine checkpoints a container with runsc and restores
// it only from a checkpoint of its own, kept with the container in its
// data root (root's alone), never from a directory of the caller's (a
// start with one is refused: "custom checkpointdir is not supported"),
// and runsc restores a checkpoint only into the container it was taken
// of (its image names that container's root file system by its host
// path; restored into another container it fails, "no such file or
// directory"). So a checkpointed sandbox's container stays, ended, its
// checkpoint in it, renamed with checkpointedSuffix: the sandbox is gone
// to Recover, Status and Exec, and Restore starts that container again
// from its checkpoint. The directory Checkpoint is given stays empty.
//
// A container restored so is checkpointed once only: with containerd's
// runc shim (containerd 1.6) and runsc 20221219, the shim of a restored
// container never sees it end by a checkpoint, and holds its task as
// running: the engine then refuses every start of it ("id already in
// use"), and the shim stays, a process leaked. So Restore marks the
// sandbox restored (restoredDir), and Checkpoint refuses a sandbox so
// marked (sandbox.ErrNoCheckpoint) without touching it: its suspend keeps
// its files, and its next sandbox, a fresh container, is checkpointed
// again.

var _ sandbox.Checkpointer = (*Runtime)(nil)

// checkpointID is the name of a sandbox's checkpoint in its container.
const checkpointID = "corral"

// checkpointedSuffix ends the name of a checkpointed sandbox's container:
// a dot, which no sandbox id has, so that it names no other sandbox.
const checkpointedSuffix = ".checkpointed"

// Checkpoint saves running sandbox id's memory and processes in its
// container (the engine's checkpoint, which ends it), renames the
// container as checkpointed and takes back the directories it was given,
// keeping the lease of its identity for Restore.
func (r *Runtime) Checkpoint(ctx context.Context, id, dir string) error {
	if caps, _ := r.Capabilities(ctx); !caps.Checkpoint {
		why := cmp.Or(caps.NoCheckpoint, "only containers under runsc are checkpointed")
		return fmt.Errorf("checkpoint sandbox %s: %s: %w", id, why, errdefs.ErrFailedPrecondition)
	}
	c, err := r.inspect(ctx, id)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if !c.State.Running {
		return fmt.Errorf("checkpoint sandbox %s: it has ended: %w", id, errdefs.ErrFailedPrecondition)
	}
	if _, err := os.Stat(r.restoredMark(id)); err == nil {
		return fmt.Errorf("checkpoint sandbox %s: its container was restored from a checkpoint, and the engine's shim would lose it if checkpointed again: %w", id, sandbox.ErrNoCheckpoint)
	}
	// A checkpoint a Restore left (one cut short before removing it):
	// the engine refuses to make another of the same name.
	r.cli.CheckpointRemove(ctx, c.ID, client.CheckpointRemoveOptions{CheckpointID: checkpointID})
	mem, err := r.memoryOf(c)
	if err != nil {
		r.log.Warn("cannot find the memory cgroup of a sandbox to checkpoint", logkey.SandboxID, id, logkey.Error, err)
	}
	oomBefore, _ := cgroups.OOMKills(mem)
	putBack := r.roomToSave(id, mem)
	if _, err := r.cli.CheckpointCreate(ctx, c.ID, client.CheckpointCreateOptions{CheckpointID: checkpointID, Exit: true}); err != nil {
		// Read at once: the container's cgroup goes once the engine
		// has seen it end (the words are then runsc's alone).
		err = cgroups.KilledInSave(err, mem, oomBefore)
		// runsc ends a sandbox whose checkpoint failed (one of its
		// processes held a connection to a host socket, say), as Status
		// then says; one that runs on is woken, its limit put back.
		if c, ierr := r.inspect(context.WithoutCancel(ctx), id); ierr == nil && c.State.Running {
			r.wake(context.WithoutCancel(ctx), c.ID)
			if err := putBack(); err != nil {
				r.log.Warn("cannot put the memory limit of a sandbox whose checkpoint failed back", logkey.SandboxID, id, logkey.Error, err)
			}
		}
		return classify("checkpoint sandbox "+id, err)
	}
	if err := r.waitExit(ctx, c.ID); err != nil {
		return fmt.Errorf("checkpoint sandbox %s: wait for it to end: %w", id, err)
	}
	os.Remove(r.raisedRecord(id)) // its cgroup went with it
	if _, err := r.cli.ContainerRename(ctx, c.ID, client.ContainerRenameOptions{NewName: r.name(id) + checkpointedSuffix}); err != nil {
		return classify("checkpoint sandbox "+id+": rename its container", err)
	}
	if err := hostuser.Reclaim(ownedTrees(c)); err != nil {
		return fmt.Errorf("checkpoint sandbox %s: %w", id, err)
	}
	if err := hostuser.Unpin(r.pins(id)); err != nil {
		return fmt.Errorf("checkpoint sandbox %s: %w", id, err)
	}
	r.log.Info("sandbox checkpointed", logkey.SandboxID, id, "container", c.ID[:12])
	return nil
}

// roomToSave raises the memory limit of sandbox id's container c, as the
// gvisor runtime does for its checkpoints (cgroups.RaiseMemory): runsc's
// save is charged to the paused container, and at its limit the sentry
// was OOM-killed mid-save. The engine is on this host (the runtime binds
// host directories), its cgroups under /sys/fs/cgroup; the engine knows
// nothing of the raise (runsc has no update for it to pass on), and
// starts the container again, restored, with its own limit. It returns
// how to put the limit back; a container whose cgroup is not found is
// left as it is.
func (r *Runtime) roomToSave(id string, dirs []string) (putBack func() error) {
	noop := func() error { return nil }
	if len(dirs) == 0 {
		return noop
	}
	err := os.MkdirAll(filepath.Dir(r.raisedRecord(id)), 0o700)
	if err == nil {
		putBack, err = cgroups.RaiseMemory(dirs, r.raisedRecord(id))
	}
	if err != nil {
		r.log.Warn("cannot give a checkpoint room above the sandbox's memory limit", logkey.SandboxID, id, logkey.Error, err)
		return noop
	}
	return putBack
}

// memoryOf returns the memory cgroup of container c, found from its
// process: the engine is on this host, its cgroups under /sys/fs/cgroup.
func (r *Runtime) memoryOf(c container.InspectResponse) ([]string, error) {
	if c.State == nil || c.State.Pid <= 0 {
		return nil, errors.New("the container has no process")
	}
	return cgroups.MemoryOf("/sys/fs/cgroup", c.State.Pid)
}

// Restore starts checkpointed sandbox spec.ID's container again from its
// checkpoint, given its directories and pins again as Create gives them,
// and removes the checkpoint once it runs. A container that runs already
// is a Restore done before (its caller died before recording it), and is
// its answer. dir is not read: the checkpoint is the container's.
func (r *Runtime) Restore(ctx context.Context, spec sandbox.Spec, dir string) (*sandbox.Handle, error) {
	if err := r.opts.User.ValidateSpec(spec, r.opts.DataRoot); err != nil {
		return nil, fmt.Errorf("validate sandbox spec: %w", err)
	}
	c, err := r.inspect(ctx, spec.ID)
	switch {
	case err == nil && running(c):
		return r.handle(spec.ID, c.ID, c.Config.Labels), nil
	case err == nil:
		// Renamed back by a Restore that died before its start.
	case errors.Is(err, errdefs.ErrNotFound):
		if c, err = r.inspectCheckpointed(ctx, spec.ID); err != nil {
			return nil, fmt.Errorf("restore sandbox %s: its checkpoint is gone with its container: %w", spec.ID, err)
		}
	default:
		return nil, fmt.Errorf("restore: %w", err)
	}
	spec = spec.Resolve(r.opts.DataRoot)
	// The lease Checkpoint kept: the identity the container runs as.
	user, err := r.opts.Identities.Take(spec.ID)
	if err != nil {
		return nil, fmt.Errorf("restore sandbox %s: %w", spec.ID, err)
	}
	pins := r.pins(spec.ID)
	if err := hostuser.Unpin(pins); err != nil { // a Restore that crashed
		return nil, fmt.Errorf("restore sandbox %s: %w", spec.ID, err)
	}
	// Pinned at the same paths as by Create: the container binds those.
	if spec, err = hostuser.Pin(spec, pins, user); err != nil {
		return nil, fmt.Errorf("restore sandbox %s: %w", spec.ID, err)
	}
	owned, err := hostuser.Give(hostuser.WritableDirs(spec.Mounts), user)
	undo := func() {
		hostuser.Reclaim(owned)
		hostuser.Unpin(pins)
	}
	if err != nil {
		undo()
		return nil, fmt.Errorf("restore sandbox %s: %w", spec.ID, err)
	}
	if c.Name != "/"+r.name(spec.ID) {
		if _, err := r.cli.ContainerRename(ctx, c.ID, client.ContainerRenameOptions{NewName: r.name(spec.ID)}); err != nil {
			undo()
			return nil, classify("restore sandbox "+spec.ID+": rename its container", err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(r.restoredMark(spec.ID)), 0o700); err != nil {
		undo()
		return nil, fmt.Errorf("restore sandbox %s: %w", spec.ID, err)
	}
	if err := os.WriteFile(r.restoredMark(spec.ID), nil, 0o600); err != nil {
		undo()
		return nil, fmt.Errorf("restore sandbox %s: mark it restored: %w", spec.ID, err)
	}
	if err := r.startFromCheckpoint(ctx, c.ID); err != nil {
		undo()
		return nil, classify("restore sandbox "+spec.ID, err)
	}
	// The checkpoint holds the sandbox's memory, secrets and all: it is
	// kept no longer than needed.
	if _, err := r.cli.CheckpointRemove(ctx, c.ID, client.CheckpointRemoveOptions{CheckpointID: checkpointID}); err != nil {
		r.log.Warn("cannot remove a restored sandbox's checkpoint", logkey.SandboxID, spec.ID, logkey.Error, err)
	}
	r.wake(ctx, c.ID)
	r.log.Info("sandbox restored", logkey.SandboxID, spec.ID, "container", c.ID[:12])
	return r.handle(spec.ID, c.ID, c.Config.Labels), nil
}

// uploadWait bounds how long a restore waits for containerd to let go of
// the checkpoint as it was made (startFromCheckpoint).
const uploadWait = 15 * time.Second

// startFromCheckpoint starts container containerID from its checkpoint.
// The engine hands the checkpoint to containerd as a tar of its
// directory, which is byte for byte the one containerd made it from: a
// start before containerd's garbage collection removed that one fails
// ("failed to upload checkpoint to containerd: commit failed: content
// ...: already exists", moby/moby#42900; a restore at once after a
// checkpoint, as TestCheckpoint's, fails so every time, one a second
// later did not), and is tried again until it is gone.
func (r *Runtime) startFromCheckpoint(ctx context.Context, containerID string) error {
	deadline := time.Now().Add(uploadWait)
	for delay := 50 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		_, err := r.cli.ContainerStart(ctx, containerID, client.ContainerStartOptions{CheckpointID: checkpointID})
		if err == nil || !strings.Contains(err.Error(), "upload checkpoint") || !strings.Contains(err.Error(), "already exists") || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// restoredMark marks sandbox id's container as restored from a
// checkpoint, from before its start until Destroy.
func (r *Runtime) restoredMark(id string) string {
	return filepath.Join(r.opts.StateDir, "restored", id)
}

// raisedRecord is where roomToSave writes down its raise of sandbox id's
// memory limit, for a server that died in the save (Recover puts it
// back; a container the save ended needs none).
func (r *Runtime) raisedRecord(id string) string {
	return filepath.Join(r.opts.StateDir, "raised", id)
}

// wake sends SIGCONT to container containerID's main process (the worker,
// pid 1 under runsc): a checkpoint's end.
func (r *Runtime) wake(ctx context.Context, containerID string) {
	if _, err := r.cli.ContainerKill(ctx, containerID, client.ContainerKillOptions{Signal: "SIGCONT"}); err != nil {
		r.log.Warn("cannot wake a sandbox's main process", "container", containerID[:12], logkey.Error, err)
	}
}
