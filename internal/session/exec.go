package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/execagent"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// ExecBounded runs req.Command with sh -c in session req.SessionID and
// returns its end with at most max bytes of each stream; onOutput, when
// not nil, gets every chunk as it comes.
func (m *Manager) ExecBounded(ctx context.Context, req service.SessionExecRequest, max int, onOutput func(stream string, data []byte)) (service.SessionExecResult, error) {
	out := &bounded{stream: "stdout", kept: clip.Writer{Max: max}, on: onOutput}
	errw := &bounded{stream: "stderr", kept: clip.Writer{Max: max}, on: onOutput}
	end, err := m.Exec(ctx, req.SessionID, ExecRequest{Shell: req.Command, Dir: req.Cwd, Timeout: time.Duration(req.TimeoutSeconds) * time.Second}, out, errw)
	if err != nil {
		return service.SessionExecResult{}, err
	}
	return service.SessionExecResult{
		ExitCode: end.ExitCode, DurationMS: end.DurationMS, Error: end.Error,
		Stdout: out.kept.String(), Stderr: errw.kept.String(),
		StdoutTruncated: out.kept.Cut, StderrTruncated: errw.kept.Cut,
	}, nil
}

// bounded keeps the first bytes of a stream and passes every chunk on.
type bounded struct {
	stream string
	kept   clip.Writer
	on     func(string, []byte)
}

func (w *bounded) Write(p []byte) (int, error) {
	if w.on != nil {
		w.on(w.stream, p)
	}
	return w.kept.Write(p)
}

// writerWait is how long a session on a named workspace waits for the
// workspace's writer to let go before it is refused.
const writerWait = 3 * time.Second

// agentWait is how long a session's creation, or a command, waits for its
// exec agent to dial in.
const agentWait = 30 * time.Second

// maxStdin bounds the stdin an exec is given; maxExecTimeout its timeout.
const (
	maxStdin       = 16 << 20
	maxExecTimeout = 24 * time.Hour
)

// agent returns session id's connected exec agent, or nil.
func (m *Manager) agent(id string) *execagent.Conn {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.agents[id]
	if a == nil {
		return nil
	}
	select {
	case <-a.Done():
		delete(m.agents, id)
		return nil
	default:
		return a
	}
}

// AttachAgent takes session id's exec agent's connection, which upgrade
// hands over (answering the agent's request with its 101) once the agent
// is let in; an agent refused is answered with the error, upgrade not
// called, so it backs off before it dials again. An agent whose replica is
// gone reaches this one on the host's shared socket: the session is
// adopted (session_adopted) and runs here from now on. One of a replica
// still alive is refused: it dials its own again. hostSocket says the dial
// came on a unix socket, from a sandbox of this host, which dials another
// replica's only once its own replica's socket no longer answers: that
// replica is gone, and the dial is held until this one sees its lease
// lapse (at most TTL+Renew, while ctx lasts) rather than refused. One over
// TCP may have reached this replica through a load balancer in front of
// the one that runs its session, and is refused at once.
func (m *Manager) AttachAgent(ctx context.Context, id string, hostSocket bool, upgrade func() (net.Conn, io.Reader, error)) error {
	m.mu.Lock()
	held := m.held[id]
	m.mu.Unlock()
	if held != nil {
		// Restored, the agent dials in at its SIGCONT, before its
		// resume (or its fork) is recorded: held until it is, not
		// refused to dial again (10 to 80 ms of a resume under
		// ptrace). It attaches after the record all the same: its
		// commands are taken over by then, and its hello names none
		// the server does not know.
		<-held
	}
	if hostSocket {
		m.waitLapse(ctx, id, cluster.TTL+cluster.Renew)
	}
	if err := m.Running(id); err != nil {
		return err
	}
	// Not the request's context: an adoption recorded goes on to take
	// over the session's commands, even if its agent hangs up meanwhile.
	if err := m.adopt(context.Background(), id); err != nil {
		return err
	}
	conn, r, err := upgrade()
	if err != nil {
		return err
	}
	c := execagent.NewConn(conn, r, &agentHandler{m: m, session: id})
	m.mu.Lock()
	old := m.agents[id]
	m.agents[id] = c
	close(m.attached)
	m.attached = make(chan struct{})
	m.mu.Unlock()
	// Registered first: its hello's answers may kill through it.
	c.Serve()
	if old != nil {
		old.Close()
	}
	m.log.Debug("session exec agent attached", "session_id", id)
	return nil
}

// waitLapse waits, for at most d or until ctx ends, while session id runs
// on another replica that this one counts alive: a replica killed stays
// so for up to TTL+Renew after its last renewal.
func (m *Manager) waitLapse(ctx context.Context, id string, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		changed := m.opts.Members.Changed()
		if !m.runElsewhere(id) {
			return
		}
		select {
		case <-changed:
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// hold holds session id's exec agent's dial (AttachAgent) until release
// is called: its sandbox was restored, and the record its commands are
// taken over by is not made yet.
func (m *Manager) hold(id string) (release func()) {
	ch := make(chan struct{})
	m.mu.Lock()
	m.held[id] = ch
	m.mu.Unlock()
	return sync.OnceFunc(func() {
		m.mu.Lock()
		delete(m.held, id)
		m.mu.Unlock()
		close(ch)
	})
}

// adopt makes this replica the one that runs session id, if another ran it
// and is gone: under the session's version, so that of two replicas
// adopting it at once (an agent's dial, endOrphans) one wins and the other
// is refused.
func (m *Manager) adopt(ctx context.Context, id string) error {
	m.mu.Lock()
	from, version := m.sessions[id].replica, m.sessions[id].version
	m.mu.Unlock()
	self := m.opts.Members.Self()
	if from == self {
		return nil
	}
	if m.runElsewhere(id) {
		return fmt.Errorf("session %s runs on replica %s, which is alive: %w", id, from, errdefs.ErrFailedPrecondition)
	}
	if err := m.appendAt(ctx, id, version, EventAdopted, adopted{Replica: self, From: from}); err != nil {
		if errors.Is(err, eventstore.ErrVersionConflict) {
			m.sync(ctx)
			return fmt.Errorf("session %s changed while this replica adopted it (another may have): %w", id, errdefs.ErrConflict)
		}
		return fmt.Errorf("adopt session %s: %w", id, err)
	}
	m.log.Info("session adopted", "session_id", id, "from", from)
	// Its sandbox's egress socket is in the data root, which the replicas
	// share: this one listens there now.
	if s, err := m.get(id); err == nil && s.Network != "" && s.Network != task.NetworkNone && m.opts.Egress != nil {
		if _, err := m.opts.Egress.Open(id, s.Network, s.NetworkAllow); err != nil {
			m.log.Warn("cannot open an adopted session's egress proxy", "session_id", id, "err", err)
		}
	}
	// The commands the gone replica ran go on in the sandbox: the agent
	// names them when it dials in here, and they are taken over.
	m.restoreExecs(ctx, id)
	return nil
}

// waitAgent waits up to d for session id's exec agent to attach; attached
// is the Manager's attach signal from before the sandbox started.
func (m *Manager) waitAgent(ctx context.Context, id string, attached <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for m.agent(id) == nil {
		select {
		case <-attached:
			m.mu.Lock()
			attached = m.attached
			m.mu.Unlock()
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
	return true
}
