package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/execagent"
	"github.com/corral-dev/corral/internal/execlog"
	"github.com/corral-dev/corral/internal/ids"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/workspace"
)

// A session's command outlives the client that started it: its output
// goes to a log on the server's disk (package execlog) as the exec agent
// sends it, and any client reads it from any offset, following it to the
// end. The command outlives the server too: the agent keeps it running
// and its output unacknowledged while no server takes it, and the server
// that takes the session next (this one restarted, or another replica)
// finds the exec open in the log, reopens its output log, and has the
// agent send the rest from where the log ends.

// Bounds of the exec logs.
const (
	// execLogLimit is the output one exec's log keeps; the rest is
	// counted as a gap.
	execLogLimit = 16 << 20
	// execLogBudget is what a session's ended execs' logs may hold
	// together: a new exec removes the oldest ones past it.
	execLogBudget = 64 << 20
)

// execKey names a running command: a fork's commands taken over from its
// source have their ids there.
type execKey struct{ session, exec string }

// runningExec is a command running in a session run here.
type runningExec struct {
	session string
	id      string
	log     *execlog.Log
	start   time.Time
	timeout time.Duration
	timer   *time.Timer
	// recorded is closed once exec_started is committed (startErr if it
	// could not be); nothing of the command is read out before.
	recorded chan struct{}
	startErr error
	// restored: taken over from a server before this one; resumed: its
	// agent named it since.
	restored, resumed bool
	timedOut          bool
	// killed: a kill was asked for (a timeout, a client); an agent that
	// names the command after a reconnect is told again.
	killed   bool
	finished bool
	ended    chan struct{}
}

// execDir is the host directory of exec execID's log.
func (m *Manager) execDir(id, execID string) string {
	return m.opts.Data.HostPath(workspace.DirRun, "sessions", id, "execs", execID)
}

// StartExec implements service.Sessions.
func (m *Manager) StartExec(ctx context.Context, id string, req ExecRequest) (string, error) {
	s, err := m.get(id)
	if err != nil {
		return "", err
	}
	if s.Status == StatusSuspended {
		// A command wakes its session first.
		if s, err = m.Resume(ctx, id); err != nil {
			return "", fmt.Errorf("resume the suspended session: %w", err)
		}
	}
	if s.Status != StatusRunning {
		return "", fmt.Errorf("session %s ended (%s): %w", id, s.EndReason, errdefs.ErrNotFound)
	}
	argv := req.Command
	if req.Shell != "" {
		argv = []string{"/bin/sh", "-c", req.Shell}
	}
	if len(argv) == 0 || argv[0] == "" || req.Shell != "" && strings.TrimSpace(req.Shell) == "" {
		return "", errdefs.Field("command", "is required: an argv, or a string run with sh -c")
	}
	dir := req.Dir
	if dir == "" {
		dir = Dir
	}
	if !sandbox.CleanAbs(dir) {
		return "", errdefs.Field("cwd", "must be an absolute, clean path inside the session")
	}
	if req.Timeout < 0 || req.Timeout > maxExecTimeout {
		return "", errdefs.Field("timeout_seconds", "must be between 0 (none) and 86400")
	}
	for _, kv := range req.Env {
		if k, v, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsRune(k+v, 0) {
			return "", errdefs.Field("env", "names must be non-empty without = or NUL, values without NUL")
		}
	}
	var stdin []byte
	if req.Stdin != nil {
		if stdin, err = io.ReadAll(io.LimitReader(req.Stdin, maxStdin+1)); err != nil || len(stdin) > maxStdin {
			return "", errdefs.Field("stdin", fmt.Sprintf("must be at most %d bytes", maxStdin))
		}
	}
	// Only through the exec agent, never from the host (nsenter with a
	// working directory resolved on the host, where a link the session
	// left leads out; a process no one owns if the server dies). After a
	// restart the agent dials in again: wait for it a while. Its agent
	// dials the replica that runs the session, which may be another.
	if m.runElsewhere(id) {
		return "", fmt.Errorf("session %s runs on another replica of this cluster, which holds its exec agent: its commands go there (the HTTP API and the MCP tools forward them): %w", id, errdefs.ErrUnavailable)
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
		return "", fmt.Errorf("session %s: its exec agent is not connected (the sandbox may be restarting or gone); try again: %w", id, errdefs.ErrUnavailable)
	}
	execID := "exec-" + ids.New()
	m.pruneExecLogs(id)
	log, err := execlog.Create(m.execDir(id, execID), execLogLimit)
	if err != nil {
		return "", fmt.Errorf("keep the command's output: %w", err)
	}
	re := &runningExec{session: id, id: execID, log: log, start: time.Now(), timeout: req.Timeout,
		recorded: make(chan struct{}), ended: make(chan struct{})}
	m.mu.Lock()
	m.execs[execKey{id, execID}] = re
	m.sessions[id].running++
	m.mu.Unlock()
	// exec_started is committed before the agent is sent the command: a
	// server killed in between leaves a start recorded whose command never
	// ran (ended lost by the next server, which the agent does not name
	// it to), never a command that ran unrecorded (TestKill9Soak found
	// one when the commit ran beside the start to save its fsync). A
	// command whose start cannot be recorded (a full disk) does not run.
	re.startErr = m.append(context.WithoutCancel(ctx), id, EventExecStart, execStarted{ExecID: execID,
		Command: clip.String(strings.Join(argv, " "), 4096), TimeoutSeconds: int(req.Timeout / time.Second)})
	close(re.recorded)
	if err := re.startErr; err != nil {
		m.finish(re, -1, "", err, false)
		return "", fmt.Errorf("the command's start could not be recorded, so it was not run: %w", err)
	}
	if req.Timeout > 0 {
		m.setTimer(re, req.Timeout)
	}
	if err := a.Start(execID, argv, dir, req.Env, stdin); err != nil {
		m.finish(re, -1, "", err, false)
		return "", err
	}
	return execID, nil
}

// execStarted is exec_started's payload.
type execStarted struct {
	ExecID         string `json:"exec_id"`
	Command        string `json:"command"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty"`
}

// setTimer kills re's command once it has run for d.
func (m *Manager) setTimer(re *runningExec, d time.Duration) {
	re.timer = time.AfterFunc(d, func() {
		m.mu.Lock()
		re.timedOut = true
		m.mu.Unlock()
		m.killExec(re)
	})
}

// killExec ends re's command, through the session's agent if it is
// connected (one that is not ends it when it dials in, or the command
// ends with the session).
func (m *Manager) killExec(re *runningExec) {
	m.mu.Lock()
	re.killed = true
	m.mu.Unlock()
	if a := m.agent(re.session); a != nil {
		a.Kill(re.id)
	}
}

// KillExec implements service.Sessions.
func (m *Manager) KillExec(ctx context.Context, id, execID string) error {
	re := m.runningExec(id, execID)
	if re == nil {
		if _, err := m.get(id); err != nil {
			return err
		}
		return fmt.Errorf("session %s runs no command %s here: %w", id, clip.String(execID, 64), errdefs.ErrNotFound)
	}
	m.killExec(re)
	return nil
}

// runningExec is session id's running command execID, or nil.
func (m *Manager) runningExec(id, execID string) *runningExec {
	m.mu.Lock()
	defer m.mu.Unlock()
	if re := m.execs[execKey{id, execID}]; re != nil {
		return re
	}
	return nil
}

// finish records re's end: code and msg from the agent (a message with
// a code of 126 or more says the command did not start), or err when
// there is no agent's word (lost: no server will have it). It runs once
// per exec.
func (m *Manager) finish(re *runningExec, code int, msg string, err error, lost bool) {
	m.mu.Lock()
	if re.finished {
		m.mu.Unlock()
		return
	}
	re.finished = true
	timedOut := re.timedOut
	m.mu.Unlock()
	if re.timer != nil {
		re.timer.Stop()
	}
	// Found among the running until its end is in its log: a reader in
	// between reads the log, which it finds on disk only once ended.
	defer func() {
		m.mu.Lock()
		delete(m.execs, execKey{re.session, re.id})
		if s := m.sessions[re.session]; s != nil {
			s.running--
		}
		m.mu.Unlock()
		close(re.ended)
	}()
	<-re.recorded
	if re.startErr != nil {
		re.log.Close()
		os.RemoveAll(re.log.Dir())
		return
	}
	end := ExecEnd{ExecID: re.id, ExitCode: code, DurationMS: time.Since(re.start).Milliseconds()}
	if re.log != nil {
		end.StdoutBytes, end.StderrBytes, end.GapBytes = re.log.Bytes(execlog.Stdout), re.log.Bytes(execlog.Stderr), re.log.Bytes(execlog.Gap)
	}
	switch {
	case err != nil:
		end.ExitCode, end.Error = -1, errdefs.Message(err)
		if lost {
			end.Reason = "lost"
		}
	case timedOut:
		end.ExitCode, end.Error = 124, fmt.Sprintf("timed out after %s", re.timeout)
	case msg != "" && code >= 126:
		end.Error = msg
	}
	// Recorded first: a reader that sees the end finds it in the log.
	if aerr := m.append(context.Background(), re.session, EventExecEnd, end); aerr != nil {
		m.log.Error("cannot record an exec's end", "session_id", re.session, "err", aerr)
	}
	if re.log != nil {
		if lerr := re.log.End(end); lerr != nil {
			m.log.Warn("cannot keep an exec's end with its output", "session_id", re.session, "exec_id", re.id, "err", lerr)
		}
	}
}

// ReadExec implements service.Sessions.
func (m *Manager) ReadExec(ctx context.Context, id, execID string, from int64, follow bool, fn func(service.ExecOutput) error) (*ExecEnd, error) {
	if _, err := m.get(id); err != nil {
		return nil, err
	}
	if from < 0 {
		return nil, errdefs.Field("offset", "must be 0 or more")
	}
	var log *execlog.Log
	if re := m.runningExec(id, execID); re != nil {
		select {
		case <-re.recorded:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if re.startErr != nil {
			return nil, fmt.Errorf("the command's start could not be recorded, and it was stopped: %w", re.startErr)
		}
		log = re.log
	} else {
		if !validExecID(execID) {
			return nil, errdefs.Field("exec_id", "is not an exec id")
		}
		dir := m.execDir(id, execID)
		if _, err := os.Stat(filepath.Join(dir, "end.json")); err != nil {
			if m.runElsewhere(id) {
				return nil, fmt.Errorf("session %s runs on another replica, which holds its running commands: %w", id, errdefs.ErrUnavailable)
			}
			return nil, fmt.Errorf("session %s has no command %s (or its output is no longer kept): %w", id, execID, errdefs.ErrNotFound)
		}
		var err error
		if log, err = execlog.Open(dir, execLogLimit); err != nil {
			return nil, fmt.Errorf("read the command's output: %w", err)
		}
	}
	raw, err := log.Read(ctx, from, follow, func(c execlog.Chunk) error {
		o := service.ExecOutput{Offset: c.Offset, Data: c.Data, Bytes: c.Len}
		switch c.Stream {
		case execlog.Stdout:
			o.Stream = "stdout"
		case execlog.Stderr:
			o.Stream = "stderr"
		default:
			o.Stream = "gap"
		}
		return fn(o)
	})
	if err != nil || raw == nil {
		return nil, err
	}
	var end ExecEnd
	if err := json.Unmarshal(raw, &end); err != nil {
		return nil, fmt.Errorf("read the command's end: %w", err)
	}
	return &end, nil
}

// validExecID reports whether s is an exec id StartExec makes, which alone
// names a directory.
func validExecID(s string) bool {
	rest, ok := strings.CutPrefix(s, "exec-")
	return ok && rest != "" && len(rest) <= 64 && strings.Trim(rest, "0123456789abcdefghijklmnopqrstuvwxyz") == ""
}

// Exec implements service.Sessions: StartExec, then the output as it comes
// until the end; a command still running when ctx ends is killed.
func (m *Manager) Exec(ctx context.Context, id string, req ExecRequest, stdout, stderr io.Writer) (ExecEnd, error) {
	execID, err := m.StartExec(ctx, id, req)
	if err != nil {
		return ExecEnd{}, err
	}
	end, err := m.ReadExec(ctx, id, execID, 0, true, func(o service.ExecOutput) error {
		switch {
		case o.Stream == "stdout" && stdout != nil:
			stdout.Write(o.Data)
		case o.Stream == "stderr" && stderr != nil:
			stderr.Write(o.Data)
		}
		return nil
	})
	if err == nil && end != nil {
		return *end, nil
	}
	if re := m.runningExec(id, execID); re != nil {
		m.killExec(re)
		select {
		case <-re.ended:
		case <-time.After(5 * time.Second):
		}
	}
	if err == nil {
		err = fmt.Errorf("the command's output ended before it did: %w", errdefs.ErrUnavailable)
	}
	return ExecEnd{ExecID: execID, ExitCode: -1}, err
}

// pruneExecLogs removes the logs of session id's ended execs, oldest
// first, until they leave room for one more within execLogBudget.
func (m *Manager) pruneExecLogs(id string) {
	dir := m.opts.Data.HostPath(workspace.DirRun, "sessions", id, "execs")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type kept struct {
		path string
		size int64
		at   time.Time
	}
	var ended []kept
	var total int64
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		fi, err := os.Stat(filepath.Join(p, "out"))
		if err != nil {
			continue
		}
		total += fi.Size()
		if end, err := os.Stat(filepath.Join(p, "end.json")); err == nil {
			ended = append(ended, kept{p, fi.Size(), end.ModTime()})
		}
	}
	sort.Slice(ended, func(i, j int) bool { return ended[i].at.Before(ended[j].at) })
	for _, k := range ended {
		if total+execLogLimit <= execLogBudget {
			return
		}
		if os.RemoveAll(k.path) == nil {
			total -= k.size
		}
	}
}

// restoreExecs takes over the execs of the sessions ids names (every
// session run here when none) that are open in the log: their commands may
// run on in the sandboxes, whose agents name them when they dial in
// (agentHandler.Hello). One whose output log is gone, or that no agent
// names within agentWait, is recorded lost.
func (m *Manager) restoreExecs(ctx context.Context, ids ...string) {
	type open struct {
		session, exec, status string
		memoryKept            bool
		info                  openExec
	}
	var found []open
	m.mu.Lock()
	for id, s := range m.sessions {
		// Not only running sessions: one that ended (or was suspended)
		// with a command open has it ended lost below.
		if len(ids) > 0 && !slices.Contains(ids, id) {
			continue
		}
		for ex, info := range s.openExecs {
			if m.execs[execKey{id, ex}] == nil {
				found = append(found, open{id, ex, s.Status, s.MemoryKept, info})
			}
		}
	}
	m.mu.Unlock()
	var restored []*runningExec
	for _, o := range found {
		if len(ids) == 0 && m.runElsewhere(o.session) {
			continue // its replica runs its execs
		}
		if o.status == StatusSuspended && o.memoryKept && len(ids) == 0 {
			continue // they go on when it is resumed, and are taken over then
		}
		recorded := make(chan struct{})
		close(recorded)
		re := &runningExec{session: o.session, id: o.exec, start: o.info.At, timeout: o.info.Timeout, recorded: recorded,
			ended: make(chan struct{}), restored: true}
		log, err := execlog.Open(m.execDir(o.session, o.exec), execLogLimit)
		if err == nil && log.Ended() != nil {
			// Its end reached the log and not the store: record it now.
			var end ExecEnd
			if json.Unmarshal(log.Ended(), &end) == nil {
				m.append(ctx, o.session, EventExecEnd, end)
				continue
			}
		}
		if err == nil {
			re.log = log
		}
		m.mu.Lock()
		m.execs[execKey{re.session, re.id}] = re
		m.sessions[re.session].running++
		m.mu.Unlock()
		if err != nil {
			m.finish(re, -1, "", fmt.Errorf("lost: the server stopped while it ran, and its output log cannot be read (%v)", err), true)
			continue
		}
		if o.status != StatusRunning && (o.status != StatusSuspended || !o.memoryKept) {
			m.finish(re, -1, "", errors.New("lost: the session was no longer running when a server took its commands over"), true)
			continue
		}
		if re.timeout > 0 {
			m.setTimer(re, max(time.Until(re.start.Add(re.timeout)), time.Millisecond))
		}
		restored = append(restored, re)
	}
	if len(restored) == 0 {
		return
	}
	time.AfterFunc(agentWait, func() {
		for _, re := range restored {
			m.mu.Lock()
			resumed := re.resumed
			m.mu.Unlock()
			if !resumed {
				m.finish(re, -1, "", errors.New("lost: the session's exec agent did not come back with the command after the server that ran it stopped"), true)
			}
		}
	})
}

// endExecs records the end of every command of session id: the session
// ended, and its commands with it.
func (m *Manager) endExecs(id, reason string) {
	m.endExecsWith(id, fmt.Sprintf("lost: the session ended (%s) while the command ran", reason))
}

// endExecsWith records the end of every command of session id, lost, for
// why.
func (m *Manager) endExecsWith(id, why string) {
	m.mu.Lock()
	var res []*runningExec
	for _, re := range m.execs {
		if re.session == id {
			res = append(res, re)
		}
	}
	m.mu.Unlock()
	for _, re := range res {
		m.finish(re, -1, "", errors.New(why), true)
	}
}

// agentHandler takes what a session's exec agent sends.
type agentHandler struct {
	m       *Manager
	session string
}

// Hello ends, lost, the commands taken over from an earlier server that
// the agent does not name: they ended with a sandbox that restarted.
func (h *agentHandler) Hello(execs []execagent.ExecState) {
	named := map[string]bool{}
	for _, e := range execs {
		named[e.ID] = true
	}
	h.m.mu.Lock()
	var gone []*runningExec
	for _, re := range h.m.execs {
		if re.session == h.session && re.restored && !re.resumed && !named[re.id] {
			gone = append(gone, re)
		}
	}
	h.m.mu.Unlock()
	for _, re := range gone {
		h.m.finish(re, -1, "", errors.New("lost: the session's exec agent no longer has the command (its sandbox restarted)"), true)
	}
}

func (h *agentHandler) Resume(id string) (int64, bool) {
	re := h.m.runningExec(h.session, id)
	if re == nil {
		return 0, false
	}
	h.m.mu.Lock()
	re.resumed = true
	killed := re.killed
	h.m.mu.Unlock()
	if killed {
		if a := h.m.agent(h.session); a != nil {
			a.Kill(id)
		}
	}
	return re.log.Size(), true
}

func (h *agentHandler) Output(id string, fd int, off int64, data []byte) int64 {
	re := h.m.runningExec(h.session, id)
	if re == nil {
		return 0
	}
	h.m.mu.Lock()
	if s := h.m.sessions[h.session]; s != nil {
		s.lastOutput = h.m.opts.Now()
	}
	h.m.mu.Unlock()
	if err := re.log.Append(fd, off, data); err != nil && !errors.Is(err, execlog.ErrEnded) {
		h.m.log.Warn("cannot keep a command's output", "session_id", h.session, "exec_id", id, "err", err)
		return 0
	}
	return re.log.Size()
}

func (h *agentHandler) Exit(id string, code int, msg string, off int64) {
	re := h.m.runningExec(h.session, id)
	if re == nil {
		return
	}
	// Not on the connection's goroutine: the end's record waits for a
	// commit, and the agent's next frames should not.
	go h.m.finish(re, code, msg, nil, false)
}
