package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
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
	Note         string   `json:"note"`
	Seconds      float64  `json:"seconds"`
}

// forkNote is what a fork says of what it keeps.
const forkNote = "files copied (what the source wrote while they were, it may have changed under the copy: suspend it first for a still one); its processes and memory are not: a fork's sandbox starts fresh on its copy, as its own host identity, which the source's processes, kept in its memory, could not run as"

// Fork makes count sessions from a copy of running or suspended session
// id's directory (its own, or the workspace in the data root it works
// in), each with its own directory, id, token and egress proxy, and the
// source's runtime, image, limits, network policy and timeouts. The
// source runs on meanwhile.
func (m *Manager) Fork(ctx context.Context, id string, count int) (service.SessionFork, error) {
	if count < 1 || count > MaxForks {
		return service.SessionFork{}, errdefs.Field("count", fmt.Sprintf("must be between 1 and %d", MaxForks))
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
	src, err := m.opts.Data.Root().OpenRoot(dir)
	if err != nil {
		return service.SessionFork{}, fmt.Errorf("open the session's directory: %w", err)
	}
	defer src.Close()
	start := time.Now()
	res := service.SessionFork{Note: forkNote}
	ev := forked{Note: forkNote}
	req := CreateRequest{Runtime: s.Runtime, Image: s.Image, Network: s.Network, Labels: s.Labels, IdleTimeout: s.IdleTimeout, MaxLifetime: s.MaxLifetime}
	for range count {
		var copied workspace.TreeCopy
		f, token, err := m.create(ctx, req, createFrom{forkedFrom: id, limits: limits, allow: s.NetworkAllow,
			seed: func(ctx context.Context, dst *os.Root) (err error) {
				copied, err = workspace.CopyTree(ctx, src, dst)
				if err == nil && m.opts.Crash != nil {
					m.opts.Crash(sandbox.CrashForkCopied)
				}
				return err
			}})
		if err != nil {
			err = fmt.Errorf("fork %d of %d: %w", len(res.Forks)+1, count, err)
			if len(res.Forks) == 0 {
				return service.SessionFork{}, err
			}
			// Those made are the caller's: say which, with the error.
			res.Note = errdefs.Message(err) + "; " + res.Note
			break
		}
		res.Forks = append(res.Forks, service.SessionCreated{SessionID: f.ID, Token: token, Session: f})
		ev.Forks = append(ev.Forks, f.ID)
		res.Files, res.Bytes, res.Skipped = copied.Files, copied.Bytes, copied.Skipped
		ev.Files, ev.Bytes, ev.SkippedTotal = copied.Files, copied.Bytes, copied.SkippedTotal
	}
	ev.Seconds = time.Since(start).Seconds()
	if err := m.append(ctx, id, EventForked, ev); err != nil {
		// The forks are made and recorded on their own streams.
		m.log.Warn("cannot record a fork on its source's stream", "session_id", id, "err", err)
	}
	m.log.Info("session forked", "session_id", id, "forks", len(res.Forks), "files", ev.Files, "bytes", ev.Bytes, "seconds", ev.Seconds)
	return res, nil
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
