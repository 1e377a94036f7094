package session

import (
	"context"
	"fmt"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// A suspended session holds no sandbox: its directory, image, network
// policy, token and workspace are kept, and resuming starts a sandbox of
// the same making again. What ran in it is not kept: no runtime here
// checkpoints a session's memory yet, so its processes end with the
// suspend, and the answer and the session_suspended event say so.

// Events of a suspend and a resume.
const (
	EventSuspended = "session_suspended"
	EventResumed   = "session_resumed"
)

// suspended is session_suspended's payload.
type suspended struct {
	// MemoryKept says the session's processes and memory come back with
	// a resume; false: only its files do.
	MemoryKept bool `json:"memory_kept"`
	// ExecsEnded are the commands that were running, ended by the
	// suspend.
	ExecsEnded int    `json:"execs_ended"`
	Note       string `json:"note"`
}

// resumed is session_resumed's payload.
type resumed struct {
	AgentTokenHash string         `json:"agent_token_hash"`
	Handle         sandbox.Handle `json:"handle"`
	Replica        string         `json:"replica"`
	MemoryKept     bool           `json:"memory_kept"`
}

// filesOnly is what a suspend says of what it keeps.
const filesOnly = "files kept; the session's processes ended (no runtime here keeps a session's memory yet): a resume starts a fresh sandbox on the same directory"

// Suspend ends the sandbox of running session id and keeps the rest for a
// Resume.
func (m *Manager) Suspend(ctx context.Context, id string) (service.SessionSuspend, error) {
	s, err := m.suspend(ctx, id)
	return service.SessionSuspend{Session: s, Note: filesOnly}, err
}

func (m *Manager) suspend(ctx context.Context, id string) (Session, error) {
	s, err := m.get(id)
	if err != nil {
		return Session{}, err
	}
	switch {
	case s.Status == StatusSuspended:
		return s, nil
	case s.Status != StatusRunning:
		return Session{}, fmt.Errorf("session %s ended (%s): %w", id, s.EndReason, errdefs.ErrFailedPrecondition)
	case m.runElsewhere(id):
		return Session{}, fmt.Errorf("session %s runs on another replica: %w", id, errdefs.ErrUnavailable)
	}
	m.mu.Lock()
	running := m.sessions[id].running
	m.mu.Unlock()
	m.endExecsWith(id, "lost: the session was suspended, and its processes ended with it")
	if p := m.opts.Placements.Usable(s.Runtime); p != nil {
		if err := p.Sandbox.Destroy(ctx, id); err != nil {
			return Session{}, fmt.Errorf("stop the session's sandbox: %w", err)
		}
	}
	if m.opts.Egress != nil && s.Network != "" && s.Network != task.NetworkNone {
		m.opts.Egress.Close(id)
	}
	m.mu.Lock()
	if a := m.agents[id]; a != nil {
		a.Close()
		delete(m.agents, id)
	}
	m.mu.Unlock()
	if err := m.append(ctx, id, EventSuspended, suspended{ExecsEnded: running, Note: filesOnly}); err != nil {
		return Session{}, err
	}
	m.log.Info("session suspended", "session_id", id, "memory_kept", false)
	return m.get(id)
}

// Resume starts suspended session id's sandbox again, as it was made:
// its directory, image, limits and network policy, with a new token for
// its exec agent; it answers once the agent has dialled in.
func (m *Manager) Resume(ctx context.Context, id string) (Session, error) {
	s, err := m.get(id)
	if err != nil {
		return Session{}, err
	}
	switch s.Status {
	case StatusRunning:
		return s, nil
	case StatusSuspended:
	default:
		return Session{}, fmt.Errorf("session %s ended (%s): %w", id, s.EndReason, errdefs.ErrFailedPrecondition)
	}
	p := m.opts.Placements.Usable(s.Runtime)
	if p == nil {
		return Session{}, fmt.Errorf("session %s's runtime %s is not available here: %w", id, s.Runtime, errdefs.ErrFailedPrecondition)
	}
	m.mu.Lock()
	n := 0
	for _, o := range m.sessions {
		if o.Status == StatusRunning {
			n++
		}
	}
	st := m.sessions[id]
	o := sandboxOf{id: id, image: s.Image, network: s.Network, allow: s.NetworkAllow, dir: st.dir, hostDir: st.hostDir, limits: m.opts.Limits}
	if st.limits != nil {
		o.limits = *st.limits
	}
	attached := m.attached
	m.mu.Unlock()
	if m.opts.MaxSessions > 0 && n >= m.opts.MaxSessions {
		return Session{}, fmt.Errorf("%d sessions run already, the limit (sessions.max_sessions); end or suspend one first: %w", n, errdefs.ErrResourceExhausted)
	}
	if o.dir == "" {
		if s.Workspace != "" {
			return Session{}, fmt.Errorf("session %s was made by a server that did not record its workspace's directory; it cannot be resumed: %w", id, errdefs.ErrFailedPrecondition)
		}
		o.dir = ownDir(id)
	}
	h, agentToken, err := m.startSandbox(ctx, p.Sandbox, o)
	if err != nil {
		return Session{}, err
	}
	if err := m.append(ctx, id, EventResumed, resumed{AgentTokenHash: hashToken(agentToken), Handle: *h, Replica: m.opts.Members.Self()}); err != nil {
		p.Sandbox.Destroy(context.WithoutCancel(ctx), id)
		return Session{}, err
	}
	if !m.waitAgent(ctx, id, attached, agentWait) {
		m.end(context.WithoutCancel(ctx), id, "agent_not_connected")
		return Session{}, fmt.Errorf("the session's exec agent did not connect within %s after the resume; the session is ended: %w", agentWait, errdefs.ErrUnavailable)
	}
	m.log.Info("session resumed", "session_id", id, "memory_kept", false)
	return m.get(id)
}
