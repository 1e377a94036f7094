//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/corral-dev/corral/internal/ids"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/sandbox/warmpool"
	"github.com/corral-dev/corral/internal/sandbox/warmstart"
)

// Warm sandboxes (sandbox.Warmer).
//
// A warm sandbox is a sandbox of a shape's Template started ahead of need:
// bwrap has set it up and its main process (the Template's Command, the
// worker waiting in `corral worker warm`) waits on warmstart.FD. Each of
// the Template's per-task mounts is bound from an empty slot directory,
// StateDir/_warm/<warm id>/<mount index>, given to the sandbox identity.
// The sandbox holds nothing of any task.
//
// A task whose spec fits the shape claims one (Create): its directories,
// prepared by the server, become the slots (their entries are moved into
// the slot, which then replaces the task's directory by rename, so the
// sandbox, which bound the slot's inode, sees them where the task's
// mounts say), the sandbox's state directory is renamed to the task's id,
// and the task's argv, environment and working directory go down the pipe.
// From then on it is the task's sandbox, destroyed after it like any
// other; the pool starts another. A warm sandbox is taken out of its pool
// before it is handed over, so no two tasks ever get the same one.
//
// A warm sandbox is never reattached: its main process exits when the
// pipe closes empty, which it does when the server that made it dies, and
// New destroys what is left of warm sandboxes in the state dir (putting a
// task's entries back into its directories if the server died while
// moving them).
//
// A claimed one is the task's from the rename of its state directory on,
// and is found again after a restart like any task's sandbox. Its worker
// may not have had the start then: the server can die between the rename
// and the start's write. So the worker writes ackFile (through
// warmstart.AckFD, closed before anything of the task runs) as soon as it
// has a start; a claimed sandbox that ended without it ran nothing of its
// task, and says so (sandbox.ExitStatus.NotStarted): its task starts
// again, and never takes the worker's own exit for its result.

// labelWarm marks a warm sandbox not yet claimed.
const labelWarm = "corral.warm"

// ackFile, in a warm sandbox's state dir, is where its worker acknowledges
// its start (warmstart.AckFD).
const ackFile = "started"

// acked reports whether the worker of the sandbox in dir acknowledged a
// start.
func acked(dir string) bool {
	fi, err := os.Stat(filepath.Join(dir, ackFile))
	return err == nil && fi.Size() > 0
}

// warmDir holds the slots of the warm sandboxes, in the state dir: a name
// no sandbox id can take.
func warmDir(stateDir string) string { return filepath.Join(stateDir, "_warm") }

// warmBox is a warm sandbox in a pool.
type warmBox struct {
	id    string
	pool  *warmpool.Pool[*warmBox] // set when it is taken
	slots []string                 // the host dir bound for each per-task mount of the template, by mount index; "" for the others
	start *os.File                 // the pipe's write end
}

// KeepWarm implements sandbox.Warmer: one pool per shape, each filled to
// p.Size and refilled after every claim. A pool that has had no claim for
// p.Idle destroys its sandboxes and fills again at the next task of its
// shape, which starts cold. When ctx ends the pools destroy the sandboxes
// they hold, and KeepWarm returns.
func (r *Runtime) KeepWarm(ctx context.Context, p sandbox.WarmPolicy) error {
	if p.Size <= 0 || len(p.Shapes) == 0 {
		return nil
	}
	if caps, _ := r.Capabilities(ctx); !caps.Available {
		return fmt.Errorf("keep sandboxes warm: %s", caps.Reason)
	}
	if err := os.MkdirAll(warmDir(r.opts.StateDir), 0o711); err != nil {
		return fmt.Errorf("keep sandboxes warm: %w", err)
	}
	for _, sh := range p.Shapes {
		if err := warmpool.CheckShape(sh, r.opts.DataRoot, warmDir(r.opts.StateDir)); err != nil {
			return err
		}
	}
	return r.warm.Keep(ctx, p)
}

// WarmStats implements sandbox.Warmer.
func (r *Runtime) WarmStats() []sandbox.WarmStats { return r.warm.Stats() }

// claimWarm takes a warm sandbox for spec out of its pool, or returns nil:
// for a spec no pool's shape fits, or when the pool has none ready (a
// miss, which has the pool fill).
func (r *Runtime) claimWarm(spec sandbox.Spec) *warmBox {
	pl, b, ok := r.warm.Take(spec)
	if !ok {
		return nil
	}
	b.pool = pl
	return b
}

// releaseWarm gives an unused box back to its pool.
func (r *Runtime) releaseWarm(b *warmBox) {
	if b != nil {
		b.pool.Release(b)
	}
}

// warmOps starts and destroys the runtime's warm sandboxes for its pools.
type warmOps struct{ r *Runtime }

// StartWarm starts a sandbox of shape with empty slots for its per-task
// mounts.
func (o warmOps) StartWarm(ctx context.Context, shape sandbox.WarmShape) (*warmBox, error) {
	r := o.r
	id := warmpool.Prefix + r.warmTag + "-" + ids.New()
	b := &warmBox{id: id}
	spec := shape.Template
	spec.ID = id
	spec.Labels = map[string]string{sandbox.LabelManaged: "true", labelWarm: "true"}
	spec.Mounts = slices.Clone(spec.Mounts)
	root := filepath.Join(warmDir(r.opts.StateDir), id)
	slots, err := warmpool.Slots(root, spec.Mounts)
	if err != nil {
		return nil, err
	}
	b.slots = slots
	for i, slot := range slots {
		if slot != "" {
			spec.Mounts[i].Source, spec.Mounts[i].HostDir = slot, true
		}
	}
	rd, wr, err := os.Pipe()
	if err != nil {
		os.RemoveAll(root)
		return nil, fmt.Errorf("create warm start pipe: %w", err)
	}
	_, err = r.create(ctx, spec, rd)
	rd.Close()
	if err != nil {
		wr.Close()
		os.RemoveAll(root)
		return nil, err
	}
	b.start = wr
	return b, nil
}

// DestroyWarm destroys an unclaimed warm sandbox and its slots.
func (o warmOps) DestroyWarm(ctx context.Context, b *warmBox) error {
	r := o.r
	b.start.Close() // its main process ends, and so the sandbox
	if err := r.Destroy(ctx, b.id); err != nil {
		return fmt.Errorf("destroy warm sandbox %s: %w", b.id, err)
	}
	os.RemoveAll(filepath.Join(warmDir(r.opts.StateDir), b.id))
	return nil
}

// adopt hands spec's task (mounts resolved, its id locked) to the warm
// sandbox b. On error the sandbox is destroyed; the task's directories are
// where they were, or are the slots with every entry moved in.
func (r *Runtime) adopt(ctx context.Context, spec sandbox.Spec, b *warmBox) (_ *sandbox.Handle, err error) {
	r.crash(sandbox.CrashClaimed)
	e, ok := r.Dir.Cached(b.id)
	if !ok || !e.Running() {
		b.pool.Destroy(ctx, b)
		return nil, errors.New("its sandbox has ended")
	}
	if r.cg != nil {
		// It started in the background; the task runs in the fore.
		if err := r.cg.Background(e.St.Cgroups, false); err != nil {
			b.pool.Destroy(ctx, b)
			return nil, fmt.Errorf("bring it to the fore: %w", err)
		}
	}
	root := filepath.Join(warmDir(r.opts.StateDir), b.id)
	if err := warmpool.HandOver(root, b.slots, spec); err != nil {
		b.pool.Destroy(ctx, b)
		return nil, err
	}
	r.crash(sandbox.CrashMoved)
	// The task's directories are the slots now, its entries in them. The
	// sandbox is the task's from here; on error it is destroyed as such.
	st := e.St
	st.ID = spec.ID
	st.Labels = maps.Clone(spec.Labels)
	st.Warm = b.id
	// The slots' own trees are the task's directories now: Give takes
	// them over.
	st.Owned, err = hostuser.Give(hostuser.WritableDirs(spec.Mounts), st.Identity)
	if err == nil {
		err = r.Dir.Write(b.id, st)
	}
	if err == nil {
		err = r.opts.Identities.Rename(b.id, spec.ID)
	}
	dir := r.Dir.Path(spec.ID)
	if err == nil {
		os.RemoveAll(dir) // a Create that crashed before it started anything
		// The claim's record goes first: once the state dir has the
		// task's name, nothing named after the warm sandbox is left for
		// the next server to destroy (its cgroups are the task's now).
		if err = os.RemoveAll(root); err == nil {
			err = os.Rename(r.Dir.Path(b.id), dir)
		}
	}
	if err != nil {
		hostuser.Reclaim(st.Owned)
		b.pool.Destroy(ctx, b)
		return nil, fmt.Errorf("hand the warm sandbox over: %w", err)
	}
	r.Dir.Forget(b.id)
	e.Dir, e.St = dir, st
	r.Dir.Set(spec.ID, e)
	r.crash(sandbox.CrashHandedOver)
	// The worker reads the start once the pipe closes; close it whatever
	// the write did, so that it never waits for more. A start written
	// whole is the worker's, whatever Close says.
	err = warmstart.Send(b.start, warmstart.Start{Argv: spec.Command, Env: sandbox.DefaultEnv(spec.Env), Dir: spec.Dir})
	b.start.Close()
	if err != nil {
		r.Stop(ctx, spec.ID, 0)
		r.Dir.Remove(st.Launch, dir, false)
		r.Dir.Forget(spec.ID)
		return nil, fmt.Errorf("start the task in the warm sandbox: %w", err)
	}
	r.crash(sandbox.CrashSent)
	r.log.Info("sandbox started", logkey.SandboxID, spec.ID, "pid", st.ChildPID, "warm_id", b.id)
	return r.Handle(st), nil
}

// destroyLeftoverWarm destroys the warm sandboxes that runtimes gone left
// in the state dir, and their slots (warmpool.DestroyLeftovers).
func (r *Runtime) destroyLeftoverWarm(ctx context.Context) {
	warmpool.DestroyLeftovers(ctx, r.opts.StateDir, warmDir(r.opts.StateDir), r.warmTag, r.Destroy, r.opts.Identities.Release, r.log)
}
