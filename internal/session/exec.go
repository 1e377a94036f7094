package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/execagent"
	"github.com/corral-dev/corral/internal/ids"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// Exec runs a command in a running session, streaming its output to stdout
// and stderr, and records its start and end. A command still running when
// ctx ends (the client went away) is stopped.
func (m *Manager) Exec(ctx context.Context, id string, req ExecRequest, stdout, stderr io.Writer) (ExecEnd, error) {
	s, err := m.get(id)
	if err != nil {
		return ExecEnd{}, err
	}
	if s.Status != StatusRunning {
		return ExecEnd{}, fmt.Errorf("session %s ended (%s): %w", id, s.EndReason, errdefs.ErrNotFound)
	}
	argv := req.Command
	if req.Shell != "" {
		argv = []string{"/bin/sh", "-c", req.Shell}
	}
	if len(argv) == 0 || argv[0] == "" || req.Shell != "" && strings.TrimSpace(req.Shell) == "" {
		return ExecEnd{}, errdefs.Field("command", "is required: an argv, or a string run with sh -c")
	}
	dir := req.Dir
	if dir == "" {
		dir = Dir
	}
	if !sandbox.CleanAbs(dir) {
		return ExecEnd{}, errdefs.Field("cwd", "must be an absolute, clean path inside the session")
	}
	if req.Timeout < 0 || req.Timeout > maxExecTimeout {
		return ExecEnd{}, errdefs.Field("timeout_seconds", "must be between 0 (none) and 86400")
	}
	for _, kv := range req.Env {
		if k, v, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsRune(k+v, 0) {
			return ExecEnd{}, errdefs.Field("env", "names must be non-empty without = or NUL, values without NUL")
		}
	}
	// Read before exec_started: a refusal leaves no exec open in the log.
	var stdin []byte
	if req.Stdin != nil {
		if stdin, err = io.ReadAll(io.LimitReader(req.Stdin, maxStdin+1)); err != nil || len(stdin) > maxStdin {
			return ExecEnd{}, errdefs.Field("stdin", fmt.Sprintf("must be at most %d bytes", maxStdin))
		}
	}
	// Only through the exec agent, never from the host (nsenter with a
	// working directory resolved on the host, where a link the session
	// left leads out; a process no one owns if the server dies). After a
	// restart the agent dials in again: wait for it a while. Its agent
	// dials the replica that runs the session, which may be another.
	if m.runElsewhere(id) {
		return ExecEnd{}, fmt.Errorf("session %s runs on another replica of this cluster, which holds its exec agent: its commands go there (the HTTP API and the MCP tools forward them): %w", id, errdefs.ErrUnavailable)
	}
	a := m.agent(id)
	if a == nil {
		m.mu.Lock()
		attached := m.attached
		m.mu.Unlock()
		if m.waitAgent(ctx, id, attached, agentWait) {
			a = m.agent(id)
		}
	}
	if a == nil {
		return ExecEnd{}, fmt.Errorf("session %s: its exec agent is not connected (the sandbox may be restarting or gone); try again: %w", id, errdefs.ErrUnavailable)
	}
	end := ExecEnd{ExecID: "exec-" + ids.New()}
	// exec_started is committed while the command starts, not before
	// (its fsync would otherwise delay the start), and before any of the
	// command's output goes out: a client that saw a byte of it finds
	// the exec in the log, with its end or with the crash's "lost".
	// exec_ended waits for it, so the two are in order. A command whose
	// start cannot be recorded (a full disk) is killed as soon as that is
	// known, its output dropped, and answers the error: no exec runs
	// unrecorded.
	cmdCtx, cancelCmd := context.WithCancelCause(ctx)
	defer cancelCmd(nil)
	recorded := make(chan struct{})
	var startErr error
	go func() {
		startErr = m.append(context.WithoutCancel(ctx), id, EventExecStart, map[string]any{"exec_id": end.ExecID, "command": clip.String(strings.Join(argv, " "), 4096)})
		if startErr != nil {
			cancelCmd(startErr)
		}
		close(recorded)
	}()
	m.mu.Lock()
	m.sessions[id].running++
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.sessions[id].running--
		m.mu.Unlock()
	}()
	ectx := cmdCtx
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ectx, cancel = context.WithTimeout(cmdCtx, req.Timeout)
		defer cancel()
	}
	out, errw := &counter{w: stdout, after: recorded, failed: &startErr}, &counter{w: stderr, after: recorded, failed: &startErr}
	start := time.Now()
	var es sandbox.ExitStatus
	es.Code, err = a.Exec(ectx, argv, dir, req.Env, stdin, out, errw)
	if err != nil && errors.Is(err, errdefs.ErrFailedPrecondition) {
		// The command did not start (not found, not executable): an
		// exit code and a message, as a shell gives them.
		end.Error, err = errdefs.Message(err), nil
	}
	end.DurationMS, end.StdoutBytes, end.StderrBytes = time.Since(start).Milliseconds(), out.n, errw.n
	end.ExitCode = es.Code
	switch {
	case err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		end.ExitCode, end.Error = 124, fmt.Sprintf("timed out after %s", req.Timeout)
		err = nil
	case err != nil:
		end.ExitCode, end.Error = -1, errdefs.Message(err)
	}
	if <-recorded; startErr != nil {
		m.log.Error("cannot record an exec's start; its command was killed", "session_id", id, "err", startErr)
		return ExecEnd{}, fmt.Errorf("the command's start could not be recorded, and it was stopped: %w", startErr)
	}
	if aerr := m.append(context.WithoutCancel(ctx), id, EventExecEnd, end); aerr != nil {
		m.log.Error("cannot record an exec's end", "session_id", id, "err", aerr)
	}
	return end, err
}

// counter counts a command's output and passes it on once after is
// closed, unless failed (read then) is set.
type counter struct {
	w      io.Writer
	n      int64
	after  <-chan struct{}
	failed *error
}

func (c *counter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	<-c.after
	if c.w == nil || *c.failed != nil {
		return len(p), nil
	}
	return c.w.Write(p)
}

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

// AttachAgent takes the connection session id's exec agent dialled in on
// (already upgraded; r reads from it), replacing any earlier one. An agent
// whose replica is gone reaches this one on the host's shared socket: the
// session is adopted (session_adopted) and runs here from now on. One of a
// replica still alive is refused: it dials its own again.
func (m *Manager) AttachAgent(id string, conn net.Conn, r io.Reader) error {
	if err := m.Running(id); err != nil {
		conn.Close()
		return err
	}
	if err := m.adopt(context.Background(), id); err != nil {
		conn.Close()
		return err
	}
	c := execagent.NewConn(conn, r)
	m.mu.Lock()
	old := m.agents[id]
	m.agents[id] = c
	close(m.attached)
	m.attached = make(chan struct{})
	m.mu.Unlock()
	if old != nil {
		old.Close()
	}
	m.log.Debug("session exec agent attached", "session_id", id)
	return nil
}

// adopt makes this replica the one that runs session id, if another ran it
// and is gone: under the session's version, so that of two replicas
// adopting it at once (an agent's dial, endOrphans) one wins and the other
// is refused. The execs the gone replica left open ended with its
// connection to the agent: each is recorded lost.
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
	return m.closeLostExecs(ctx, id)
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
