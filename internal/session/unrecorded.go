package session

import (
	"context"
	"os"
	"path/filepath"

	"github.com/corral-dev/corral/internal/workspace"
)

// A session's own directory (sessions/<id>) is made before the session is
// recorded: a fork's is filled with a copy of its source's files, which
// takes a while. A server killed in between leaves a directory no
// session names, a half copy perhaps, which nothing would ever remove.
// So a making mark in run/sessions/<id> (the server's) names the replica
// making it, from before the directory until the record; the next server
// to start removes the directory of a session the log does not know whose
// mark names it or a replica that is gone (sweepUnrecorded). A session
// recorded is whole (its directory was filled before its sandbox
// started, and its sandbox before its record): its mark alone goes.

// makingName is the making mark's file in run/sessions/<id>.
const makingName = "making"

func (m *Manager) makingPath(id string) string {
	return m.opts.Data.HostPath(workspace.DirRun, "sessions", id, makingName)
}

// markMaking marks session id's own directory as being made here.
func (m *Manager) markMaking(id string) error {
	p := m.makingPath(id)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	return os.WriteFile(p, []byte(m.opts.Members.Self()), 0o600)
}

// sweepUnrecorded removes the directories of sessions made here, or by a
// replica that is gone, that were never recorded, and their marks; and
// the marks of sessions recorded.
func (m *Manager) sweepUnrecorded(ctx context.Context) {
	run := m.opts.Data.HostPath(workspace.DirRun, "sessions")
	ents, err := os.ReadDir(run)
	if err != nil {
		return
	}
	for _, e := range ents {
		id := e.Name()
		maker, err := os.ReadFile(m.makingPath(id))
		if err != nil || !ValidID(id) {
			continue
		}
		if _, err := m.get(id); err == nil {
			os.Remove(m.makingPath(id))
			continue
		}
		if r := string(maker); r != m.opts.Members.Self() {
			if _, alive := m.opts.Members.Alive(r); alive {
				continue // being made there now
			}
		}
		if m.opts.Quota != nil {
			m.opts.Quota.Release(ctx, id, ownDir(id))
		}
		if err := m.opts.Data.Root().RemoveAll(ownDir(id)); err != nil {
			m.log.Warn("cannot remove the directory of a session never recorded", "session_id", id, "err", err)
			continue
		}
		os.RemoveAll(filepath.Join(run, id))
		m.log.Info("removed the directory of a session never recorded (its server stopped while making it)", "session_id", id)
	}
}
