// Package session runs sessions (seed 003): long-lived sandboxes on a
// chosen runtime and image in which callers run commands, streaming their
// output. A session is an event stream (session/<id>): session_created
// (with the sandbox's handle), exec_started and exec_ended per command,
// and session_ended with the reason. The Manager folds those streams at
// start, reattaches to the sandboxes that still run (or ends their
// sessions as lost), and ends sessions past their idle timeout or
// lifetime.
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
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/execagent"
	"github.com/corral-dev/corral/internal/ids"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workerproto"
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
	streamPrefix    = "session/"
	idPrefix        = "sess-"
	labelSession    = "corral.session-id"
	sessionDirRoot  = "sessions"
	defaultIdle     = 30 * time.Minute
	defaultLifetime = 8 * time.Hour
)

// TokenPrefix starts every session token, so the API can tell one used
// out of its session (403) from a wrong token (401).
const TokenPrefix = "sess_"

// Dir is where a session's sandbox starts, its own read-write directory
// (sessions/<id>/ in the data root); shared/ is read-only beside it.
const Dir = "/workspace/session"

// Options configure a Manager.
type Options struct {
	Store eventstore.Store
	Data  *workspace.DataRoot
	// Projects are the named workspaces a session may work in; nil:
	// projects/ of Data alone.
	Projects *workspace.Projects
	// Runtimes are the runtimes sessions may use, by name; Unavailable
	// says why one that exists cannot be used ("" if it can).
	Runtimes    map[string]sandbox.Runtime
	Unavailable map[string]string
	// DefaultRuntime is a session's runtime when it names none.
	DefaultRuntime string
	// BinDir is the data root's directory holding corral and
	// corral-worker: a session's sandbox runs corral-worker as its main
	// process, the exec agent (`corral-worker worker session`).
	BinDir string
	// SocketDir is the data root's directory holding the server's unix
	// socket, which the exec agent dials.
	SocketDir string
	// Egress runs the proxy of a session with network allowlist or open
	// (the tasks' one); nil: sessions have no network. Networks says which
	// policies this server offers ("" if it can).
	Egress   Egress
	Networks map[string]string
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

// CreateRequest is POST /api/sessions.
type CreateRequest struct {
	Image   string            `json:"image,omitempty"`
	Runtime string            `json:"runtime,omitempty"`
	Network string            `json:"network,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	// Workspace, when set, is a named workspace (projects/<name>/) the
	// session works in, read-write at Dir, instead of a directory of its
	// own. The session is its one writer while it runs: creating one while
	// a task or another session writes it is a conflict.
	Workspace string `json:"workspace,omitempty"`
	// Resources override the configured sandbox limits, in the
	// configuration's units ("2Gi", "500m"), as spawn_worker's do.
	Resources *service.ResourceRequest `json:"resources,omitempty"`
	// IdleTimeout and MaxLifetime are in seconds.
	IdleTimeout int `json:"idle_timeout,omitempty"`
	MaxLifetime int `json:"max_lifetime,omitempty"`
}

// Session is a session's current state.
type Session struct {
	ID          string            `json:"session_id"`
	Runtime     string            `json:"runtime"`
	Image       string            `json:"image,omitempty"`
	Network     string            `json:"network"`
	Workspace   string            `json:"workspace,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Status      string            `json:"status"` // running | ended
	EndReason   string            `json:"end_reason,omitempty"`
	EndError    string            `json:"end_error,omitempty"` // what ended it, for a person, when it failed
	CreatedAt   time.Time         `json:"created_at"`
	LastUsedAt  time.Time         `json:"last_used_at"`
	EndedAt     *time.Time        `json:"ended_at,omitempty"`
	Execs       int               `json:"execs"`
	IdleTimeout int               `json:"idle_timeout"`
	MaxLifetime int               `json:"max_lifetime"`

	tokenHashes    []string          // the session's token's and its agent's
	grants         map[string]string // tokens granted to tasks: hash -> task id
	agentTokenHash string            // the exec agent's: the only one that may attach as it
	dirRemoved     bool              // its own directory is gone (EventDirRemoved)
	openExecs      map[string]bool   // execs started and not ended, by id
	handle         sandbox.Handle
	running        int // execs running now
}

// Statuses.
const (
	StatusRunning = "running"
	StatusEnded   = "ended"
)

// created is session_created's payload.
type created struct {
	Session
	TokenHash      string         `json:"token_hash"`
	AgentTokenHash string         `json:"agent_token_hash"`
	Handle         sandbox.Handle `json:"handle"`
}

// ExecRequest is a command to run in a session.
type ExecRequest struct {
	// Command is the argv, or, with Shell, one string run with sh -c.
	Command []string `json:"-"`
	Shell   string   `json:"-"`
	Dir     string   `json:"cwd,omitempty"`
	Env     []string `json:"-"`
	Stdin   io.Reader
	// Timeout bounds the command; 0: until the client goes away.
	Timeout time.Duration
}

// ExecEnd is exec_ended's payload and an exec's answer.
type ExecEnd struct {
	ExecID      string `json:"exec_id"`
	ExitCode    int    `json:"exit_code"`
	DurationMS  int64  `json:"duration_ms"`
	StdoutBytes int64  `json:"stdout_bytes"`
	StderrBytes int64  `json:"stderr_bytes"`
	Error       string `json:"error,omitempty"`
	// Reason is "lost" for an exec the server's crash cut: its end was
	// recorded by the next start, and its command ended with the
	// connection to the session's agent.
	Reason string `json:"reason,omitempty"`
}

// Manager runs sessions. It is safe for concurrent use.
type Manager struct {
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	sessions map[string]*Session
	agents   map[string]*execagent.Conn
	attached chan struct{} // closed and replaced when an agent attaches
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
	return &Manager{opts: opts, log: log, sessions: map[string]*Session{}, agents: map[string]*execagent.Conn{}, attached: make(chan struct{})}
}

// Egress runs per-session egress proxies (taskrun's Egress, keyed by the
// session id).
type Egress interface {
	Open(id, network string) (dir string, err error)
	Close(id string) error
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

// Start folds the recorded sessions, reattaches to the sandboxes of those
// still running (ending the others as lost) and destroys sandboxes no
// session owns. Run Reap beside it to end sessions past their limits.
func (m *Manager) Start(ctx context.Context) error {
	var after int64
	for {
		evs, err := m.opts.Store.ReadAll(ctx, after, 1024)
		if err != nil {
			return fmt.Errorf("read sessions: %w", err)
		}
		if len(evs) == 0 {
			break
		}
		for _, e := range evs {
			after = e.Position
			m.apply(e)
		}
	}
	if err := m.closeLostExecs(ctx); err != nil {
		return err
	}
	for _, s := range m.List() {
		if s.Status != StatusRunning {
			continue
		}
		rt := m.opts.Runtimes[s.Runtime]
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
			if _, err := m.opts.Egress.Open(s.ID, s.Network); err != nil {
				m.log.Warn("cannot reopen a session's egress proxy", "session_id", s.ID, "err", err)
			}
		}
		if st, err := rt.Status(ctx, s.ID); err != nil || st.State == sandbox.StateExited {
			m.end(ctx, s.ID, "lost")
		}
	}
	for name, rt := range m.opts.Runtimes {
		if m.opts.Unavailable[name] != "" {
			continue
		}
		hs, err := rt.List(ctx, map[string]string{sandbox.LabelManaged: "true", labelSession: "true"})
		if err != nil {
			m.log.Warn("cannot list session sandboxes", "runtime", name, "err", err)
			continue
		}
		for _, h := range hs {
			if s, err := m.Get(h.ID); err != nil || s.Status != StatusRunning {
				rt.Destroy(ctx, h.ID)
			}
		}
	}
	return nil
}

// closeLostExecs records the end of every exec a crash cut (started, never
// ended): its command ended when the server's connection to the session's
// agent did (the agent kills a connection's commands when it ends), so
// each is lost, and said so.
func (m *Manager) closeLostExecs(ctx context.Context) error {
	m.mu.Lock()
	lost := map[string][]string{}
	for id, s := range m.sessions {
		for ex := range s.openExecs {
			lost[id] = append(lost[id], ex)
		}
	}
	m.mu.Unlock()
	for id, execs := range lost {
		slices.Sort(execs)
		for _, ex := range execs {
			end := ExecEnd{ExecID: ex, ExitCode: -1, Reason: "lost",
				Error: "lost: the server stopped while it ran, and its command ended with the server's connection to the session"}
			if err := m.append(ctx, id, EventExecEnd, end); err != nil {
				return fmt.Errorf("record an exec the crash cut: %w", err)
			}
		}
	}
	return nil
}

// Reap ends sessions past their idle timeout or lifetime (checked every
// second) or their directory's quota (as often as Quota says), and
// removes ended sessions' own directories once their retention has
// passed, until ctx is done.
func (m *Manager) Reap(ctx context.Context) error {
	t := time.NewTicker(quotaTick)
	defer t.Stop()
	var reaped time.Time
	nextCheck := map[string]time.Time{}
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
		m.removeDirs(ctx)
		now := m.opts.Now()
		for _, s := range m.List() {
			if s.Status != StatusRunning {
				continue
			}
			m.mu.Lock()
			busy := m.sessions[s.ID].running > 0
			m.mu.Unlock()
			switch {
			case now.Sub(s.CreatedAt) > time.Duration(s.MaxLifetime)*time.Second:
				m.end(ctx, s.ID, "max_lifetime")
			case !busy && now.Sub(s.LastUsedAt) > time.Duration(s.IdleTimeout)*time.Second:
				m.end(ctx, s.ID, "idle_timeout")
			}
		}
	}
}

// apply folds one event of any stream.
func (m *Manager) apply(e eventstore.Event) {
	id, ok := strings.CutPrefix(e.StreamID, streamPrefix)
	if !ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch e.Type {
	case EventCreated:
		var c created
		if json.Unmarshal(e.Data, &c) != nil {
			return
		}
		s := c.Session
		s.tokenHashes, s.agentTokenHash, s.handle = []string{c.TokenHash, c.AgentTokenHash}, c.AgentTokenHash, c.Handle
		m.sessions[id] = &s
	case EventGranted:
		var g granted
		if s := m.sessions[id]; s != nil && json.Unmarshal(e.Data, &g) == nil {
			if s.grants == nil {
				s.grants = map[string]string{}
			}
			s.grants[g.TokenHash] = g.TaskID
		}
	case EventExecStart:
		var p ExecEnd // its exec_id
		if s := m.sessions[id]; s != nil && json.Unmarshal(e.Data, &p) == nil {
			if s.openExecs == nil {
				s.openExecs = map[string]bool{}
			}
			s.openExecs[p.ExecID] = true
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
func (m *Manager) Get(id string) (Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok {
		return Session{}, m.notFound(id)
	}
	return *s, nil
}

// List returns every session, newest first.
func (m *Manager) List() []Session {
	m.mu.Lock()
	out := make([]Session, 0, len(m.sessions))
	for _, s := range m.sessions {
		out = append(out, *s)
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
	s, err := m.Get(id)
	if err != nil || token == "" {
		return false
	}
	h := hashToken(token)
	ok := false
	for _, want := range s.tokenHashes {
		if subtle.ConstantTimeCompare([]byte(h), []byte(want)) == 1 {
			ok = true
		}
	}
	if ok {
		return true
	}
	// The map's lookup compares the hash, not the token: no timing of
	// the comparison tells anything of a token.
	m.mu.Lock()
	taskID, granted := m.sessions[id].grants[h]
	m.mu.Unlock()
	return granted && m.opts.TaskEnded != nil && !m.opts.TaskEnded(taskID)
}

// AuthorizeAgent reports whether token is session id's exec agent's own:
// no other token of the session (its owner's, a task's) may stand in for
// the agent, which sees every command run in the session.
func (m *Manager) AuthorizeAgent(id, token string) bool {
	s, err := m.Get(id)
	if err != nil || token == "" || s.agentTokenHash == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(hashToken(token)), []byte(s.agentTokenHash)) == 1
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
	s, err := m.Get(id)
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
	b, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	evs, err := m.opts.Store.Append(ctx, streamPrefix+id, eventstore.AnyVersion, eventstore.Proposed{Type: typ, SchemaVersion: task.SchemaVersion, Data: b})
	for _, e := range evs {
		m.apply(e)
	}
	return err
}

// Create starts a session's sandbox and records it. It returns the session
// and its token, which is shown once and stored only hashed.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (Session, string, error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, errdefs.Field(field, fmt.Sprintf(format, args...)))
	}
	rtName := req.Runtime
	if rtName == "" {
		rtName = m.opts.DefaultRuntime
	}
	rt := m.opts.Runtimes[rtName]
	switch why, known := m.opts.Unavailable[rtName]; {
	case !known:
		bad("runtime", "%q is not a runtime (one of: local, gvisor, docker, kubernetes)", clip.String(rtName, 64))
	case why != "" || rt == nil:
		if why == "" {
			why = "not built yet"
		}
		errs = append(errs, &errdefs.FieldError{Field: "runtime", Err: fmt.Errorf("%q is not available: %s: %w", rtName, why, errdefs.ErrFailedPrecondition)})
	}
	image := req.Image
	if task.RunsImages(rtName) {
		if image == "" {
			image = m.opts.Image
		}
		if !task.ImageAllowed(m.opts.AllowedImages, image) {
			errs = append(errs, &errdefs.FieldError{Field: "image", Err: fmt.Errorf("%q is not allowed: it must match one of the allowed images %v: %w", clip.String(image, 64), m.opts.AllowedImages, errdefs.ErrFailedPrecondition)})
		}
	} else if image != "" {
		errs = append(errs, &errdefs.FieldError{Field: "image", Err: fmt.Errorf("the %s runtime runs the host's /usr and takes no image: %w", rtName, errdefs.ErrFailedPrecondition)})
	}
	network := req.Network
	if network == "" {
		network = task.NetworkNone
	}
	switch why, ok := m.opts.Networks[network]; {
	case !ok && network != task.NetworkNone:
		bad("network", "%q is not a network policy (one of: none, allowlist, open)", clip.String(network, 32))
	case why != "":
		errs = append(errs, &errdefs.FieldError{Field: "network", Err: fmt.Errorf("%q is not available: %s: %w", network, why, errdefs.ErrFailedPrecondition)})
	case network != task.NetworkNone && m.opts.Egress == nil:
		errs = append(errs, &errdefs.FieldError{Field: "network", Err: fmt.Errorf("%q needs the egress proxy, which this server does not run: %w", network, errdefs.ErrFailedPrecondition)})
	}
	limits := m.opts.Limits
	if r := req.Resources; r != nil {
		res, err := r.Apply(task.Resources{MemoryBytes: limits.MemoryBytes, CPUMillis: limits.CPUMillis, Pids: limits.Pids})
		errs = append(errs, err)
		limits.MemoryBytes, limits.CPUMillis, limits.Pids = res.MemoryBytes, res.CPUMillis, res.Pids
	}
	idle, life := time.Duration(req.IdleTimeout)*time.Second, time.Duration(req.MaxLifetime)*time.Second
	if idle == 0 {
		idle = m.opts.IdleTimeout
	}
	if life == 0 {
		life = m.opts.MaxLifetime
	}
	if idle < time.Second || idle > m.opts.IdleTimeout {
		bad("idle_timeout", "must be between 1 and %d seconds", int(m.opts.IdleTimeout/time.Second))
	}
	if life < time.Second || life > m.opts.MaxLifetime {
		bad("max_lifetime", "must be between 1 and %d seconds", int(m.opts.MaxLifetime/time.Second))
	}
	for k, v := range req.Labels {
		if len(k) == 0 || len(k) > 63 || len(v) > 255 || strings.ContainsAny(k+v, "\x00\n") || strings.HasPrefix(k, "corral.") {
			bad("labels", "keys of 1 to 63 characters not starting with corral., values of at most 255, no NUL or newline")
			break
		}
	}
	var project workspace.Project
	if req.Workspace != "" {
		pr, err := m.opts.Projects.Resolve(req.Workspace)
		if err != nil {
			errs = append(errs, err)
		} else if err := m.opts.Projects.Check(pr); errors.Is(err, errdefs.ErrNotFound) {
			errs = append(errs, &errdefs.FieldError{Field: "workspace", Err: fmt.Errorf("no workspace %q (POST /api/workspaces): %w", pr.Name, errdefs.ErrFailedPrecondition)})
		} else if err != nil {
			errs = append(errs, &errdefs.FieldError{Field: "workspace", Err: err})
		}
		project, req.Workspace = pr, pr.Name
	}
	if err := errors.Join(errs...); err != nil {
		return Session{}, "", err
	}
	m.mu.Lock()
	n := 0
	for _, s := range m.sessions {
		if s.Status == StatusRunning {
			n++
		}
	}
	m.mu.Unlock()
	if m.opts.MaxSessions > 0 && n >= m.opts.MaxSessions {
		return Session{}, "", fmt.Errorf("%d sessions run already, the limit (sessions.max_sessions); end one first: %w", n, errdefs.ErrResourceExhausted)
	}

	id := idPrefix + ids.New()
	dir := ownDir(id)
	if req.Workspace != "" {
		// A task that just ended holds its workspace until its sandbox is
		// gone, a moment later: wait for that, not for a running writer.
		holder, ok := m.opts.Writers.Acquire(req.Workspace, id)
		for deadline := time.Now().Add(writerWait); !ok && time.Now().Before(deadline) && ctx.Err() == nil; {
			time.Sleep(50 * time.Millisecond)
			holder, ok = m.opts.Writers.Acquire(req.Workspace, id)
		}
		if !ok {
			return Session{}, "", fmt.Errorf("workspace %q is being written by %s; one writer at a time: %w", req.Workspace, holder, errdefs.ErrConflict)
		}
		dir = project.Source()
		if err := m.snapshotGit(id, project); err != nil {
			m.opts.Writers.Release(req.Workspace, id)
			return Session{}, "", err
		}
	} else if err := m.opts.Data.Root().MkdirAll(dir, 0o755); err != nil {
		return Session{}, "", fmt.Errorf("create the session's directory: %w", err)
	} else if m.opts.Quota != nil {
		if err := m.opts.Quota.Limit(ctx, id, dir); err != nil {
			m.log.Warn("the session's directory has the polled quota alone", "session_id", id, "err", err)
		}
	}
	made := false
	defer func() {
		if !made && req.Workspace != "" {
			m.opts.Writers.Release(req.Workspace, id)
		}
	}()
	labels := map[string]string{sandbox.LabelManaged: "true", labelSession: "true"}
	agentToken := newToken()
	spec := sandbox.Spec{
		ID:      id,
		Image:   image,
		Command: []string{workerproto.WorkerBinary, "worker", "session"},
		Dir:     Dir,
		// Its exec agent lives as long as the session: sized for the
		// host's CPUs, it would hold every P's structures all that time.
		Env: []string{workerproto.EnvSessionID + "=" + id, workerproto.EnvSessionToken + "=" + agentToken, workerproto.MaxProcsEnv()},
		Mounts: []sandbox.Mount{
			{Source: dir, Target: Dir, HostDir: req.Workspace != "" && !project.InDataRoot()},
			{Source: workspace.DirShared, Target: workerproto.SharedDir, ReadOnly: true},
			{Source: m.opts.BinDir + "/" + workerproto.CorralName, Target: workerproto.CorralBinary, ReadOnly: true},
			{Source: m.opts.BinDir + "/" + workerproto.WorkerName, Target: workerproto.WorkerBinary, ReadOnly: true},
			{Source: m.opts.SocketDir, Target: workerproto.SocketDir, ReadOnly: true},
		},
		Limits:  limits,
		Network: sandbox.NetworkNone,
		Labels:  labels,
	}
	if network != task.NetworkNone {
		// As for tasks: loopback only in the sandbox, and the agent relays
		// 127.0.0.1:3128 to this session's proxy over a mounted socket.
		hostDir, err := m.opts.Egress.Open(id, network)
		if err != nil {
			return Session{}, "", fmt.Errorf("start the session's egress proxy: %w", err)
		}
		rel, err := filepath.Rel(m.opts.Data.Path(), hostDir)
		if err != nil || !filepath.IsLocal(rel) {
			m.opts.Egress.Close(id)
			return Session{}, "", fmt.Errorf("the egress proxy's directory %s is not in the data root: %w", hostDir, errdefs.ErrFailedPrecondition)
		}
		spec.Network = sandbox.NetworkEgress
		spec.Mounts = append(spec.Mounts, sandbox.Mount{Source: filepath.ToSlash(rel), Target: workerproto.EgressDir, ReadOnly: true})
		spec.Env = append(spec.Env, workerproto.EnvSessionEgress+"=1")
	}
	h, err := rt.Create(ctx, spec)
	if err != nil {
		if network != task.NetworkNone {
			m.opts.Egress.Close(id)
		}
		return Session{}, "", fmt.Errorf("start the session's sandbox: %w", err)
	}
	token := newToken()
	now := m.opts.Now().UTC()
	m.mu.Lock()
	attached := m.attached
	m.mu.Unlock()
	s := Session{ID: id, Runtime: rtName, Image: image, Network: network, Workspace: req.Workspace, Labels: maps.Clone(req.Labels), Status: StatusRunning,
		CreatedAt: now, LastUsedAt: now, IdleTimeout: int(idle / time.Second), MaxLifetime: int(life / time.Second)}
	if err := m.append(ctx, id, EventCreated, created{Session: s, TokenHash: hashToken(token), AgentTokenHash: hashToken(agentToken), Handle: *h}); err != nil {
		rt.Destroy(context.WithoutCancel(ctx), id)
		return Session{}, "", err
	}
	// The agent dials in a few milliseconds after its sandbox starts (more
	// under gVisor). Every command runs through it, inside the sandbox's
	// own view: a session that never gets one is no session.
	if !m.waitAgent(ctx, id, attached, agentWait) {
		m.end(context.WithoutCancel(ctx), id, "agent_not_connected")
		return Session{}, "", fmt.Errorf("the session's exec agent did not connect within %s; the session is ended: %w", agentWait, errdefs.ErrUnavailable)
	}
	m.log.Info("session created", "session_id", id, "runtime", rtName, "image", image)
	made = true
	got, err := m.Get(id)
	return got, token, err
}

// quotaTick is how often Reap looks for session directories due a quota
// check; each is checked as soon as Quota asked.
const quotaTick = 25 * time.Millisecond

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
	for id, s := range m.sessions {
		if s.Status == StatusRunning && s.Workspace == "" {
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
			m.log.Warn("session over its disk quota", "session_id", id, "err", err)
			m.endWith(ctx, id, "disk_quota", err)
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
	for _, s := range m.List() {
		m.mu.Lock()
		gone := m.sessions[s.ID].dirRemoved
		m.mu.Unlock()
		if s.Status != StatusEnded || s.Workspace != "" || gone || s.EndedAt == nil {
			continue
		}
		if s.EndReason != "deleted" && (m.opts.Retention <= 0 || now.Sub(*s.EndedAt) < m.opts.Retention) {
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
	s, err := m.Get(id)
	if err != nil {
		return err
	}
	if s.Status == StatusRunning {
		m.end(ctx, id, "deleted")
	}
	return nil
}

// end destroys a session's sandbox and records its end.
func (m *Manager) end(ctx context.Context, id, reason string) { m.endWith(ctx, id, reason, nil) }

// endWith is end, with the error that ended the session, if any.
func (m *Manager) endWith(ctx context.Context, id, reason string, cause error) {
	s, err := m.Get(id)
	if err != nil || s.Status != StatusRunning {
		return
	}
	if rt := m.opts.Runtimes[s.Runtime]; rt != nil {
		if err := rt.Destroy(ctx, id); err != nil {
			m.log.Warn("cannot destroy a session's sandbox", "session_id", id, "err", err)
		}
	}
	if m.opts.Egress != nil && s.Network != "" && s.Network != task.NetworkNone {
		m.opts.Egress.Close(id)
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

// Exec runs a command in a running session, streaming its output to stdout
// and stderr, and records its start and end. A command still running when
// ctx ends (the client went away) is stopped.
func (m *Manager) Exec(ctx context.Context, id string, req ExecRequest, stdout, stderr io.Writer) (ExecEnd, error) {
	s, err := m.Get(id)
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
	if len(argv) == 0 || argv[0] == "" {
		return ExecEnd{}, errdefs.Field("command", "is required: an argv, or a string run with sh -c")
	}
	dir := req.Dir
	if dir == "" {
		dir = Dir
	}
	if !sandbox.CleanAbs(dir) {
		return ExecEnd{}, errdefs.Field("cwd", "must be an absolute, clean path inside the session")
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
	// restart the agent dials in again: wait for it a while.
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
	if req.TimeoutSeconds < 0 || req.TimeoutSeconds > 24*3600 {
		return service.SessionExecResult{}, errdefs.Field("timeout_seconds", "must be between 0 (none) and 86400")
	}
	if strings.TrimSpace(req.Command) == "" {
		return service.SessionExecResult{}, errdefs.Field("command", "is required: a command run with sh -c")
	}
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

// maxStdin bounds the stdin an exec is given.
const maxStdin = 16 << 20

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
// (already upgraded; r reads from it), replacing any earlier one.
func (m *Manager) AttachAgent(id string, conn net.Conn, r io.Reader) error {
	if err := m.Running(id); err != nil {
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
