// Package session runs sessions (seed 003): long-lived sandboxes on a
// chosen runtime and image in which callers run commands, streaming their
// output. A session is an event stream (session/<id>): session_created
// (with the sandbox's handle), exec_started and exec_ended per command,
// and session_ended with the reason. The Manager folds those streams at
// start, reattaches to the sandboxes that still run (or ends their
// sessions as lost), ends sessions past their idle timeout or lifetime,
// and, for a server that stops its sandboxes when it shuts down, ends
// those it runs (StopAll).
//
// Each session has a token of its own: it can run commands in that session
// and nothing else (the HTTP API checks it with Authorize).
package session

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/execagent"
	"github.com/corral-dev/corral/internal/ids"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workspace"
)

// Event types of a session's stream.
const (
	EventCreated   = "session_created"
	EventExecStart = "exec_started"
	EventExecEnd   = "exec_ended"
	EventEnded     = "session_ended"
	EventGranted   = "session_token_granted"
	// EventWorkspaceGit records what a session left in its workspace's
	// repository that git runs as the workspace's owner (task.WorkspaceGit),
	// once its sandbox is gone.
	EventWorkspaceGit = "session_workspace_git_checked"
	// EventDirRemoved records an ended session's own directory removed
	// (sessions/<id>): at once when it was deleted, else after Retention.
	EventDirRemoved = "session_directory_removed"
	// EventNetworkChanged records a running session's new network policy
	// (networkChanged); the replica that runs it has its proxy follow.
	EventNetworkChanged = "session_network_changed"
	// EventAdopted records a replica taking a session over from one gone
	// (adopted): its exec agent, finding its replica's socket dead, dialled
	// the host's shared one, which this replica serves.
	EventAdopted    = "session_adopted"
	streamPrefix    = "session/"
	idPrefix        = "sess-"
	labelSession    = "corral.session-id"
	sessionDirRoot  = "sessions"
	defaultIdle     = 30 * time.Minute
	defaultLifetime = 8 * time.Hour
)

// The session contract's types, by their names here (service holds them).
type (
	CreateRequest = service.CreateSessionRequest
	Session       = service.Session
	ExecRequest   = service.SessionCommand
	ExecEnd       = service.SessionExecEnd
)

// Statuses, the token prefix and the sandbox's directory (see service).
const (
	StatusRunning   = service.SessionRunning
	StatusSuspended = service.SessionSuspended
	StatusEnded     = service.SessionEnded
	TokenPrefix     = service.SessionTokenPrefix
	Dir             = service.SessionDir
)

// Options configure a Manager.
type Options struct {
	Store eventstore.Store
	Data  *workspace.DataRoot
	// Projects are the named workspaces a session may work in; nil:
	// projects/ of Data alone.
	Projects *workspace.Projects
	// Placements are the runtimes, those sessions may use among them
	// (placement.Set.Usable); nil: none.
	Placements *placement.Set
	// DefaultRuntime is a session's runtime when it names none.
	DefaultRuntime string
	// Base is where the data root holds corral and corral-worker (a
	// session's sandbox runs corral-worker as its main process, the exec
	// agent: `corral-worker worker session`) and the server's unix
	// socket, which the exec agent dials.
	Base placement.Base
	// Egress runs the proxy of a session with network allowlist or open
	// (the tasks' one); nil: sessions have no network. Networks says which
	// policies this server offers ("" if it can); CheckAllow checks a
	// session's own allowlist (nil: none is taken).
	Egress     Egress
	Networks   map[string]string
	CheckAllow func(entries []string) error
	// Writers is who writes each named workspace, shared with the
	// scheduler; nil: the manager's own.
	Writers *task.Writers
	// Image is a session's image on an image runtime when it names none;
	// AllowedImages the glob patterns one must match (none: any).
	Image         string
	AllowedImages []string
	// Limits are a session's sandbox limits when it gives none.
	Limits sandbox.Limits
	// MaxSessions bounds the sessions that run at once (429 past it).
	MaxSessions int
	// StopGrace is how long a session's commands have from their SIGTERM
	// to their SIGKILL when the session ends (limits.stop_grace); 0:
	// killed at once.
	StopGrace time.Duration
	// DestroyRetry is the first wait before an ended session's sandbox
	// whose destroy failed (and was not quarantined) is destroyed again
	// by the reaper; it doubles up to 5 minutes. Default 5 s.
	DestroyRetry time.Duration
	// MinFreeBytes is the data root's free-space floor (limits.
	// min_free_disk): below it no session is made or forked, as no task
	// is spawned; 0: none.
	MinFreeBytes int64
	// IdleAction is what becomes of an idle session: IdleSuspend suspends
	// it, IdleDelete ends it, IdleAuto (and "") suspends it where its
	// runtime keeps its memory and ends it elsewhere.
	IdleAction string
	// IdleTimeout and MaxLifetime are a session's when it gives none, and
	// their upper bounds.
	IdleTimeout, MaxLifetime time.Duration
	Now                      func() time.Time
	// TaskEnded reports whether task id has ended (or is unknown): a token
	// granted to a task dies with it. Nil: granted tokens are refused.
	TaskEnded func(id string) bool
	// Quota holds a session's own directory (sessions/<id>; not a
	// workspace it works in, as a workspace task's) to the task
	// directories' quota and the data root's free-space floor; nil: none.
	Quota Quota
	// Retention is how long an ended session's own directory is kept
	// (one deleted goes at once); 0: kept.
	Retention time.Duration
	// AllowHooks leaves executable the git hooks a session leaves in the
	// workspace it works in (workspaces.allow_hooks); they are listed on
	// its stream either way.
	AllowHooks bool
	// Crash, when set, is called at sandbox.SessionCrashPoints; the fault
	// tests have the server die there. Nil in production.
	Crash func(point string)
	// Members is this server's view of its cluster: a session is run by
	// the replica that made it, or that adopted it; nil: a server alone
	// on its store.
	Members cluster.Members
}

// Idle actions (Options.IdleAction).
const (
	IdleAuto    = "auto"
	IdleSuspend = "suspend"
	IdleDelete  = "delete"
)

// idleSuspends reports whether an idle session on runtime rt is
// suspended rather than ended.
func (m *Manager) idleSuspends(rt string) bool {
	switch m.opts.IdleAction {
	case IdleSuspend:
		return true
	case IdleDelete:
		return false
	}
	_, ok := checkpointer(m.opts.Placements.Usable(rt))
	return ok
}

// Quota is the disk quota of session directories: Limit before the
// session's sandbox starts, Check while it runs (an error ends the
// session; else when to check again), Release once it has ended. rel is
// the directory's path in the data root.
type Quota interface {
	Limit(ctx context.Context, id, rel string) error
	Check(ctx context.Context, id, rel string) (time.Duration, error)
	Release(ctx context.Context, id, rel string)
}

// state is a session as the manager folds it: what Get answers, and what
// only the manager knows of it.
type state struct {
	Session
	tokenHashes    []string          // the session's token's and its agent's
	grants         map[string]string // tokens granted to tasks: hash -> task id
	agentTokenHash string            // the exec agent's: the only one that may attach as it
	dirRemoved     bool              // its own directory is gone (EventDirRemoved)
	// execLogsRemoved: its commands' output logs are gone (this process
	// removed them).
	execLogsRemoved bool
	openExecs       map[string]openExec // execs started and not ended, by id
	handle          sandbox.Handle
	running         int    // execs running now
	netChanged      bool   // its network policy changed since its proxy here last took it
	replica         string // the replica that runs it (cluster.Replica)
	limits          *sandbox.Limits
	lastOutput      time.Time // when a command last printed (here)
	dir             string    // its directory (created's)
	hostDir         bool
	selfNamed       bool  // created's SelfNamed
	version         int64 // its stream's version folded: apply takes each event once
	// lent: this replica opened its proxy for its pod, which reached it
	// behind the Service, without running it (EgressKey).
	lent bool
	// ops is held by each of its lifecycle operations (lockOps).
	ops sync.Mutex
}

// opBound bounds a lifecycle operation (a create, fork, suspend, resume or
// delete) once it has begun: it runs to its end even when the caller that
// asked for it goes away (detach), up to this long.
const opBound = 10 * time.Minute

// detach is ctx for a lifecycle operation: not cancelled with its caller's
// request, bounded by opBound. A client that drops, or a command's caller
// interrupted while its session resumes, must not cut a checkpoint or a
// restore short, nor end a session whose agent it stopped waiting for: the
// operation finishes, and the session's stream says how.
func detach(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), opBound)
}

// begin starts a lifecycle operation on session id: its context detached
// (detach) and the session's lifecycle lock held (lockOps). Call end when
// the operation is done.
func (m *Manager) begin(ctx context.Context, id string) (_ context.Context, end func()) {
	ctx, cancel := detach(ctx)
	unlock := m.lockOps(id)
	return ctx, func() { unlock(); cancel() }
}

// lockOps takes session id's lifecycle lock: one suspend, resume, fork or
// delete of it at a time, each finding the state the one before left (a
// retried suspend finds the session suspended, not a checkpoint under
// way). It returns its unlock.
func (m *Manager) lockOps(id string) (unlock func()) {
	mu := m.opsOf(id)
	mu.Lock()
	return mu.Unlock
}

// tryLockOps is lockOps if no operation holds the lock, else false.
func (m *Manager) tryLockOps(id string) (unlock func(), ok bool) {
	mu := m.opsOf(id)
	if !mu.TryLock() {
		return nil, false
	}
	return mu.Unlock, true
}

// lockOpsWithin is lockOps, giving up when ctx ends first (ok false).
func (m *Manager) lockOpsWithin(ctx context.Context, id string) (unlock func(), ok bool) {
	for {
		if unlock, ok := m.tryLockOps(id); ok {
			return unlock, true
		}
		select {
		case <-ctx.Done():
			return nil, false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// opsOf is session id's lifecycle lock; a session not known here has a
// lock of its own each time (none).
func (m *Manager) opsOf(id string) *sync.Mutex {
	m.mu.Lock()
	defer m.mu.Unlock()
	if st := m.sessions[id]; st != nil {
		return &st.ops
	}
	return new(sync.Mutex)
}

// openExec is an exec started and not ended, as its start recorded it.
type openExec struct {
	At      time.Time
	Timeout time.Duration
}

// created is session_created's payload.
type created struct {
	Session
	TokenHash      string         `json:"token_hash"`
	AgentTokenHash string         `json:"agent_token_hash"`
	Handle         sandbox.Handle `json:"handle"`
	Replica        string         `json:"replica,omitempty"`
	// Limits, Dir and HostDir are what a resume starts its sandbox with
	// again (nil Limits, from a server before suspend: the defaults).
	Limits  *sandbox.Limits `json:"limits,omitempty"`
	Dir     string          `json:"dir,omitempty"`
	HostDir bool            `json:"host_dir,omitempty"`
	// SelfNamed: its sandbox has its id in workerproto.SelfDir (its
	// resumes mount it again; a fork of its memory needs it).
	SelfNamed bool `json:"self_named,omitempty"`
	// InheritedExecs are the commands a fork's sandbox runs from its
	// source's memory, under their ids there.
	InheritedExecs []inheritedExec `json:"inherited_execs,omitempty"`
}

// inheritedExec is a command a fork took over from its source, running.
type inheritedExec struct {
	ExecID         string    `json:"exec_id"`
	StartedAt      time.Time `json:"started_at"`
	TimeoutSeconds int       `json:"timeout_seconds,omitempty"`
}

// adopted is session_adopted's payload.
type adopted struct {
	Replica string `json:"replica"`
	From    string `json:"from,omitempty"`
}

// Manager runs sessions. It is safe for concurrent use.
type Manager struct {
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	sessions map[string]*state
	agents   map[string]*execagent.Conn
	execs    map[execKey]*runningExec // the commands running in sessions run here
	attached chan struct{}            // closed and replaced when an agent attaches
	// held are the sessions whose restored agents wait to attach until
	// their sandbox's record is made (hold), by id.
	held map[string]chan struct{}
	pos  int64 // the position up to which the log is folded (Start, Follow)
	// discarded are restored checkpoints moved aside, for the reaper to
	// remove (discardCheckpoint).
	discarded []string
	// undestroyed are the sandboxes of ended sessions whose destroy
	// failed, for the reaper to destroy again (destroyAgain), by id.
	undestroyed map[string]*undestroyed
}

// New returns a Manager; Start folds the recorded sessions.
func New(opts Options, log *slog.Logger) *Manager {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = defaultIdle
	}
	if opts.Writers == nil {
		opts.Writers = &task.Writers{}
	}
	if opts.Projects == nil && opts.Data != nil {
		opts.Projects, _ = workspace.NewProjects(opts.Data, nil) // no roots: nothing to refuse
	}
	if opts.MaxLifetime <= 0 {
		opts.MaxLifetime = defaultLifetime
	}
	if opts.DestroyRetry <= 0 {
		opts.DestroyRetry = 5 * time.Second
	}
	if opts.Members == nil {
		opts.Members = cluster.NewSolo(cluster.Replica{ID: cluster.NewID()})
	}
	return &Manager{opts: opts, log: log, sessions: map[string]*state{}, agents: map[string]*execagent.Conn{}, execs: map[execKey]*runningExec{}, attached: make(chan struct{}), held: map[string]chan struct{}{}, undestroyed: map[string]*undestroyed{}}
}

// Egress runs per-session egress proxies (taskrun's Egress, keyed by the
// session id).
type Egress interface {
	// Open starts the proxy of session id, or keeps the one that runs;
	// allow, when not nil, is the session's own allowlist.
	Open(id, network string, allow []string) (dir string, err error)
	// Update gives the session's proxy, which runs here, a new policy.
	Update(id, network string, allow []string) error
	Close(id string) error
	// SandboxEnv is taskrun.Egress's, for a session under network.
	SandboxEnv(network string) []string
	// Key is the key with which session id's sandbox on a remote runtime
	// (a pod) proves itself to the server's egress listener
	// (egress.SessionKey): its own, and the same after a restart.
	Key(id string) []byte
}

// snapshotGit keeps what the repository of the workspace session id works
// in runs (hooks, .git/config) before its sandbox starts, for checkGit.
func (m *Manager) snapshotGit(id string, project workspace.Project) error {
	root, err := m.opts.Projects.Open(project)
	if err != nil {
		return fmt.Errorf("open the session's workspace: %w", err)
	}
	defer root.Close()
	return m.opts.Data.SaveGitSnapshot(id, root)
}

// checkGit looks, once session s's sandbox is gone, at what it left in its
// workspace's repository for the workspace's owner to run: the hooks it
// created or changed lose their execute bits (unless allowed), and what it
// found is recorded on its stream.
func (m *Manager) checkGit(ctx context.Context, s Session) {
	pr, err := m.opts.Projects.Resolve(s.Workspace)
	if err != nil {
		return
	}
	root, err := m.opts.Projects.Open(pr)
	if err != nil {
		return
	}
	defer root.Close()
	found, ok, err := m.opts.Data.CheckSavedGit(s.ID, root, m.opts.AllowHooks)
	if err != nil {
		m.log.Warn("cannot disable the hooks a session left in its workspace", "session_id", s.ID, "err", err)
	}
	if !ok || len(found.Hooks)+len(found.Config) == 0 {
		return
	}
	got := task.WorkspaceGit{Hooks: found.Hooks, HooksDisabled: len(found.Hooks) > 0 && !m.opts.AllowHooks && err == nil, Config: found.Config}
	if err := m.append(ctx, s.ID, EventWorkspaceGit, got); err != nil {
		m.log.Warn("cannot record what a session left in its workspace's repository", "session_id", s.ID, "err", err)
	}
}

// ownDir is session id's own directory in the data root, where it works
// unless it works in a workspace.
func ownDir(id string) string { return sessionDirRoot + "/" + id }

// StreamID is session id's event stream.
func StreamID(id string) string { return streamPrefix + id }

// ValidID reports whether id is well formed: "sess-" and an ids.New id.
func ValidID(id string) bool {
	rest, ok := strings.CutPrefix(id, idPrefix)
	return ok && ids.Valid(rest)
}

func (m *Manager) notFound(id string) error {
	return fmt.Errorf("session %q: %w", clip.String(id, 64), errdefs.ErrNotFound)
}

// apply folds one event of any stream.
func (m *Manager) apply(e eventstore.Event) {
	id, ok := strings.CutPrefix(e.StreamID, streamPrefix)
	if !ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// Each event once, in its stream's order: an append of this server's
	// is applied at once and again as the log is followed, and one that
	// overtook another server's waits for it.
	if s := m.sessions[id]; s != nil && e.StreamVersion != s.version+1 || s == nil && e.StreamVersion != 1 {
		return
	}
	if s := m.sessions[id]; s != nil {
		s.version++
	}
	switch e.Type {
	case EventCreated:
		var c created
		if json.Unmarshal(e.Data, &c) != nil {
			return
		}
		st := &state{Session: c.Session, tokenHashes: []string{c.TokenHash, c.AgentTokenHash}, agentTokenHash: c.AgentTokenHash, handle: c.Handle,
			replica: c.Replica, version: 1, limits: c.Limits, dir: c.Dir, hostDir: c.HostDir, selfNamed: c.SelfNamed}
		for _, x := range c.InheritedExecs {
			if st.openExecs == nil {
				st.openExecs = map[string]openExec{}
			}
			st.openExecs[x.ExecID] = openExec{At: x.StartedAt, Timeout: time.Duration(x.TimeoutSeconds) * time.Second}
		}
		m.sessions[id] = st
	// An end is final: a suspend or resume recorded after it (by a server
	// before the reaper kept to the session's lock) changes nothing, and
	// the next start destroys a sandbox it left.
	case EventSuspended:
		if s := m.sessions[id]; s != nil && s.Status != StatusEnded {
			var p suspended
			json.Unmarshal(e.Data, &p)
			s.Status, s.handle, s.MemoryKept = StatusSuspended, sandbox.Handle{}, p.MemoryKept
		}
	case EventResumed:
		var r resumed
		if s := m.sessions[id]; s != nil && s.Status != StatusEnded && json.Unmarshal(e.Data, &r) == nil {
			// The old agent's token goes; the new one attaches.
			s.tokenHashes = slices.DeleteFunc(s.tokenHashes, func(h string) bool { return h == s.agentTokenHash })
			s.tokenHashes = append(s.tokenHashes, r.AgentTokenHash)
			s.Status, s.agentTokenHash, s.handle, s.replica, s.MemoryKept = StatusRunning, r.AgentTokenHash, r.Handle, r.Replica, false
			s.LastUsedAt = e.RecordedAt
		}
	case EventAdopted:
		var a adopted
		if s := m.sessions[id]; s != nil && json.Unmarshal(e.Data, &a) == nil {
			s.replica = a.Replica
		}
	case EventNetworkChanged:
		var n task.NetworkChanged
		if s := m.sessions[id]; s != nil && json.Unmarshal(e.Data, &n) == nil {
			s.Network, s.NetworkAllow, s.netChanged = n.Network, n.Allow, true
		}
	case EventGranted:
		var g granted
		if s := m.sessions[id]; s != nil && json.Unmarshal(e.Data, &g) == nil {
			if s.grants == nil {
				s.grants = map[string]string{}
			}
			s.grants[g.TokenHash] = g.TaskID
		}
	case EventExecStart:
		var p execStarted
		if s := m.sessions[id]; s != nil && json.Unmarshal(e.Data, &p) == nil {
			if s.openExecs == nil {
				s.openExecs = map[string]openExec{}
			}
			s.openExecs[p.ExecID] = openExec{At: e.RecordedAt, Timeout: time.Duration(p.TimeoutSeconds) * time.Second}
		}
	case EventExecEnd:
		if s := m.sessions[id]; s != nil {
			s.Execs++
			s.LastUsedAt = e.RecordedAt
			var p ExecEnd
			if json.Unmarshal(e.Data, &p) == nil {
				delete(s.openExecs, p.ExecID)
			}
		}
	case EventEnded:
		if s := m.sessions[id]; s != nil {
			var p struct {
				Reason string `json:"reason"`
				Error  string `json:"error"`
			}
			json.Unmarshal(e.Data, &p)
			at := e.RecordedAt
			s.Status, s.EndReason, s.EndError, s.EndedAt = StatusEnded, p.Reason, p.Error, &at
		}
	case EventDirRemoved:
		if s := m.sessions[id]; s != nil {
			s.dirRemoved = true
		}
	}
}

func (m *Manager) handleOf(id string) sandbox.Handle {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sessions[id].handle
}

// Get returns a session.
func (m *Manager) Get(ctx context.Context, id string) (Session, error) {
	m.known(ctx, id)
	return m.get(id)
}

// known folds the log up to now when session id is not known here: one
// made a moment ago through another replica of the cluster is found, not
// called unknown. Ids of no session cost a read of the log's end.
func (m *Manager) known(ctx context.Context, id string) {
	m.mu.Lock()
	_, ok := m.sessions[id]
	m.mu.Unlock()
	if ok || !ValidID(id) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := m.sync(ctx); err != nil {
		m.log.Warn("cannot read the log for a session not known here", "session_id", id, "err", err)
	}
}

func (m *Manager) get(id string) (Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok {
		return Session{}, m.notFound(id)
	}
	return s.Session, nil
}

// List returns every session, newest first.
func (m *Manager) List(context.Context) ([]Session, error) {
	return m.list(), nil
}

func (m *Manager) list() []Session {
	m.mu.Lock()
	out := make([]Session, 0, len(m.sessions))
	for _, s := range m.sessions {
		out = append(out, s.Session)
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b Session) int { return strings.Compare(b.ID, a.ID) })
	return out
}

// Authorize reports whether token is session id's own, or one granted to
// a task working through it that has not ended: a granted token dies with
// its task, so one the task left in a file (an output saved to shared/,
// say) reaches nothing afterwards.
func (m *Manager) Authorize(id, token string) bool {
	if token == "" {
		return false
	}
	m.known(context.Background(), id)
	h := hashToken(token)
	m.mu.Lock()
	s := m.sessions[id]
	if s == nil {
		m.mu.Unlock()
		return false
	}
	ok := false
	for _, want := range s.tokenHashes {
		if subtle.ConstantTimeCompare([]byte(h), []byte(want)) == 1 {
			ok = true
		}
	}
	// The map's lookup compares the hash, not the token: no timing of
	// the comparison tells anything of a token.
	taskID, granted := s.grants[h]
	m.mu.Unlock()
	return ok || granted && m.opts.TaskEnded != nil && !m.opts.TaskEnded(taskID)
}

// AuthorizeAgent reports whether token is session id's exec agent's own:
// no other token of the session (its owner's, a task's) may stand in for
// the agent, which sees every command run in the session.
func (m *Manager) AuthorizeAgent(id, token string) bool {
	m.mu.Lock()
	var want string
	if s := m.sessions[id]; s != nil {
		want = s.agentTokenHash
	}
	m.mu.Unlock()
	if token == "" || want == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(hashToken(token)), []byte(want)) == 1
}

func hashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

func newToken() string {
	var raw [24]byte
	rand.Read(raw[:])
	return TokenPrefix + hex.EncodeToString(raw[:])
}

// granted is session_token_granted's payload.
type granted struct {
	TaskID    string `json:"task_id"`
	TokenHash string `json:"token_hash"`
}

// Running returns nil if session id runs, else an error saying why not.
func (m *Manager) Running(id string) error {
	s, err := m.get(id)
	if err != nil {
		return err
	}
	if s.Status != StatusRunning {
		return fmt.Errorf("session %s ended (%s): %w", id, s.EndReason, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// Grant gives task taskID a token of session id's own: it runs commands in
// that session and nothing else, while the session runs and the task has
// not ended.
func (m *Manager) Grant(ctx context.Context, id, taskID string) (string, error) {
	if err := m.Running(id); err != nil {
		return "", err
	}
	token := newToken()
	if err := m.append(ctx, id, EventGranted, granted{TaskID: taskID, TokenHash: hashToken(token)}); err != nil {
		return "", err
	}
	return token, nil
}

func (m *Manager) append(ctx context.Context, id, typ string, payload any) error {
	return m.appendAt(ctx, id, eventstore.AnyVersion, typ, payload)
}

// appendAt is append at the stream's expected version: it fails with
// eventstore.ErrVersionConflict if another replica appended meanwhile.
func (m *Manager) appendAt(ctx context.Context, id string, version int64, typ string, payload any) error {
	b, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	evs, err := m.opts.Store.Append(ctx, streamPrefix+id, version, eventstore.Proposed{Type: typ, SchemaVersion: task.SchemaVersion, Data: b})
	for _, e := range evs {
		m.apply(e)
	}
	return err
}

// The manager implements the session contract and its gate.
var (
	_ service.Sessions    = (*Manager)(nil)
	_ service.SessionGate = (*Manager)(nil)
)
