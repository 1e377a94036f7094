package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workspace"
)

// Start folds the recorded sessions, reattaches to the sandboxes of those
// still running that no live replica runs (ending the others as lost) and
// destroys sandboxes no session owns. Run Follow and Reap beside it: the
// sessions other replicas make and change, and the ends of sessions past
// their limits.
func (m *Manager) Start(ctx context.Context) error {
	if err := m.sync(ctx); err != nil {
		return err
	}
	m.recoverCheckpoints(ctx)
	m.removeDiscarded(true)
	// First the commands open in the log: those of a session found gone
	// below end lost with it; the others wait for their agents to name
	// them when they dial in again.
	m.restoreExecs(ctx)
	for _, s := range m.list() {
		if s.Status != StatusRunning || m.runElsewhere(s.ID) {
			continue
		}
		var rt sandbox.Runtime
		if p := m.opts.Placements.Usable(s.Runtime); p != nil {
			rt = p.Sandbox
		}
		h := m.handleOf(s.ID)
		if rt == nil || rt.Recover(ctx, &h) != nil {
			m.end(ctx, s.ID, "lost")
			continue
		}
		if s.Workspace != "" {
			m.opts.Writers.Acquire(s.Workspace, s.ID)
		}
		if s.Network != "" && s.Network != task.NetworkNone && m.opts.Egress != nil {
			// The proxy listens again where the sandbox has it mounted.
			if _, err := m.opts.Egress.Open(s.ID, s.Network, s.NetworkAllow); err != nil {
				m.log.Warn("cannot reopen a session's egress proxy", "session_id", s.ID, "err", err)
			}
		}
		if st, err := rt.Status(ctx, s.ID); err != nil || st.State == sandbox.StateExited {
			m.end(ctx, s.ID, "lost")
		}
	}
	for name, rt := range m.opts.Placements.Sandboxes() {
		if m.opts.Placements.Usable(name) == nil {
			continue
		}
		hs, err := rt.List(ctx, map[string]string{sandbox.LabelManaged: "true", labelSession: "true"})
		if err != nil {
			m.log.Warn("cannot list session sandboxes", "runtime", name, "err", err)
			continue
		}
		// Another replica may have made a session since the fold.
		if err := m.sync(ctx); err != nil {
			return err
		}
		for _, h := range hs {
			s, err := m.get(h.ID)
			switch {
			case err == nil && s.Status == StatusRunning:
			case err == nil && s.Status == StatusSuspended && s.MemoryKept && checkpointed(ctx, rt, h.ID):
				// A checkpoint a runtime keeps as a sandbox it lists
				// (docker keeps it with the container): the resume
				// restores it. One that runs is a resume the server
				// before this one did not live to record, and goes.
			default:
				rt.Destroy(ctx, h.ID)
			}
		}
	}
	// Last: the sandbox of a session never recorded, which may have its
	// directory mounted, is gone.
	m.sweepUnrecorded(ctx)
	return nil
}

// checkpointed reports whether listed sandbox id of rt is a checkpoint
// it keeps: listed, and no sandbox to Status.
func checkpointed(ctx context.Context, rt sandbox.Runtime, id string) bool {
	_, err := rt.Status(ctx, id)
	return errors.Is(err, errdefs.ErrNotFound)
}

// sync folds the log's session events up to its end.
func (m *Manager) sync(ctx context.Context) error {
	for {
		m.mu.Lock()
		after := m.pos
		m.mu.Unlock()
		evs, err := m.opts.Store.ReadAll(ctx, after, 1024)
		if err != nil {
			return fmt.Errorf("read sessions: %w", err)
		}
		if len(evs) == 0 {
			return nil
		}
		m.applyFrom(evs)
	}
}

// applyFrom applies evs, read from the log after m.pos, and moves m.pos.
func (m *Manager) applyFrom(evs []eventstore.Event) {
	for _, e := range evs {
		m.apply(e)
	}
	m.mu.Lock()
	m.pos = max(m.pos, evs[len(evs)-1].Position)
	m.mu.Unlock()
}

// Follow folds the session events other replicas append, as they are
// committed, until ctx ends: every replica answers for every session.
func (m *Manager) Follow(ctx context.Context) error {
	m.mu.Lock()
	sub := eventstore.Subscribe(m.opts.Store, m.pos)
	m.mu.Unlock()
	for {
		e, err := sub.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("follow sessions: %w", err)
		}
		m.applyFrom([]eventstore.Event{e})
		m.followNetwork(ctx)
		m.closeLent()
	}
}

// runElsewhere reports whether session id is run by another replica that
// is alive.
func (m *Manager) runElsewhere(id string) bool {
	replica, ok := m.replicaOf(id)
	if !ok || replica == m.opts.Members.Self() {
		return false
	}
	_, alive := m.opts.Members.Alive(replica)
	return alive
}

// Forward implements service.SessionGate: the API of the live replica
// that runs session id, when it is another.
func (m *Manager) Forward(id string) (string, bool) {
	m.known(context.Background(), id)
	replica, ok := m.replicaOf(id)
	if !ok || replica == m.opts.Members.Self() {
		return "", false
	}
	r, alive := m.opts.Members.Alive(replica)
	return r.URL, alive && r.URL != ""
}

// runHere reports whether this replica keeps session id: it runs it, or
// the replica that does is gone (this one being steady, so its judgement
// holds: cluster.Members.Steady).
func (m *Manager) runHere(id string) bool {
	replica, ok := m.replicaOf(id)
	if !ok {
		return false
	}
	if replica == m.opts.Members.Self() {
		return true
	}
	if !m.opts.Members.Steady() {
		return false
	}
	_, alive := m.opts.Members.Alive(replica)
	return !alive
}

// replicaOf is the replica that runs session id, read under the lock
// (the log's follower changes it); ok is false for a session unknown.
func (m *Manager) replicaOf(id string) (replica string, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.sessions[id]; s != nil {
		return s.replica, true
	}
	return "", false
}

// endOrphans ends, lost, each running session of a replica gone whose exec
// agent reached no live replica within agentWait of this one finding the
// replica gone (since holds when, per session). An agent whose replica is
// gone dials the host's shared socket, or the server's address from
// another machine, and the replica it reaches adopts the session; one that
// reaches none runs where no replica of the cluster can reach it (a host
// runtime on a machine no replica is left on), and nothing could be run in
// it again. This replica adopts it first, under its version, so that an
// agent's late dial and this end never both win.
func (m *Manager) endOrphans(ctx context.Context, since map[string]time.Time) {
	if !m.opts.Members.Steady() {
		return
	}
	now := time.Now()
	orphans := map[string]bool{}
	for _, s := range m.list() {
		m.mu.Lock()
		from := m.sessions[s.ID].replica
		m.mu.Unlock()
		if s.Status != StatusRunning || from == m.opts.Members.Self() {
			continue
		}
		if _, alive := m.opts.Members.Alive(from); alive {
			continue
		}
		orphans[s.ID] = true
		first, ok := since[s.ID]
		if !ok {
			since[s.ID] = now
			continue
		}
		if now.Sub(first) < agentWait {
			continue
		}
		unlock, free := m.tryLockOps(s.ID)
		if !free {
			continue
		}
		if err := m.adopt(ctx, s.ID); err != nil {
			m.log.Info("a session whose replica is gone was not ended here", "session_id", s.ID, "err", err)
		} else {
			m.endWith(ctx, s.ID, "lost", fmt.Errorf("its replica %s stopped, and its exec agent reached no other replica within %s", from, agentWait))
		}
		unlock()
	}
	for id := range since {
		if !orphans[id] {
			delete(since, id)
		}
	}
}

// Reap ends sessions past their idle timeout or lifetime (checked every
// second) or their directory's quota (as often as Quota says), and
// removes ended sessions' own directories once their retention has
// passed, until ctx is done.
func (m *Manager) Reap(ctx context.Context) error {
	t := time.NewTicker(quotaTick)
	defer t.Stop()
	var reaped time.Time
	nextCheck, orphaned, looked := map[string]time.Time{}, map[string]time.Time{}, map[string]time.Time{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		m.checkQuotas(ctx, nextCheck)
		if time.Since(reaped) < time.Second {
			continue
		}
		reaped = time.Now()
		m.removeDiscarded(false)
		m.destroyAgain(ctx)
		m.removeDirs(ctx)
		m.endOrphans(ctx, orphaned)
		now := m.opts.Now()
		for _, s := range m.list() {
			if s.Status != StatusRunning && s.Status != StatusSuspended || !m.runHere(s.ID) {
				continue
			}
			// A session a suspend, resume, fork or delete holds is looked
			// at again at the next tick: an end here would race it (a
			// resume recorded after the end, its checkpoint removed under
			// its restore).
			unlock, free := m.tryLockOps(s.ID)
			if !free {
				continue
			}
			if s.Status == StatusRunning && !reaped.Before(looked[s.ID]) {
				looked[s.ID] = reaped.Add(sandboxLook)
				if cause := m.sandboxEnded(ctx, s.ID); cause != nil {
					m.log.Warn("a running session's sandbox ended", "session_id", s.ID, "err", cause)
					m.endWith(ctx, s.ID, "lost", cause)
					unlock()
					continue
				}
			}
			m.reapOne(ctx, s.ID, now)
			unlock()
		}
		for id, at := range looked {
			if reaped.After(at.Add(sandboxLook)) {
				delete(looked, id) // an ended session's
			}
		}
	}
}

// sandboxLook is how often Reap asks the runtime whether a running
// session's sandbox still runs (a Docker session's is an inspect).
const sandboxLook = 5 * time.Second

// sandboxEnded says why session id's sandbox is no more, if the session
// runs and its sandbox does not: its main process (the exec agent, which
// every command is a child of) exited, or its runtime no longer has it;
// nil if it runs or the runtime cannot say. The caller holds the
// session's operations (tryLockOps), so no suspend or resume is under way
// and the status read here is the session's. It adopts the session of a
// replica gone first, as endOrphans does. Only a sandbox this replica can
// see is looked at: its own sessions', or, alone on its store, every
// session's (in a cluster, a host runtime's sandbox of a replica gone is
// on another machine: endOrphans waits for its agent to dial in instead).
func (m *Manager) sandboxEnded(ctx context.Context, id string) error {
	s, err := m.get(id)
	if err != nil || s.Status != StatusRunning {
		return nil
	}
	replica, _ := m.replicaOf(id)
	self := m.opts.Members.Self()
	if _, solo := m.opts.Members.(*cluster.Solo); replica != self && !solo {
		return nil
	}
	p := m.opts.Placements.Usable(s.Runtime)
	if p == nil {
		return nil
	}
	st, err := p.Sandbox.Status(ctx, id)
	var cause error
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		cause = errors.New("its sandbox is gone: its runtime no longer has it")
	case err != nil || st.State != sandbox.StateExited:
		return nil
	case st.Exit != nil && st.Exit.Message != "":
		cause = fmt.Errorf("its sandbox ended (%s): its exec agent and every command in it with it", st.Exit.Message)
	default:
		cause = errors.New("its sandbox ended: its exec agent and every command in it with it")
	}
	if replica != self {
		if err := m.adopt(ctx, id); err != nil {
			return nil // another took it meanwhile
		}
	}
	return cause
}

// reapOne ends (or suspends, where idle sessions suspend) session id if
// it is past its lifetime or idle, as it is now: call it under the
// session's lifecycle lock.
func (m *Manager) reapOne(ctx context.Context, id string, now time.Time) {
	m.mu.Lock()
	st := m.sessions[id]
	if st == nil {
		m.mu.Unlock()
		return
	}
	s := st.Session
	busy := st.running > 0
	// Output keeps a session awake too: a background job that prints
	// (through a command that runs on) is use.
	used := s.LastUsedAt
	if st.lastOutput.After(used) {
		used = st.lastOutput
	}
	m.mu.Unlock()
	idle := !busy && now.Sub(used) > time.Duration(s.IdleTimeout)*time.Second
	switch {
	case s.Status != StatusRunning && s.Status != StatusSuspended:
	case now.Sub(s.CreatedAt) > time.Duration(s.MaxLifetime)*time.Second:
		m.end(ctx, id, "max_lifetime")
	case s.Status != StatusRunning || !idle:
	case m.idleSuspends(s.Runtime):
		sctx, cancel := detach(ctx)
		defer cancel()
		if _, err := m.suspend(sctx, id, true); err != nil {
			m.log.Warn("cannot suspend an idle session; it is ended", "session_id", id, "err", err)
			m.end(ctx, id, "idle_timeout")
		}
	default:
		m.end(ctx, id, "idle_timeout")
	}
}

// checkQuotas checks the directories of running sessions due a check
// (next holds when), ending a session whose directory is over its quota
// or grew while the disk is below its floor.
func (m *Manager) checkQuotas(ctx context.Context, next map[string]time.Time) {
	if m.opts.Quota == nil {
		return
	}
	now := time.Now()
	running := map[string]bool{}
	m.mu.Lock()
	self := m.opts.Members.Self()
	for id, s := range m.sessions {
		if s.Status == StatusRunning && s.Workspace == "" && s.replica == self {
			running[id] = true
		}
	}
	m.mu.Unlock()
	for id := range running {
		if now.Before(next[id]) {
			continue
		}
		gap, err := m.opts.Quota.Check(ctx, id, ownDir(id))
		if err != nil {
			// Under the session's lock, as the reaper's ends: one a
			// suspend or resume holds is checked again a second later.
			if unlock, free := m.tryLockOps(id); free {
				m.log.Warn("session over its disk quota", "session_id", id, "err", err)
				m.endWith(ctx, id, "disk_quota", err)
				unlock()
			} else {
				next[id] = now.Add(time.Second)
			}
			continue
		}
		next[id] = now.Add(gap)
	}
	for id := range next {
		if !running[id] {
			delete(next, id)
		}
	}
}

// removeDirs removes the own directories of ended sessions whose
// retention has passed (a deleted session's at once), and records each.
func (m *Manager) removeDirs(ctx context.Context) {
	now := m.opts.Now()
	for _, s := range m.list() {
		m.mu.Lock()
		gone, logsGone := m.sessions[s.ID].dirRemoved, m.sessions[s.ID].execLogsRemoved
		m.mu.Unlock()
		if s.Status != StatusEnded || s.EndedAt == nil || m.runElsewhere(s.ID) {
			continue
		}
		if s.EndReason != "deleted" && (m.opts.Retention <= 0 || now.Sub(*s.EndedAt) < m.opts.Retention) {
			continue
		}
		if !logsGone {
			// Its commands' output, kept on the server's side.
			if err := os.RemoveAll(m.opts.Data.HostPath(workspace.DirRun, "sessions", s.ID)); err != nil {
				m.log.Warn("cannot remove an ended session's command output", "session_id", s.ID, "err", err)
			} else {
				m.mu.Lock()
				m.sessions[s.ID].execLogsRemoved = true
				m.mu.Unlock()
			}
		}
		if s.Workspace != "" || gone {
			continue
		}
		if err := m.opts.Data.Root().RemoveAll(ownDir(s.ID)); err != nil {
			m.log.Warn("cannot remove an ended session's directory", "session_id", s.ID, "err", err)
			continue
		}
		if err := m.append(ctx, s.ID, EventDirRemoved, map[string]string{"directory": ownDir(s.ID)}); err != nil {
			m.log.Warn("cannot record an ended session's directory removed", "session_id", s.ID, "err", err)
		}
	}
}

// Delete ends a session and destroys its sandbox. Deleting an ended
// session is a no-op.
func (m *Manager) Delete(ctx context.Context, id string) error {
	ctx, end := m.begin(ctx, id)
	defer end()
	s, err := m.get(id)
	if err != nil {
		return err
	}
	if s.Status == StatusRunning || s.Status == StatusSuspended {
		m.end(ctx, id, "deleted")
	}
	return nil
}

// StopAll ends every running session this replica keeps (runHere), for
// a server that stops its sandboxes when it shuts down (config shutdown:
// stop): each one's sandbox is destroyed and its end recorded with reason
// "shutdown", all at once, within ctx. A suspended session has no sandbox
// and stays suspended. Call it once Follow and Reap have returned.
//
// Each end waits for an operation under way on its session (a suspend, a
// resume or a fork a client asked for, which runs on without it) and then
// looks again: a session a suspend has just suspended stays so, its
// checkpoint whole. One whose operation outlasts ctx is left to it, and
// to the next server's start.
func (m *Manager) StopAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, s := range m.list() {
		if s.Status == StatusRunning && m.runHere(s.ID) {
			wg.Go(func() {
				unlock, ok := m.lockOpsWithin(ctx, s.ID)
				if !ok {
					m.log.Warn("a session's operation outlasted the shutdown; left to it", "session_id", s.ID)
					return
				}
				defer unlock()
				if cur, err := m.get(s.ID); err == nil && cur.Status == StatusRunning {
					m.endWith(ctx, s.ID, "shutdown", errShutdown)
				}
			})
		}
	}
	wg.Wait()
}

// errShutdown is the error of a session StopAll ends.
var errShutdown = errors.New("the server shut down (shutdown: stop)")

// end destroys a session's sandbox and records its end.
func (m *Manager) end(ctx context.Context, id, reason string) { m.endWith(ctx, id, reason, nil) }

// endWith is end, with the error that ended the session, if any.
func (m *Manager) endWith(ctx context.Context, id, reason string, cause error) {
	s, err := m.get(id)
	if err != nil || s.Status != StatusRunning && s.Status != StatusSuspended {
		return
	}
	if p := m.opts.Placements.Usable(s.Runtime); p != nil {
		// Its commands get SIGTERM first, and stop_grace to end (the
		// exec agent passes the signal on and waits for them).
		if s.Status == StatusRunning && m.opts.StopGrace > 0 {
			if err := p.Sandbox.Stop(ctx, id, m.opts.StopGrace); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				m.log.Warn("cannot stop a session's sandbox; destroying it", "session_id", id, "err", err)
			}
		}
		if err := p.Sandbox.Destroy(ctx, id); err != nil {
			m.log.Warn("cannot destroy a session's sandbox", "session_id", id, "err", err)
			if !errors.Is(err, sandbox.ErrQuarantined) {
				m.mu.Lock()
				m.undestroyed[id] = &undestroyed{rt: p.Sandbox, wait: m.opts.DestroyRetry, next: time.Now().Add(m.opts.DestroyRetry), attempts: 1}
				m.mu.Unlock()
			}
		}
	}
	if m.opts.Egress != nil && s.Network != "" && s.Network != task.NetworkNone {
		m.opts.Egress.Close(id)
	}
	// Its memory, if a suspend kept it: secrets and all.
	if err := os.RemoveAll(m.checkpointDir(id)); err != nil {
		m.log.Warn("cannot remove an ended session's checkpoint", "session_id", id, "err", err)
	}
	if s.Workspace != "" {
		m.checkGit(ctx, s)
		// Before the end is recorded: the record wakes the scheduler,
		// which may start a task waiting for the workspace.
		m.opts.Writers.Release(s.Workspace, id)
	}
	if m.opts.Quota != nil && s.Workspace == "" {
		m.opts.Quota.Release(ctx, id, ownDir(id))
	}
	m.endExecs(id, reason)
	end := map[string]string{"reason": reason}
	if cause != nil {
		end["error"] = errdefs.Message(cause)
	}
	if err := m.append(ctx, id, EventEnded, end); err != nil {
		m.log.Error("cannot record a session's end", "session_id", id, "err", err)
		return
	}
	m.log.Info("session ended", "session_id", id, "reason", reason)
}

// undestroyed is an ended session's sandbox whose destroy failed: its
// runtime, when to try again, and after how many attempts.
type undestroyed struct {
	rt       sandbox.Runtime
	wait     time.Duration // doubled after each failure, at most 5 minutes
	next     time.Time
	attempts int
}

// destroyAttempt bounds each of destroyAgain's attempts, which the
// reaper makes one after another: a runtime out of reach must not hold
// the reaping of every other session.
const destroyAttempt = time.Minute

// destroyAgain destroys the sandboxes of ended sessions whose destroy
// failed and whose next attempt is due. One that fails again (or takes
// longer than destroyAttempt) waits twice as long; one quarantined is
// left to an operator; the ones left when the server stops are the next
// start's (Start destroys the sandboxes of ended sessions).
func (m *Manager) destroyAgain(ctx context.Context) {
	now := time.Now()
	m.mu.Lock()
	due := map[string]*undestroyed{}
	for id, u := range m.undestroyed {
		if !now.Before(u.next) {
			due[id] = u
		}
	}
	m.mu.Unlock()
	for id, u := range due {
		actx, cancel := context.WithTimeout(ctx, destroyAttempt)
		err := u.rt.Destroy(actx, id)
		cancel()
		if ctx.Err() != nil {
			return
		}
		u.attempts++
		m.mu.Lock()
		switch {
		case err == nil:
			delete(m.undestroyed, id)
			m.log.Info("session sandbox destroyed after a failed destroy", "session_id", id, "attempts", u.attempts)
		case errors.Is(err, sandbox.ErrQuarantined):
			delete(m.undestroyed, id)
			m.log.Warn("cannot destroy a session's sandbox", "session_id", id, "attempts", u.attempts, "err", err)
		default:
			u.wait = min(2*u.wait, 5*time.Minute)
			u.next = time.Now().Add(u.wait)
			m.log.Warn("cannot destroy a session's sandbox yet", "session_id", id, "attempts", u.attempts, "err", err)
		}
		m.mu.Unlock()
	}
}
