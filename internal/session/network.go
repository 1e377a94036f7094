package session

import (
	"context"
	"fmt"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// SetNetwork implements service.Sessions: it records a running session's
// new network policy (session_network_changed) and, when this replica
// runs the session, has its proxy take it before it answers; the replica
// that runs it otherwise follows the event (Follow).
func (m *Manager) SetNetwork(ctx context.Context, id string, req service.NetworkRequest) (Session, error) {
	m.known(ctx, id)
	s, err := m.get(id)
	if err != nil {
		return Session{}, err
	}
	if s.Status != StatusRunning {
		return Session{}, fmt.Errorf("session %s ended (%s): %w", id, s.EndReason, errdefs.ErrConflict)
	}
	if err := service.CheckNetwork(m.opts.Networks, m.opts.CheckAllow, req.Network, req.Allow, "network", "allow"); err != nil {
		return Session{}, err
	}
	if s.Network == task.NetworkNone && req.Network != task.NetworkNone {
		return Session{}, fmt.Errorf("session %s started with network none: its sandbox has no way to the egress proxy: %w", id, errdefs.ErrConflict)
	}
	if err := m.append(ctx, id, EventNetworkChanged, task.NetworkChanged{Network: req.Network, Allow: req.Allow}); err != nil {
		return Session{}, err
	}
	m.followNetwork(ctx)
	return m.Get(ctx, id)
}

// followNetwork has the proxy of each session this replica runs, or lent
// its pod (EgressKey), take its policy, if it changed since it last did.
func (m *Manager) followNetwork(ctx context.Context) {
	if m.opts.Egress == nil {
		return
	}
	type change struct {
		id, network string
		allow       []string
	}
	var changes []change
	m.mu.Lock()
	self := m.opts.Members.Self()
	for id, s := range m.sessions {
		if s.netChanged && (s.replica == self || s.lent) && s.Status == StatusRunning {
			changes = append(changes, change{id, s.Network, s.NetworkAllow})
			s.netChanged = false
		}
	}
	m.mu.Unlock()
	for _, c := range changes {
		if err := m.opts.Egress.Update(c.id, c.network, c.allow); err != nil {
			m.log.Warn("cannot change a session's egress policy", "session_id", c.id, "err", err)
			continue
		}
		m.log.Info("session egress policy changed", "session_id", c.id, "network", c.network, "allow", len(c.allow))
	}
}
