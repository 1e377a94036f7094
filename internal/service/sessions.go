package service

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/task"
)

// Sessions is the session contract (seed 003): long-lived sandboxes on a
// chosen runtime and image in which callers run commands, streaming their
// output. The session manager (internal/session) implements it, and
// SessionGate; httpapi.Client.Sessions over HTTP. The transports reach
// sessions only through them.
type Sessions interface {
	// Create starts a session's sandbox and records it; it returns the
	// session and its token, which alone runs commands in it.
	Create(ctx context.Context, req CreateSessionRequest) (Session, string, error)
	// Get returns a session; List every one, newest first.
	Get(ctx context.Context, id string) (Session, error)
	List(ctx context.Context) ([]Session, error)
	// Delete ends a session and destroys its sandbox.
	Delete(ctx context.Context, id string) error
	// Exec runs a command in a running session, streaming its output to
	// stdout and stderr, and records its start and end; a command still
	// running when ctx ends is stopped.
	Exec(ctx context.Context, id string, req SessionCommand, stdout, stderr io.Writer) (SessionExecEnd, error)
	// StartExec starts a command in a running session and returns its
	// exec id at once; the command runs on whatever becomes of the caller,
	// its output kept (ReadExec) and its start and end recorded.
	StartExec(ctx context.Context, id string, req SessionCommand) (string, error)
	// ReadExec calls fn with exec execID's output from byte offset from
	// on; with follow it waits for more until the command has ended. It
	// returns the end, nil while the command runs.
	ReadExec(ctx context.Context, id, execID string, from int64, follow bool, fn func(ExecOutput) error) (*SessionExecEnd, error)
	// KillExec ends a running command of the session.
	KillExec(ctx context.Context, id, execID string) error
	// Suspend stops a running session's sandbox and keeps the rest for
	// Resume, saying what it kept; Resume starts it again (a command on a
	// suspended session resumes it first).
	Suspend(ctx context.Context, id string) (SessionSuspend, error)
	Resume(ctx context.Context, id string) (Session, error)
	// Fork makes count new sessions, each with its own id, token and
	// egress proxy, from a copy of session id's files and, where its
	// runtime forks a sandbox's memory, its memory and processes.
	Fork(ctx context.Context, id string, count int) (SessionFork, error)
	// History is a page of session id's lifecycle, oldest first: its
	// creation, suspends, resumes, forks, network changes, adoptions and
	// end, and each command's start (exec_started, with the command) and
	// end (exec_ended, with its exit code); the latest req.Limit events
	// before req.Before.
	History(ctx context.Context, req SessionHistoryRequest) (SessionHistory, error)
	// SetNetwork changes a running session's network policy, as
	// Tasks.SetNetwork does a task's (req.TaskID unused).
	SetNetwork(ctx context.Context, id string, req NetworkRequest) (Session, error)
	// ExecBounded runs workspace_exec's command and returns its end with
	// at most max bytes of each stream; onOutput, when not nil, gets every
	// chunk as it comes.
	ExecBounded(ctx context.Context, req SessionExecRequest, max int, onOutput func(stream string, data []byte)) (SessionExecResult, error)
}

// ErrSessionsOff answers a use of sessions where a Set has none.
var ErrSessionsOff = fmt.Errorf("sessions are not served here: %w", errdefs.ErrNotImplemented)

// SessionGate is what the server that serves sessions needs beside their
// use cases: which token may do what, and the exec agents' connections.
// The session manager implements it; a client has no part of it.
type SessionGate interface {
	// Authorize reports whether token may run commands in session id;
	// AuthorizeAgent whether it is the session's exec agent's own.
	Authorize(id, token string) bool
	AuthorizeAgent(id, token string) bool
	// AttachAgent takes the connection session id's exec agent dialled in
	// on, which upgrade hands over (answering its request with 101; r
	// reads from it) once the agent is let in; refused, the agent is
	// answered with the error and upgrade is not called. hostSocket says
	// the agent dialled a unix socket (from a sandbox of this host), not
	// TCP.
	AttachAgent(ctx context.Context, id string, hostSocket bool, upgrade func() (conn net.Conn, r io.Reader, err error)) error
	// Forward returns the API address of the other server of the cluster
	// that runs session id (holding its exec agent), if another does: its
	// commands go there.
	Forward(id string) (url string, ok bool)
}

// CreateSessionRequest is POST /api/sessions.
type CreateSessionRequest struct {
	Image   string            `json:"image,omitempty"`
	Runtime string            `json:"runtime,omitempty"`
	Network string            `json:"network,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	// Workspace, when set, is a named workspace (projects/<name>/) the
	// session works in, read-write at SessionDir, instead of a directory of its
	// own. The session is its one writer while it runs: creating one while
	// a task or another session writes it is a conflict.
	Workspace string `json:"workspace,omitempty"`
	// Resources override the configured sandbox limits, in the
	// configuration's units ("2Gi", "500m"), as spawn_worker's do.
	Resources *ResourceRequest `json:"resources,omitempty"`
	// IdleTimeout and MaxLifetime are in seconds.
	IdleTimeout int `json:"idle_timeout,omitempty"`
	MaxLifetime int `json:"max_lifetime,omitempty"`
}

// Session is a session's current state.
type Session struct {
	ID      string `json:"session_id"`
	Runtime string `json:"runtime"`
	Image   string `json:"image,omitempty"`
	Network string `json:"network"`
	// NetworkAllow, when set, is the session's own egress allowlist in the
	// place of the server's (PATCH /api/sessions/{id}/network).
	NetworkAllow []string `json:"network_allow"`
	Workspace    string   `json:"workspace,omitempty"`
	// Resources are the sandbox's limits (sessions made before 2026-11-29
	// have none recorded).
	Resources *task.Resources   `json:"resources,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Status    string            `json:"status"` // running | suspended | ended
	// ForkedFrom is the session this one is a fork of.
	ForkedFrom string `json:"forked_from,omitempty"`
	// MemoryKept, while suspended: a resume brings its processes and
	// memory back, not only its files.
	MemoryKept  bool       `json:"memory_kept,omitempty"`
	EndReason   string     `json:"end_reason,omitempty"`
	EndError    string     `json:"end_error,omitempty"` // what ended it, for a person, when it failed
	CreatedAt   time.Time  `json:"created_at"`
	LastUsedAt  time.Time  `json:"last_used_at"`
	EndedAt     *time.Time `json:"ended_at,omitempty"`
	Execs       int        `json:"execs"`
	IdleTimeout int        `json:"idle_timeout"`
	MaxLifetime int        `json:"max_lifetime"`
}

// SessionSuspend answers a suspend: the session, and whether its
// processes and memory come back with a resume (false: its files only),
// said in Note.
type SessionSuspend struct {
	Session    Session `json:"session"`
	MemoryKept bool    `json:"memory_kept"`
	Note       string  `json:"note"`
}

// SessionFork answers a fork: the new sessions with their tokens (shown
// once), what was copied, and whether the source's processes and memory
// came with it (false: its files only), said in Note.
type SessionFork struct {
	Forks      []SessionCreated `json:"forks"`
	Files      int              `json:"files"`
	Bytes      int64            `json:"bytes"`
	Skipped    []string         `json:"skipped,omitempty"`
	MemoryKept bool             `json:"memory_kept"`
	Note       string           `json:"note"`
	// PausedSeconds is how long a running source was stopped for the
	// snapshot its forks' memory came from.
	PausedSeconds float64 `json:"paused_seconds,omitempty"`
}

// SessionEvent is one step of a session's lifecycle: its type (the
// event's, session_suspended say), when, and what the event says of it
// (tokens' hashes and sandbox handles left out).
type SessionEvent struct {
	// Seq is the event's place in the session's stream: a page's cursor.
	Seq    int64          `json:"seq"`
	Type   string         `json:"type"`
	At     time.Time      `json:"at"`
	Detail map[string]any `json:"detail,omitempty"`
}

// History's page sizes: the default and the most one answer holds.
const (
	SessionHistoryLimit    = 200
	SessionHistoryMaxLimit = 1000
)

// SessionHistoryRequest asks for a page of a session's history: the
// latest Limit events (0: SessionHistoryLimit) whose Seq is below Before
// (0: the latest of all).
type SessionHistoryRequest struct {
	ID     string
	Before int64
	Limit  int
}

// SessionHistory is a page of a session's history, oldest first. Before,
// when not 0, is the cursor of the page of older events.
type SessionHistory struct {
	Events []SessionEvent `json:"events"`
	Before int64          `json:"before,omitempty"`
}

// SessionCreated is a session made, with its token: shown once.
type SessionCreated struct {
	SessionID string  `json:"session_id"`
	Token     string  `json:"token"`
	Session   Session `json:"session"`
}

// A session's statuses.
const (
	SessionRunning   = "running"
	SessionSuspended = "suspended"
	SessionEnded     = "ended"
)

// SessionTokenPrefix starts every session token, so the API can tell one used
// out of its session (403) from a wrong token (401).
const SessionTokenPrefix = "sess_"

// SessionDir is where a session's sandbox starts, its own read-write directory
// (sessions/<id>/ in the data root); shared/ is read-only beside it.
const SessionDir = "/workspace/session"

// SessionCommand is a command to run in a session.
type SessionCommand struct {
	// Command is the argv, or, with Shell, one string run with sh -c.
	Command []string `json:"-"`
	Shell   string   `json:"-"`
	Dir     string   `json:"cwd,omitempty"`
	Env     []string `json:"-"`
	Stdin   io.Reader
	// Timeout bounds the command; 0: none (Exec: until its caller goes
	// away).
	Timeout time.Duration
}

// ExecOutput is a part of an exec's output from byte Offset of the whole
// (stdout and stderr in the order they came): Data of Stream "stdout" or
// "stderr", or, for Stream "gap", Bytes the server does not have (output
// past its limit, or lost while no server took it).
type ExecOutput struct {
	Stream string
	Offset int64
	Data   []byte
	Bytes  int64
}

// SessionExecEnd is exec_ended's payload and an exec's answer.
type SessionExecEnd struct {
	ExecID      string `json:"exec_id"`
	ExitCode    int    `json:"exit_code"`
	DurationMS  int64  `json:"duration_ms"`
	StdoutBytes int64  `json:"stdout_bytes"`
	StderrBytes int64  `json:"stderr_bytes"`
	Error       string `json:"error,omitempty"`
	// Reason is "lost" for an exec whose end no server saw: its command
	// was gone when a server next reached the session's agent (the
	// session ended, or the sandbox restarted).
	Reason string `json:"reason,omitempty"`
	// GapBytes are the bytes of its output the server does not have
	// (past the exec's limit, or lost while no server took them).
	GapBytes int64 `json:"gap_bytes,omitempty"`
}
