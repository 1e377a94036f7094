//go:build linux

package warmpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/ids"
	"github.com/corral-dev/corral/internal/lockfile"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/sandbox/statedir"
	"github.com/corral-dev/corral/internal/sandbox/warmstart"
)

// The warm sandboxes of a host runtime (local, gvisor), all but starting
// one (HostConfig.Start) and what a runtime readies of one for its task
// (HostConfig.Fore).
//
// A warm sandbox is a sandbox of a shape's Template started ahead of need,
// its main process (the Template's Command, the worker waiting in `corral
// worker warm`) waiting on warmstart.FD. Each of the Template's per-task
// mounts is bound from an empty slot directory, DirOf(StateDir)/<warm
// id>/<mount index> (Slots). The sandbox holds nothing of any task.
//
// A task whose spec fits the shape claims one (Host.Create): its
// directories, prepared by the server, become the slots (HandOver), the
// sandbox's state directory is renamed to the task's id, and the task's
// argv, environment and working directory go down the pipe. From then on
// it is the task's sandbox, destroyed after it like any other; the pool
// starts another. A warm sandbox is taken out of its pool before it is
// handed over, so no two tasks ever get the same one.
//
// A warm sandbox is never reattached: its main process exits when the
// pipe closes empty, which it does when the server that made it dies, and
// NewHost destroys what is left of warm sandboxes of runtimes gone
// (DestroyLeftovers, putting a task's entries back into its directories
// if the server died while moving them).
//
// A claimed one is the task's from the rename of its state directory on,
// and is found again after a restart like any task's sandbox. Its worker
// may not have had the start then: the server can die between the rename
// and the start's write. So the worker writes AckFile (through
// warmstart.AckFD, closed before anything of the task runs) as soon as it
// has a start; a claimed sandbox that ended without it ran nothing of its
// task, and the runtime says so (sandbox.ExitStatus.NotStarted): its task
// starts again, and never takes the worker's own exit for its result.

// LabelWarm marks a warm sandbox not yet claimed.
const LabelWarm = "corral.warm"

// AckFile, in a warm sandbox's state dir, is where its worker acknowledges
// its start (warmstart.AckFD).
const AckFile = "started"

// Acked reports whether the worker of the sandbox in dir acknowledged a
// start.
func Acked(dir string) bool {
	fi, err := os.Stat(filepath.Join(dir, AckFile))
	return err == nil && fi.Size() > 0
}

// OpenAck creates the empty acknowledgement file in a warm sandbox's
// state dir, for its worker's warmstart.AckFD.
func OpenAck(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, AckFile), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create warm start acknowledgement file: %w", err)
	}
	return f, nil
}

// DirOf holds the slots of the warm sandboxes and the runtimes' locks, in
// the state dir stateDir: a name no sandbox id can take.
func DirOf(stateDir string) string { return filepath.Join(stateDir, "_warm") }

// Box is a host runtime's warm sandbox in a pool.
type Box struct {
	ID    string
	pool  *Pool[*Box] // set when it is taken
	slots []string    // the host dir bound for each per-task mount of the template, by mount index; "" for the others
	start *os.File    // the pipe's write end
}

// Drop closes b's end of its start pipe, as its server's death does: a
// worker not yet sent its start ends without one.
func (b *Box) Drop() { b.start.Close() }

// HostConfig is what Host needs of its runtime.
type HostConfig[S statedir.Launched] struct {
	// Name is the runtime's, in WarmStats.
	Name               string
	StateDir, DataRoot string
	Sandboxes          *statedir.Sandboxes[S]
	Identities         *hostuser.Identities
	Log                *slog.Logger
	// Capabilities are the runtime's: no sandbox is kept warm where it
	// cannot start one.
	Capabilities func(context.Context) (sandbox.Capabilities, error)
	// Start starts spec, a warm sandbox's (its labels LabelWarm, its
	// per-task mounts the slots), whose main process gets start, the
	// read end of the pipe its task comes through, as warmstart.FD.
	Start func(ctx context.Context, spec sandbox.Spec, start *os.File) error
	// Fore, if set, readies a claimed warm sandbox for its task before
	// anything of the task moves into it.
	Fore func(e *statedir.Entry[S]) error
	// Crash, if set, is called at each of a claim's crash points
	// (sandbox.CrashClaimed, CrashMoved, CrashHandedOver, CrashSent).
	Crash func(point string)
}

// Host keeps a host runtime's warm sandboxes (sandbox.Warmer) and hands
// them to tasks. Make it with NewHost.
type Host[S statedir.Launched] struct {
	// Tag is in the ids of the warm sandboxes this runtime starts; Host
	// holds its lock while they are its own (Prefix).
	Tag   string
	lock  *lockfile.File
	pools *Pools[*Box]
	c     HostConfig[S]
}

// NewHost takes a tag of its own for the runtime's warm sandboxes, and
// destroys those of runtimes gone: they are never reattached.
func NewHost[S statedir.Launched](c HostConfig[S]) (*Host[S], error) {
	if err := os.MkdirAll(DirOf(c.StateDir), 0o711); err != nil {
		return nil, fmt.Errorf("%s runtime: %w", c.Name, err)
	}
	h := &Host[S]{c: c}
	var err error
	if h.Tag, h.lock, err = Own(DirOf(c.StateDir)); err != nil {
		return nil, fmt.Errorf("%s runtime: %w", c.Name, err)
	}
	DestroyLeftovers(context.Background(), c.StateDir, DirOf(c.StateDir), h.Tag, c.Sandboxes.Destroy, c.Identities.Release, c.Log)
	h.pools = New[*Box](c.Name, hostOps[S]{h}, c.Log)
	return h, nil
}

// Close releases the runtime's tag: a runtime made after it over the same
// state dir destroys the warm sandboxes it left.
func (h *Host[S]) Close() error { return h.lock.Release() }

// KeepWarm implements sandbox.Warmer: one pool per shape, each filled to
// p.Size within p's budget and refilled after every claim. A pool that
// has had no claim for p.Idle destroys its sandboxes and fills again at
// the next task of its shape, which starts cold. When ctx ends the pools
// destroy the sandboxes they hold, and KeepWarm returns.
func (h *Host[S]) KeepWarm(ctx context.Context, p sandbox.WarmPolicy) error {
	if p.Size <= 0 || len(p.Shapes) == 0 {
		return nil
	}
	if caps, _ := h.c.Capabilities(ctx); !caps.Available {
		return fmt.Errorf("keep sandboxes warm: %s", caps.Reason)
	}
	for _, sh := range p.Shapes {
		if err := CheckShape(sh, h.c.DataRoot, DirOf(h.c.StateDir)); err != nil {
			return err
		}
	}
	return h.pools.Keep(ctx, p)
}

// WarmStats implements sandbox.Warmer.
func (h *Host[S]) WarmStats() []sandbox.WarmStats { return h.pools.Stats() }

// Take takes a warm sandbox for spec out of its pool, or returns nil: for
// a spec no pool's shape fits, or when the pool has none ready (a miss,
// which has the pool fill).
func (h *Host[S]) Take(spec sandbox.Spec) *Box {
	pl, b, ok := h.pools.Take(spec)
	if !ok {
		return nil
	}
	b.pool = pl
	return b
}

// Create is a host runtime's Create once spec is valid: with spec's id
// locked, the sandbox already there if there is one, else spec handed to
// a warm sandbox of its shape if one is ready (claim: a warm sandbox's
// own spec claims none), else cold (spec's mounts resolved to host
// paths): a warm sandbox that cannot take the task is destroyed, and the
// task starts cold.
func (h *Host[S]) Create(ctx context.Context, spec sandbox.Spec, claim bool, cold func(spec sandbox.Spec) (*sandbox.Handle, error)) (*sandbox.Handle, error) {
	var box *Box
	if claim {
		box = h.Take(spec)
	}
	spec = spec.Resolve(h.c.DataRoot) // from here on, mounts are host paths
	sb := h.c.Sandboxes
	// A box given back may be destroyed (Pool.Release), which locks its
	// id, whose stripe may be spec's: after spec's is let go.
	var giveBack *Box
	defer func() { h.release(giveBack) }()
	unlock := sb.Dir.Lock(spec.ID)
	defer func() { unlock() }()
	if e, err := sb.Lookup(spec.ID); err == nil {
		giveBack = box
		return sb.Handle(e.St), nil
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		giveBack = box
		return nil, err
	}
	if box != nil {
		hd, warm, err := h.Adopt(ctx, spec, box)
		box.pool.Wake() // for the next box, now the claim is done
		if err == nil {
			return hd, nil
		}
		h.c.Log.Warn("warm sandbox not usable; starting the task's cold", logkey.SandboxID, spec.ID, "warm_id", box.ID, logkey.Error, err)
		if warm {
			// Its destroy locks its id, whose stripe may be spec's: spec's
			// is let go meanwhile, and spec looked up again after.
			unlock()
			box.pool.Destroy(ctx, box)
			unlock = sb.Dir.Lock(spec.ID)
			if e, err := sb.Lookup(spec.ID); err == nil {
				return sb.Handle(e.St), nil
			} else if !errors.Is(err, errdefs.ErrNotFound) {
				return nil, err
			}
		}
	}
	return cold(spec)
}

// release gives an unused box back to its pool.
func (h *Host[S]) release(b *Box) {
	if b != nil {
		b.pool.Release(b)
	}
}

// crash calls HostConfig.Crash at point, if set.
func (h *Host[S]) crash(point string) {
	if h.c.Crash != nil {
		h.c.Crash(point)
	}
}

// Adopt hands spec's task (mounts resolved, its id locked) to the warm
// sandbox b, taken from its pool (Take). On error the task's directories
// are where they were, or are the slots with every entry moved in, and
// warm says whether b is still the warm sandbox, for the caller to
// destroy (b.pool.Destroy) once it holds no lock of the state dir's:
// that destroy locks b's id, whose stripe may be spec's. When warm is
// false, b has become spec's sandbox and is destroyed already.
func (h *Host[S]) Adopt(ctx context.Context, spec sandbox.Spec, b *Box) (_ *sandbox.Handle, warm bool, err error) {
	h.crash(sandbox.CrashClaimed)
	sb := h.c.Sandboxes
	e, ok := sb.Dir.Cached(b.ID)
	if !ok || !e.Running() {
		return nil, true, errors.New("its sandbox has ended")
	}
	if h.c.Fore != nil {
		if err := h.c.Fore(e); err != nil {
			return nil, true, err
		}
	}
	root := filepath.Join(DirOf(h.c.StateDir), b.ID)
	if err := HandOver(root, b.slots, spec); err != nil {
		return nil, true, err
	}
	h.crash(sandbox.CrashMoved)
	// The task's directories are the slots now, its entries in them. The
	// sandbox is the task's from here; on error it is destroyed as such.
	l := statedir.LaunchOf(e.St)
	l.ID = spec.ID
	l.Labels = maps.Clone(spec.Labels)
	l.Warm = b.ID
	// The slots' own trees are the task's directories now: Give takes
	// them over.
	l.Owned, err = hostuser.Give(hostuser.WritableDirs(spec.Mounts), l.Identity)
	st := statedir.WithLaunch(e.St, l)
	if err == nil {
		err = sb.Dir.Write(b.ID, st)
	}
	if err == nil {
		err = h.c.Identities.Rename(b.ID, spec.ID)
	}
	dir := sb.Dir.Path(spec.ID)
	if err == nil {
		os.RemoveAll(dir) // a Create that crashed before it started anything
		// The claim's record goes first: once the state dir has the
		// task's name, nothing named after the warm sandbox is left for
		// the next server to destroy (its cgroups are the task's now).
		if err = os.RemoveAll(root); err == nil {
			err = os.Rename(sb.Dir.Path(b.ID), dir)
		}
	}
	if err != nil {
		hostuser.Reclaim(l.Owned)
		return nil, true, fmt.Errorf("hand the warm sandbox over: %w", err)
	}
	sb.Dir.Forget(b.ID)
	e.Dir, e.St = dir, st
	sb.Dir.Set(spec.ID, e)
	h.crash(sandbox.CrashHandedOver)
	// The worker reads the start once the pipe closes; close it whatever
	// the write did, so that it never waits for more. A start written
	// whole is the worker's, whatever Close says.
	err = warmstart.Send(b.start, warmstart.Start{Argv: spec.Command, Env: sandbox.DefaultEnv(spec.Env), Dir: spec.Dir})
	b.start.Close()
	if err != nil {
		sb.Stop(ctx, spec.ID, 0)
		sb.Dir.Remove(l, dir, false)
		sb.Dir.Forget(spec.ID)
		return nil, false, fmt.Errorf("start the task in the warm sandbox: %w", err)
	}
	h.crash(sandbox.CrashSent)
	h.c.Log.Info("sandbox started", logkey.SandboxID, spec.ID, "launcher_pid", l.PID, "warm_id", b.ID, "uid", l.Identity.UID)
	return sb.Handle(st), false, nil
}

// hostOps starts and destroys a host runtime's warm sandboxes for its
// pools.
type hostOps[S statedir.Launched] struct{ h *Host[S] }

// StartWarm starts a sandbox of shape with empty slots for its per-task
// mounts.
func (o hostOps[S]) StartWarm(ctx context.Context, shape sandbox.WarmShape) (*Box, error) {
	h := o.h
	b := &Box{ID: Prefix + h.Tag + "-" + ids.New()}
	spec := shape.Template
	spec.ID = b.ID
	spec.Labels = map[string]string{sandbox.LabelManaged: "true", LabelWarm: "true"}
	spec.Mounts = slices.Clone(spec.Mounts)
	root := filepath.Join(DirOf(h.c.StateDir), b.ID)
	slots, err := Slots(root, spec.Mounts)
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
	err = h.c.Start(ctx, spec, rd)
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
func (o hostOps[S]) DestroyWarm(ctx context.Context, b *Box) error {
	h := o.h
	b.Drop() // its main process ends, and so the sandbox
	if err := h.c.Sandboxes.Destroy(ctx, b.ID); err != nil {
		return fmt.Errorf("destroy warm sandbox %s: %w", b.ID, err)
	}
	os.RemoveAll(filepath.Join(DirOf(h.c.StateDir), b.ID))
	return nil
}
