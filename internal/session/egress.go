package session

import (
	"context"

	"github.com/corral-dev/corral/internal/task"
)

// EgressKey is the key with which session id's pod proves itself to the
// server's egress listener (egress.ServeTCP): nil unless the session runs,
// on a remote runtime, with a network, so that an ended or suspended
// session's key is refused at once. The pod reaches the listener of any
// replica (they share one Service): one that does not run the session
// opens its proxy too, under the session's policy, lends it (followNetwork
// keeps it to the policy) and closes it once the session no longer runs
// (closeLent).
func (m *Manager) EgressKey(id string) []byte {
	if m.opts.Egress == nil || !ValidID(id) {
		return nil
	}
	m.known(context.Background(), id)
	s, err := m.get(id)
	if err != nil || s.Status != StatusRunning || s.Network == "" || s.Network == task.NetworkNone {
		return nil
	}
	if p, ok := m.opts.Placements.Get(s.Runtime); !ok || !p.Remote {
		return nil
	}
	m.mu.Lock()
	st := m.sessions[id]
	lend := st.replica != m.opts.Members.Self() && !st.lent
	m.mu.Unlock()
	if lend {
		if _, err := m.opts.Egress.Open(id, s.Network, s.NetworkAllow); err != nil {
			m.log.Warn("cannot open the egress proxy of a session another replica runs, for its pod", "session_id", id, "err", err)
			return nil
		}
		m.mu.Lock()
		st.lent = true
		running := st.Status == StatusRunning
		m.mu.Unlock()
		if !running {
			// Its end was folded meanwhile, maybe before closeLent could
			// see the proxy lent.
			m.closeLent()
			return nil
		}
	}
	return m.opts.Egress.Key(id)
}

// closeLent closes the proxies this replica lent to sessions that no
// longer run.
func (m *Manager) closeLent() {
	if m.opts.Egress == nil {
		return
	}
	var done []string
	m.mu.Lock()
	for id, s := range m.sessions {
		if s.lent && s.Status != StatusRunning {
			s.lent = false
			done = append(done, id)
		}
	}
	m.mu.Unlock()
	for _, id := range done {
		if err := m.opts.Egress.Close(id); err != nil {
			m.log.Warn("cannot close the egress proxy lent to a session", "session_id", id, "err", err)
		}
	}
}
