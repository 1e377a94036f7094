//go:build linux

package statedir

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/cgroups"
	"github.com/corral-dev/corral/internal/sandbox/hostproc"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
)

// Entry is one sandbox as a host runtime instance knows it: its state dir,
// its state and, when this instance started its launcher, the launcher's
// end as the reaping goroutine saw it.
type Entry[S Launched] struct {
	Dir string
	St  S
	// done is closed when this instance reaped the launcher (it started
	// it); nil when the sandbox was found on disk after a restart.
	done   chan struct{}
	ps     *os.ProcessState // valid after done is closed
	exitAt time.Time        // when done was closed
}

// Started returns the entry of a sandbox in dir whose launcher cmd the
// caller has just started, and reaps cmd in the background.
func Started[S Launched](dir string, cmd *exec.Cmd) *Entry[S] {
	e := &Entry[S]{Dir: dir, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		e.ps = cmd.ProcessState
		e.exitAt = time.Now().UTC()
		close(e.done)
	}()
	return e
}

// Done is closed when this instance reaped the launcher; nil for a sandbox
// found on disk.
func (e *Entry[S]) Done() <-chan struct{} { return e.done }

// Reaped is the launcher's wait status and when it was reaped, if this
// instance started it and it has exited; else nil.
func (e *Entry[S]) Reaped() (*os.ProcessState, time.Time) {
	if e.done == nil {
		return nil, time.Time{}
	}
	select {
	case <-e.done:
		return e.ps, e.exitAt
	default:
		return nil, time.Time{}
	}
}

// Running reports whether the sandbox's launcher still runs.
func (e *Entry[S]) Running() bool {
	l := e.St.launch()
	return hostproc.Running(e.done, l.PID, l.PIDStart)
}

// WaitExit blocks until the launcher exits or ctx is done.
func (e *Entry[S]) WaitExit(ctx context.Context) error {
	l := e.St.launch()
	return hostproc.WaitExit(ctx, e.done, l.PID, l.PIDStart)
}

// Ops are what a host runtime does its own way; Sandboxes does the rest.
type Ops[S Launched] struct {
	// Load completes a state read from disk after a restart; nil: as read.
	Load func(dir string, st S) S
	// ExitStatus is how the exited sandbox e ended.
	ExitStatus func(e *Entry[S]) sandbox.ExitStatus
	// Creating reports a running sandbox that is not ready yet; nil: never.
	Creating func(e *Entry[S]) bool
	// Term asks the sandbox's processes to end (SIGTERM), without waiting.
	Term func(ctx context.Context, e *Entry[S])
	// Kill kills every process of the sandbox and returns once its
	// launcher has exited.
	Kill func(ctx context.Context, e *Entry[S]) error
	// Leftovers kills what is left of sandbox e once its launcher has
	// exited by itself within a Stop's grace (processes that outlived
	// the main process) and returns once none of them runs; nil: nothing
	// outlives the launcher.
	Leftovers func(ctx context.Context, e *Entry[S]) error
	// Release frees what the runtime keeps of the stopped sandbox st
	// outside its state dir (runsc's record of it); nil: nothing. An
	// error keeps the state dir, for a later Destroy to release it again.
	Release func(ctx context.Context, st S) error
}

// Sandboxes is the part of sandbox.Runtime the host runtimes share: finding
// a sandbox in the state dir after a restart, waiting for it, its status,
// stopping it with a grace period, listing and destroying. A runtime embeds
// it and adds Capabilities, Create and Exec.
type Sandboxes[S Launched] struct {
	// Dir is the state directory and the entries this instance knows.
	Dir *Dir[S, Entry[S]]

	name     string
	version  int
	log      *slog.Logger
	cg       *cgroups.Hierarchy // nil: the runtime runs without cgroups
	reserved string             // a subdirectory of the state dir that is not a sandbox
	ops      Ops[S]
}

// NewSandboxes returns the lifecycle of runtime name's sandboxes (states of
// the given version) in the state directory root; cg holds their cgroups
// (nil: none); ids leases their host identities; reserved names a
// subdirectory of root that is the runtime's own, never a sandbox ("" for
// none).
func NewSandboxes[S Launched](name string, version int, root, reserved string, cg *cgroups.Hierarchy, ids *hostuser.Identities, log *slog.Logger, ops Ops[S]) *Sandboxes[S] {
	d := New[S, Entry[S]](root, func(st S) map[string]string { return st.launch().Labels })
	d.ids = ids
	return &Sandboxes[S]{
		Dir:      d,
		name:     name,
		version:  version,
		log:      log,
		cg:       cg,
		reserved: reserved,
		ops:      ops,
	}
}

// Handle is st as a Handle of this runtime.
func (s *Sandboxes[S]) Handle(st S) *sandbox.Handle { return Handle(s.name, s.version, st) }

// Lookup returns sandbox id from memory or, after a restart, from its state
// dir. It wraps errdefs.ErrNotFound if there is neither.
func (s *Sandboxes[S]) Lookup(id string) (*Entry[S], error) {
	if id == s.reserved {
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return s.Dir.Lookup(id, func(dir string, st S) *Entry[S] {
		if s.ops.Load != nil {
			st = s.ops.Load(dir, st)
		}
		return &Entry[S]{Dir: dir, St: st}
	})
}

// Recover reattaches to the sandbox h names. The sandbox's state dir is the
// source of truth; h must be a Handle of this runtime at a known version.
func (s *Sandboxes[S]) Recover(ctx context.Context, h *sandbox.Handle) error {
	e, err := s.Lookup(h.ID)
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	if err := CheckRecover(h, s.name, s.version, e.St); err != nil {
		return err
	}
	s.log.Debug("sandbox recovered", logkey.SandboxID, h.ID, "running", e.Running())
	return nil
}

// Wait blocks until the sandbox's main process exits or ctx is done.
func (s *Sandboxes[S]) Wait(ctx context.Context, id string) (sandbox.ExitStatus, error) {
	e, err := s.Lookup(id)
	if err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("wait: %w", err)
	}
	if err := e.WaitExit(ctx); err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("wait for sandbox %s: %w", id, err)
	}
	return s.ops.ExitStatus(e), nil
}

// Status returns the sandbox's observed state from its launcher and state
// dir.
func (s *Sandboxes[S]) Status(ctx context.Context, id string) (sandbox.Status, error) {
	e, err := s.Lookup(id)
	if err != nil {
		return sandbox.Status{}, fmt.Errorf("status: %w", err)
	}
	st := sandbox.Status{StartedAt: e.St.launch().CreatedAt}
	switch {
	case e.Running() && s.ops.Creating != nil && s.ops.Creating(e):
		st.State = sandbox.StateCreating
	case e.Running():
		st.State = sandbox.StateRunning
	default:
		es := s.ops.ExitStatus(e)
		st.State, st.Exit, st.Message = sandbox.StateExited, &es, es.Message
	}
	return st, nil
}

// Stop asks the sandbox's processes to end, waits up to grace, then kills
// them all. Stopping a stopped sandbox returns nil.
func (s *Sandboxes[S]) Stop(ctx context.Context, id string, grace time.Duration) error {
	e, err := s.Lookup(id)
	if err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	if !e.Running() {
		return nil
	}
	if grace > 0 {
		s.ops.Term(ctx, e)
		gctx, cancel := context.WithTimeout(ctx, grace)
		err := e.WaitExit(gctx)
		cancel()
		if err == nil && s.ops.Leftovers != nil {
			err = s.ops.Leftovers(ctx, e)
		}
		if err == nil {
			s.log.Info("sandbox stopped", logkey.SandboxID, id)
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("stop sandbox %s: %w", id, ctx.Err())
		}
	}
	if err := s.ops.Kill(ctx, e); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", id, err)
	}
	s.log.Info("sandbox killed", logkey.SandboxID, id, "grace", grace)
	return nil
}

// List returns the sandboxes in the state dir whose labels include
// selector.
func (s *Sandboxes[S]) List(ctx context.Context, selector map[string]string) ([]sandbox.Handle, error) {
	return Handles(s.Dir, s.name, s.version, selector)
}

// Destroy kills the sandbox if it runs, releases it, and removes its
// cgroups, the directories it was given and its state dir. Unknown ids
// return nil, after removing what a crashed Create may have left; so does
// a sandbox whose state.json a power loss tore (its cgroups and state dir
// go by its name; the directories it was given stay its identity's).
func (s *Sandboxes[S]) Destroy(ctx context.Context, id string) error {
	if sandbox.ValidateID(id) != nil || id == s.reserved {
		return nil
	}
	unlock := s.Dir.Lock(id)
	defer unlock()
	return s.destroy(ctx, id, false)
}

// Retire is Destroy for a sandbox whose main process ended by checkpoint
// (a sandbox.Checkpointer's): it keeps the lease of the sandbox's
// identity, for the Restore of the same id. The caller holds the id's
// lock.
func (s *Sandboxes[S]) Retire(ctx context.Context, id string) error {
	return s.destroy(ctx, id, true)
}

func (s *Sandboxes[S]) destroy(ctx context.Context, id string, keepLease bool) error {
	e, err := s.Lookup(id)
	if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errTorn) {
		if errors.Is(err, errTorn) {
			s.log.Warn("sandbox state unreadable; removing what is named after it", logkey.SandboxID, id, logkey.Error, err)
		}
		if err := s.Dir.RemoveLeftovers(s.cg, id, keepLease); err != nil {
			return fmt.Errorf("destroy sandbox %s: %w", id, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	if err := s.Stop(ctx, id, 0); err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	if s.ops.Release != nil {
		if err := s.ops.Release(ctx, e.St); err != nil {
			return fmt.Errorf("destroy sandbox %s: %w", id, err)
		}
	}
	if err := s.Dir.Remove(e.St.launch(), e.Dir, keepLease); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	s.Dir.Forget(id)
	s.log.Info("sandbox destroyed", logkey.SandboxID, id, "checkpointed", keepLease)
	return nil
}

// DecideWithin bounds how long RecoverDecided waits for a sandbox's start
// to be decided; past it the sandbox is killed, which decides it.
const DecideWithin = 10 * time.Second

// RecoverDecided is Recover, once the sandbox's start is decided: while
// undecided says its main process may still get its command or end without
// it, it waits (moments: the server that would have let it go is gone,
// and what it held closed with it); one still undecided after
// DecideWithin (a host too busy to schedule it) is stopped at once, so
// nothing of its task runs after all.
func (s *Sandboxes[S]) RecoverDecided(ctx context.Context, h *sandbox.Handle, undecided func(*Entry[S]) bool) error {
	if err := s.Recover(ctx, h); err != nil {
		return err
	}
	e, err := s.Lookup(h.ID)
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	deadline := time.Now().Add(DecideWithin)
	for undecided(e) && e.Running() {
		if time.Now().After(deadline) {
			s.log.Warn("a sandbox's start was still undecided after a restart; killing it", logkey.SandboxID, h.ID, "waited", DecideWithin)
			return s.Stop(ctx, h.ID, 0)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("recover sandbox %s: %w", h.ID, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}
