package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workspace"
)

// A suspended session holds no sandbox: its directory, image, network
// policy, token and workspace are kept, and resuming makes its sandbox
// again. On a runtime that checkpoints (sandbox.Checkpointer: gvisor,
// and docker under runsc on an engine with experimental features) its
// memory and processes are kept too: its exec agent parks (closes its
// connection, which could not be saved), the sandbox is checkpointed into
// run/sessions/<id>/checkpoint (the server's alone: it holds the
// session's memory, its secrets with it) and restored from there, its
// commands going on where they were. Elsewhere its processes end with the
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
	// Seconds is how long the suspend took, the checkpoint's write of
	// the session's memory included.
	Seconds float64 `json:"seconds"`
}

// resumed is session_resumed's payload.
type resumed struct {
	AgentTokenHash string         `json:"agent_token_hash"`
	Handle         sandbox.Handle `json:"handle"`
	Replica        string         `json:"replica"`
	MemoryKept     bool           `json:"memory_kept"`
	Seconds        float64        `json:"seconds"`
}

// What a suspend says of what it keeps.
const (
	filesOnly  = "files kept; the session's processes ended (its runtime does not keep a session's memory): a resume starts a fresh sandbox on the same directory"
	memoryKept = "files, memory and processes kept: a resume brings the session back as it was, its running commands going on"
)

// checkpointName is the directory in run/sessions/<id> a session's
// checkpoint is kept in while it is suspended.
const checkpointName = "checkpoint"

// parkWait bounds how long a suspend waits for the exec agent to close
// its connection.
const parkWait = 5 * time.Second

func (m *Manager) checkpointDir(id string) string {
	return m.opts.Data.HostPath(workspace.DirRun, "sessions", id, checkpointName)
}

// discardedSuffix marks, after checkpointName, a restored checkpoint moved
// aside for the reaper to remove (discardCheckpoint).
const discardedSuffix = ".discarded-"

// discardCheckpoint moves session id's checkpoint, restored, aside and
// leaves its removal to the reaper (removeDiscarded): unlinking an image
// whose restore has read it whole frees its blocks, about 100 ms for
// 512 MiB here, which a resume's answer need not wait for. One a server
// killed meanwhile left is removed by the next one's Start.
func (m *Manager) discardCheckpoint(id string) {
	dir := m.checkpointDir(id)
	aside := dir + discardedSuffix + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := os.Rename(dir, aside); err != nil {
		if !os.IsNotExist(err) {
			os.RemoveAll(dir)
		}
		return
	}
	m.mu.Lock()
	m.discarded = append(m.discarded, aside)
	m.mu.Unlock()
}

// removeDiscarded removes the checkpoints discardCheckpoint moved aside,
// and with all, those a server before this one left, and the snapshots
// for forks it left (takeSnapshot) of sessions no other replica alive
// runs.
func (m *Manager) removeDiscarded(all bool) {
	m.mu.Lock()
	dirs := m.discarded
	m.discarded = nil
	m.mu.Unlock()
	if all {
		left, _ := filepath.Glob(m.checkpointDir("*") + discardedSuffix + "*")
		dirs = append(dirs, left...)
		snaps, _ := filepath.Glob(m.opts.Data.HostPath(workspace.DirRun, "sessions", "*", forkPrefix+"*"))
		for _, d := range snaps {
			// Another replica alive may be forking the session.
			if !m.runElsewhere(filepath.Base(filepath.Dir(d))) {
				dirs = append(dirs, d)
			}
		}
	}
	for _, d := range dirs {
		if err := os.RemoveAll(d); err != nil {
			m.log.Warn("cannot remove a restored session's checkpoint", "path", d, "err", err)
		}
	}
}

// Suspend suspends running session id: with its memory where its runtime
// checkpoints (failing, the session running on, when the checkpoint
// fails), its files only elsewhere.
func (m *Manager) Suspend(ctx context.Context, id string) (service.SessionSuspend, error) {
	ctx, end := m.begin(ctx, id)
	defer end()
	return m.suspend(ctx, id, false)
}

// suspend is Suspend, its caller holding the session's lifecycle lock
// and ctx detached (begin); filesIfNeeded suspends with the files only
// when the memory cannot be kept (an idle session's suspend).
func (m *Manager) suspend(ctx context.Context, id string, filesIfNeeded bool) (service.SessionSuspend, error) {
	s, err := m.get(id)
	if err != nil {
		return service.SessionSuspend{}, err
	}
	switch {
	case s.Status == StatusSuspended:
		return service.SessionSuspend{Session: s, MemoryKept: s.MemoryKept, Note: noteOf(s.MemoryKept)}, nil
	case s.Status != StatusRunning:
		return service.SessionSuspend{}, fmt.Errorf("session %s ended (%s): %w", id, s.EndReason, errdefs.ErrFailedPrecondition)
	case m.runElsewhere(id):
		return service.SessionSuspend{}, fmt.Errorf("session %s runs on another replica: %w", id, errdefs.ErrUnavailable)
	}
	p := m.opts.Placements.Usable(s.Runtime)
	start := time.Now()
	ev := suspended{Note: filesOnly}
	if cp, ok := checkpointer(p); ok {
		err := m.checkpoint(ctx, id, cp)
		switch {
		case err == nil:
			ev = suspended{MemoryKept: true, Note: memoryKept}
		case !filesIfNeeded && !errors.Is(err, sandbox.ErrNoCheckpoint) && m.sandboxRuns(ctx, p.Sandbox, id):
			return service.SessionSuspend{}, fmt.Errorf("the session's memory cannot be kept (%s); it runs on as it was: end what holds the connection and retry: %w", errdefs.Message(err), errdefs.ErrConflict)
		default:
			// runsc ends a sandbox whose checkpoint failed (a process
			// held a connection to a host socket), and one its runtime
			// cannot checkpoint at all ends here: its files are what is
			// left.
			ev.Note = fmt.Sprintf("files kept; its memory could not be (%s), and its processes ended", errdefs.Message(err))
		}
	}
	if !ev.MemoryKept {
		m.mu.Lock()
		ev.ExecsEnded = m.sessions[id].running
		m.mu.Unlock()
		m.endExecsWith(id, "lost: the session was suspended, and its processes ended with it")
		if p != nil {
			if err := p.Sandbox.Destroy(ctx, id); err != nil {
				return service.SessionSuspend{}, fmt.Errorf("stop the session's sandbox: %w", err)
			}
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
	ev.Seconds = time.Since(start).Seconds()
	recording := time.Now()
	if err := m.append(ctx, id, EventSuspended, ev); err != nil {
		return service.SessionSuspend{}, err
	}
	m.log.Info("session suspended", "session_id", id, "memory_kept", ev.MemoryKept, "seconds", ev.Seconds, "recorded_in", time.Since(recording))
	s, err = m.get(id)
	return service.SessionSuspend{Session: s, MemoryKept: ev.MemoryKept, Note: ev.Note}, err
}

// sandboxRuns reports whether session id's sandbox on rt still runs.
func (m *Manager) sandboxRuns(ctx context.Context, rt sandbox.Runtime, id string) bool {
	st, err := rt.Status(ctx, id)
	return err == nil && st.State == sandbox.StateRunning
}

// noteOf is what a suspend that kept memory, or not, says.
func noteOf(memory bool) string {
	if memory {
		return memoryKept
	}
	return filesOnly
}

// checkpointer is p's sandbox runtime, if it keeps a sandbox's memory on
// this host.
func checkpointer(p *placement.Runtime) (sandbox.Checkpointer, bool) {
	if p == nil {
		return nil, false
	}
	cp, ok := p.Sandbox.(sandbox.Checkpointer)
	if !ok {
		return nil, false
	}
	// Capabilities are probed once, at the start: this asks no backend.
	caps, err := p.Sandbox.Capabilities(context.Background())
	return cp, err == nil && caps.Checkpoint
}

// checkpoint parks session id's exec agent and checkpoints its sandbox
// into its checkpoint directory; failing, the sandbox runs on and the
// agent dials in again.
func (m *Manager) checkpoint(ctx context.Context, id string, cp sandbox.Checkpointer) error {
	dir := m.checkpointDir(id)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("clear the checkpoint directory: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create the checkpoint directory: %w", err)
	}
	if a := m.agent(id); a != nil {
		pctx, cancel := context.WithTimeout(ctx, parkWait)
		err := a.Park(pctx)
		cancel()
		if err != nil {
			return err
		}
	}
	if err := cp.Checkpoint(ctx, id, dir); err != nil {
		os.RemoveAll(dir)
		return err
	}
	// Whole on disk, the sandbox gone: a server that dies before
	// session_suspended is recorded leaves the next one to record it
	// (Start).
	if err := os.WriteFile(filepath.Join(dir, checkpointDone), nil, 0o600); err != nil {
		return fmt.Errorf("mark the checkpoint whole: %w", err)
	}
	if m.opts.Crash != nil {
		m.opts.Crash(sandbox.CrashCheckpointed)
	}
	return nil
}

// checkpointDone marks a checkpoint whole in its directory.
const checkpointDone = "done"

// recoverCheckpoints records suspended, its memory kept, each running
// session run here whose server died between its checkpoint and the
// record of its suspend: its sandbox is gone and its checkpoint whole. A
// mark left by a server that died after a resume's record, the session's
// sandbox running again, is removed.
func (m *Manager) recoverCheckpoints(ctx context.Context) {
	for _, s := range m.list() {
		dir := m.checkpointDir(s.ID)
		if s.Status != StatusRunning || m.runElsewhere(s.ID) {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, checkpointDone)); err != nil {
			continue
		}
		if p := m.opts.Placements.Usable(s.Runtime); p != nil {
			h := m.handleOf(s.ID)
			if p.Sandbox.Recover(ctx, &h) == nil {
				os.RemoveAll(dir)
				continue
			}
		}
		note := memoryKept + " (recorded by the next server: the one that checkpointed it stopped first)"
		if err := m.append(ctx, s.ID, EventSuspended, suspended{MemoryKept: true, Note: note}); err != nil {
			m.log.Warn("cannot record a checkpointed session suspended", "session_id", s.ID, "err", err)
			continue
		}
		m.log.Info("session suspended by the server before this one", "session_id", s.ID, "memory_kept", true)
	}
}

// Resume starts suspended session id's sandbox again, as it was made: its
// directory, image, limits and network policy; restored from its
// checkpoint if its memory was kept, else fresh with a new token for its
// exec agent. It answers once the agent has dialled in.
func (m *Manager) Resume(ctx context.Context, id string) (Session, error) {
	ctx, end := m.begin(ctx, id)
	defer end()
	return m.resume(ctx, id)
}

// resume is Resume, its caller holding the session's lifecycle lock and
// ctx detached (begin).
func (m *Manager) resume(ctx context.Context, id string) (Session, error) {
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
	o := sandboxOf{id: id, image: s.Image, network: s.Network, allow: s.NetworkAllow, dir: st.dir, hostDir: st.hostDir, limits: m.opts.Limits, self: st.selfNamed}
	if st.limits != nil {
		o.limits = *st.limits
	}
	attached, agentHash := m.attached, st.agentTokenHash
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
	start := time.Now()
	ev := resumed{Replica: m.opts.Members.Self(), MemoryKept: s.MemoryKept}
	var h *sandbox.Handle
	if s.MemoryKept {
		if _, ok := checkpointer(p); !ok {
			return Session{}, fmt.Errorf("session %s's memory was kept by a runtime that no longer checkpoints: %w", id, errdefs.ErrFailedPrecondition)
		}
		// Its agent has its token in the memory restored.
		o.restore, ev.AgentTokenHash = m.checkpointDir(id), agentHash
		h, _, err = m.startSandbox(ctx, p, o)
	} else {
		var token string
		h, token, err = m.startSandbox(ctx, p, o)
		ev.AgentTokenHash = hashToken(token)
	}
	if err != nil {
		return Session{}, err
	}
	// Its agent, dialling in from now on, waits for the record
	// (AttachAgent).
	release := m.hold(id)
	defer release()
	if s.MemoryKept {
		// Its commands went on with it (those of a server before this
		// one's restart are taken over here), before its agent can dial
		// in and name them.
		m.restoreExecs(ctx, id)
	}
	ev.Handle = *h
	ev.Seconds = time.Since(start).Seconds()
	recording := time.Now()
	err = m.append(ctx, id, EventResumed, ev)
	release()
	if err != nil {
		p.Sandbox.Destroy(context.WithoutCancel(ctx), id)
		return Session{}, err
	}
	if s.MemoryKept {
		m.discardCheckpoint(id)
	}
	waiting := time.Now()
	if !m.waitAgent(ctx, id, attached, agentWait) {
		m.end(context.WithoutCancel(ctx), id, "agent_not_connected")
		return Session{}, fmt.Errorf("the session's exec agent did not connect within %s after the resume; the session is ended: %w", agentWait, errdefs.ErrUnavailable)
	}
	m.log.Info("session resumed", "session_id", id, "memory_kept", s.MemoryKept, "seconds", ev.Seconds, "recorded_in", waiting.Sub(recording), "agent_in", time.Since(waiting))
	return m.get(id)
}
