package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/ids"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/workspace"
)

// EventForked is on the source's stream: the sessions a fork made of it.
const EventForked = "session_forked"

// MaxForks bounds the sessions one fork makes.
const MaxForks = 16

// forked is session_forked's payload.
type forked struct {
	Forks        []string `json:"forks"`
	Files        int      `json:"files"`
	Bytes        int64    `json:"bytes"`
	SkippedTotal int      `json:"skipped_total,omitempty"`
	MemoryKept   bool     `json:"memory_kept"`
	// ExecsInherited are the running commands each fork took over.
	ExecsInherited int     `json:"execs_inherited,omitempty"`
	Note           string  `json:"note"`
	Seconds        float64 `json:"seconds"`
	// PausedSeconds is how long the source was stopped for the
	// snapshot of its memory and files.
	PausedSeconds float64 `json:"paused_seconds,omitempty"`
}

// What a fork says of what it keeps.
const (
	forkNote       = "files copied (what the source wrote while they were, it may have changed under the copy: suspend it first for a still one); its processes and memory are not: a fork's sandbox starts fresh on its copy"
	forkMemoryNote = "files, memory and processes copied: each fork's sandbox is restored from a snapshot of the source (checkpointed, its files copied, and resumed: paused_seconds), its running commands going on under their ids; a fork runs as its source's host identity, which the processes restored keep"
)

// Fork makes count sessions from running or suspended session id, each
// with its own directory, id, token and egress proxy, and the source's
// runtime, image, limits, network policy and timeouts. Where its runtime
// restores a sandbox from another's memory (sandbox.Forker), the forks
// start from a snapshot of the source, its processes and running commands
// included (snapshot): the source stops while it is taken. Elsewhere they
// start fresh on a copy of its directory (its own, or the workspace in
// the data root it works in), and the source runs on meanwhile.
func (m *Manager) Fork(ctx context.Context, id string, count int) (service.SessionFork, error) {
	if count < 1 || count > MaxForks {
		return service.SessionFork{}, errdefs.Field("count", fmt.Sprintf("must be between 1 and %d", MaxForks))
	}
	// Each fork copies the source's files: none starts below the floor.
	if err := m.opts.Data.CheckFreeSpace(m.opts.MinFreeBytes); err != nil {
		return service.SessionFork{}, err
	}
	ctx, end := m.begin(ctx, id)
	defer end()
	s, err := m.get(id)
	if err != nil {
		return service.SessionFork{}, err
	}
	if s.Status != StatusRunning && s.Status != StatusSuspended {
		return service.SessionFork{}, fmt.Errorf("session %s ended (%s): %w", id, s.EndReason, errdefs.ErrFailedPrecondition)
	}
	m.mu.Lock()
	st := m.sessions[id]
	dir, hostDir, limits := st.dir, st.hostDir, st.limits
	m.mu.Unlock()
	switch {
	case hostDir:
		return service.SessionFork{}, fmt.Errorf("session %s works in a workspace outside the data root, which a fork does not copy yet: %w", id, errdefs.ErrFailedPrecondition)
	case dir == "":
		dir = ownDir(id)
	}
	start := time.Now()
	ev := forked{Note: forkNote}
	snap, why, err := m.snapshot(ctx, id, dir)
	if err != nil {
		return service.SessionFork{}, err
	}
	if snap != nil {
		defer snap.remove()
		dir = snap.files
		ev.MemoryKept, ev.Note, ev.ExecsInherited, ev.PausedSeconds = true, forkMemoryNote, len(snap.execs), snap.paused.Seconds()
	}
	if why != "" {
		ev.Note += "; " + why
	}
	src, err := m.opts.Data.Root().OpenRoot(dir)
	if err != nil {
		return service.SessionFork{}, fmt.Errorf("open the session's directory: %w", err)
	}
	defer src.Close()
	req := CreateRequest{Runtime: s.Runtime, Image: s.Image, Network: s.Network, Labels: s.Labels, IdleTimeout: s.IdleTimeout, MaxLifetime: s.MaxLifetime}
	// As many at once as the host has CPUs: a restore from memory is
	// mostly the CPU's, a copy of files the disk's, and ten forks restored
	// one after another took ten restores' time.
	made := makeForks(ctx, count, runtime.NumCPU(), func(ctx context.Context) madeFork {
		var f madeFork
		f.session, f.token, f.err = m.create(ctx, req, createFrom{forkedFrom: id, limits: limits, allow: s.NetworkAllow, memory: snap,
			seed: func(ctx context.Context, dst *os.Root) (err error) {
				if f.copied, err = workspace.CopyTree(ctx, src, dst); err == nil {
					// The fork is recorded next: its files must be there
					// after a crash.
					err = workspace.SyncFS(dst)
				}
				if err == nil && m.opts.Crash != nil {
					m.opts.Crash(sandbox.CrashForkCopied)
				}
				return err
			}})
		return f
	})
	res := service.SessionFork{}
	var failed error
	for i, f := range made {
		if f.err != nil {
			if failed == nil {
				failed = fmt.Errorf("fork %d of %d: %w", i+1, count, f.err)
			}
			continue
		}
		res.Forks = append(res.Forks, service.SessionCreated{SessionID: f.session.ID, Token: f.token, Session: f.session})
		ev.Forks = append(ev.Forks, f.session.ID)
		copied := f.copied
		if snap != nil {
			// What the snapshot's copy skipped is not in it to skip.
			copied.Skipped, copied.SkippedTotal = snap.copied.Skipped, snap.copied.SkippedTotal
		}
		res.Files, res.Bytes, res.Skipped = copied.Files, copied.Bytes, copied.Skipped
		ev.Files, ev.Bytes, ev.SkippedTotal = copied.Files, copied.Bytes, copied.SkippedTotal
	}
	if failed != nil {
		if len(res.Forks) == 0 {
			return service.SessionFork{}, failed
		}
		// Those made are the caller's: say which, with the error.
		ev.Note = errdefs.Message(failed) + "; " + ev.Note
	}
	res.MemoryKept, res.Note, res.PausedSeconds = ev.MemoryKept, ev.Note, ev.PausedSeconds
	ev.Seconds = time.Since(start).Seconds()
	if err := m.append(ctx, id, EventForked, ev); err != nil {
		// The forks are made and recorded on their own streams.
		m.log.Warn("cannot record a fork on its source's stream", "session_id", id, "err", err)
	}
	m.log.Info("session forked", "session_id", id, "forks", len(res.Forks), "files", ev.Files, "bytes", ev.Bytes, "memory_kept", ev.MemoryKept,
		"seconds", ev.Seconds, "paused_seconds", ev.PausedSeconds)
	return res, nil
}

// madeFork is one fork's session and token, what its seed copied, or
// why it was not made.
type madeFork struct {
	session Session
	token   string
	copied  workspace.TreeCopy
	err     error
}

// makeForks runs one count times, at most parallel at once, and returns
// what each made, in order. Once one fails no other starts; those started
// finish. A fork not started says so.
func makeForks(ctx context.Context, count, parallel int, one func(context.Context) madeFork) []madeFork {
	made := make([]madeFork, count)
	var g errgroup.Group
	g.SetLimit(max(1, parallel))
	var failed atomic.Bool
	for i := range made {
		// Each waits for a place, which a fork gives up only once it has
		// said whether it failed.
		g.Go(func() error {
			if failed.Load() {
				made[i].err = errNotStarted
				return nil
			}
			if made[i] = one(ctx); made[i].err != nil {
				failed.Store(true)
			}
			return nil
		})
	}
	g.Wait()
	return made
}

// errNotStarted is a fork's that was not started: one before it failed.
var errNotStarted = errors.New("not started: a fork before it failed")

// snapshot is a session's memory, files and running commands, taken for
// its forks in a directory of the server's (run/sessions/<id>/fork-*):
// the checkpoint's image (linked, not copied), a copy of its files, and
// of the output so far of the commands it runs.
type snapshot struct {
	from           string
	dir            string // the host path of the snapshot
	image          string // the checkpoint, a host path
	files          string // the copy of the files, in the data root
	copied         workspace.TreeCopy
	execs          []inheritedExec
	agentTokenHash string
	paused         time.Duration
}

// forkPrefix names a snapshot's directory in run/sessions/<id>.
const forkPrefix = "fork-"

// snapshot takes one of session id (its files in dir) when its runtime
// restores a sandbox from another's memory; else it answers nil and, if
// there is one beyond the runtime's, why not. A running session is
// suspended with its memory for the snapshot and resumed after it; one
// whose memory cannot be kept runs on (or, as after a suspend whose
// checkpoint ended its sandbox, resumes with its files alone), and the
// forks get its files.
func (m *Manager) snapshot(ctx context.Context, id, dir string) (snap *snapshot, why string, err error) {
	s, err := m.get(id)
	if err != nil {
		return nil, "", err
	}
	p := m.opts.Placements.Usable(s.Runtime)
	if _, ok := checkpointer(p); !ok || !selfNamed(p) {
		return nil, "", nil
	}
	m.mu.Lock()
	named := m.sessions[id].selfNamed
	m.mu.Unlock()
	switch {
	case !named:
		return nil, "its memory is not: the session was made by a server before forks kept memory", nil
	case s.Status == StatusSuspended && !s.MemoryKept:
		return nil, "", nil
	}
	paused := time.Now()
	if s.Status == StatusRunning {
		sus, err := m.suspend(ctx, id, false)
		if err != nil {
			return nil, "its memory is not: " + errdefs.Message(err), nil
		}
		if !sus.MemoryKept {
			why = "its memory could not be copied, and the source's processes ended (" + sus.Note + ")"
			if _, err := m.resume(ctx, id); err != nil {
				why += "; the source could not be resumed: " + errdefs.Message(err)
			}
			return nil, why, nil
		}
		// Resumed whether or not the snapshot was taken; forks made
		// from one whose source could not be are made all the same,
		// and the note says so.
		defer func() {
			if _, rerr := m.resume(ctx, id); rerr != nil {
				why = "the source could not be resumed after its snapshot (" + errdefs.Message(rerr) + "); it is suspended"
			}
			if snap != nil {
				snap.paused = time.Since(paused)
			}
		}()
	}
	if snap, err = m.takeSnapshot(ctx, id, dir); err != nil {
		return nil, "", err
	}
	return snap, "", nil
}

// takeSnapshot copies suspended session id's checkpoint, files (in dir)
// and running commands' output aside for its forks.
func (m *Manager) takeSnapshot(ctx context.Context, id, dir string) (_ *snapshot, err error) {
	rel := filepath.Join(workspace.DirRun, "sessions", id, forkPrefix+ids.New())
	snap := &snapshot{from: id, dir: m.opts.Data.HostPath(rel), files: filepath.Join(rel, "files")}
	snap.image = filepath.Join(snap.dir, "image")
	defer func() {
		if err != nil {
			snap.remove()
		}
	}()
	for _, d := range []string{snap.dir, snap.image, filepath.Join(snap.dir, "files"), filepath.Join(snap.dir, "execs")} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, fmt.Errorf("make the fork's snapshot: %w", err)
		}
	}
	// The checkpoint, linked: the source's resume moves its own aside.
	ents, err := os.ReadDir(m.checkpointDir(id))
	if err != nil {
		return nil, fmt.Errorf("read the source's checkpoint: %w", err)
	}
	for _, e := range ents {
		if e.Type().IsRegular() && e.Name() != checkpointDone {
			if err := os.Link(filepath.Join(m.checkpointDir(id), e.Name()), filepath.Join(snap.image, e.Name())); err != nil {
				return nil, fmt.Errorf("keep the source's checkpoint for its forks: %w", err)
			}
		}
	}
	src, err := m.opts.Data.Root().OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open the session's directory: %w", err)
	}
	defer src.Close()
	dst, err := m.opts.Data.Root().OpenRoot(snap.files)
	if err != nil {
		return nil, err
	}
	defer dst.Close()
	// Not made durable: a crash leaves the snapshot to be removed.
	if snap.copied, err = workspace.CopyTree(ctx, src, dst); err != nil {
		return nil, fmt.Errorf("copy the source's files: %w", err)
	}
	m.mu.Lock()
	st := m.sessions[id]
	snap.agentTokenHash = st.agentTokenHash
	for ex, o := range st.openExecs {
		snap.execs = append(snap.execs, inheritedExec{ExecID: ex, StartedAt: o.At, TimeoutSeconds: int(o.Timeout / time.Second)})
	}
	m.mu.Unlock()
	for _, x := range snap.execs {
		if err := copyFiles(m.execDir(id, x.ExecID), filepath.Join(snap.dir, "execs", x.ExecID)); err != nil {
			return nil, fmt.Errorf("copy the output of the source's command %s: %w", x.ExecID, err)
		}
	}
	if m.opts.Crash != nil {
		m.opts.Crash(sandbox.CrashForkSnapshot)
	}
	return snap, nil
}

// giveExecs copies the output so far of the snapshot's running commands
// to fork id's exec logs, and returns them.
func (s *snapshot) giveExecs(m *Manager, id string) ([]inheritedExec, error) {
	for _, x := range s.execs {
		if err := os.MkdirAll(filepath.Dir(m.execDir(id, x.ExecID)), 0o700); err != nil {
			return nil, err
		}
		if err := copyFiles(filepath.Join(s.dir, "execs", x.ExecID), m.execDir(id, x.ExecID)); err != nil {
			return nil, fmt.Errorf("copy the output of the source's command %s: %w", x.ExecID, err)
		}
	}
	return s.execs, nil
}

// remove removes the snapshot; a server killed before leaves it to the
// next one's start (removeDiscarded).
func (s *snapshot) remove() { os.RemoveAll(s.dir) }

// copyFiles copies the regular files of directory src, the server's own,
// into a new directory dst.
func copyFiles(src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err == nil {
			err = os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// seed fills new session id's directory dir (in the data root) with fill,
// before its sandbox starts; a fill that fails leaves no directory.
func (m *Manager) seed(ctx context.Context, id, dir string, fill func(context.Context, *os.Root) error) error {
	dst, err := m.opts.Data.Root().OpenRoot(dir)
	if err == nil {
		err = fill(ctx, dst)
		dst.Close()
	}
	if err != nil {
		if m.opts.Quota != nil {
			m.opts.Quota.Release(ctx, id, dir)
		}
		return errors.Join(fmt.Errorf("copy the source's files into session %s: %w", id, err), m.opts.Data.Root().RemoveAll(dir))
	}
	return nil
}
