// Package task is Corral's domain model: a task's specification, its status
// state machine, the events that change it and the fold that turns those
// events into the task's current state. It performs no I/O.
//
// Status moves only forward:
//
//	pending → queued → starting → running → success | failed | timeout | cancelled
//
// Any non-terminal status may also go straight to a terminal one (a queued
// task is cancelled, a starting task fails).
package task

import (
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/clip"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/ids"
)

// Status is where a task is in its lifecycle.
type Status string

// The statuses, in lifecycle order.
const (
	Pending   Status = "pending"
	Queued    Status = "queued"
	Starting  Status = "starting"
	Running   Status = "running"
	Success   Status = "success"
	Failed    Status = "failed"
	Timeout   Status = "timeout"
	Cancelled Status = "cancelled"
)

var rank = map[Status]int{Pending: 0, Queued: 1, Starting: 2, Running: 3, Success: 4, Failed: 4, Timeout: 4, Cancelled: 4}

// Terminal reports whether s is one of the final statuses.
func (s Status) Terminal() bool { return rank[s] == 4 }

// Valid reports whether s is a known status.
func (s Status) Valid() bool { _, ok := rank[s]; return ok }

// CanMoveTo reports whether a task in status s may move to next.
func (s Status) CanMoveTo(next Status) bool {
	if !s.Valid() || !next.Valid() || s.Terminal() {
		return false
	}
	return rank[next] > rank[s]
}

// Agents Corral knows.
const (
	AgentClaude   = "claude"
	AgentGemini   = "gemini"
	AgentCodex    = "codex"
	AgentOpencode = "opencode"
	AgentCommand  = "command"
)

// KnownAgent reports whether name is an agent Corral has an adapter for.
func KnownAgent(name string) bool {
	switch name {
	case AgentClaude, AgentGemini, AgentCodex, AgentOpencode, AgentCommand:
		return true
	}
	return false
}

// Network policies for a worker.
const (
	NetworkNone      = "none"
	NetworkAllowlist = "allowlist"
	NetworkOpen      = "open"
)

// MinPids is the smallest pids limit a sandbox may have. The limit counts
// every process and thread in it: the runtime's own (bwrap's, docker-init)
// and the worker's threads take about 16, and the worker keeps threads in
// reserve so that an agent spending the rest cannot leave it without one.
const MinPids = 32

// MinPidsReason says, in an error about a pids limit, why MinPids.
const MinPidsReason = "the sandbox's own processes and the worker's threads take about 16"

// Resources are the limits of one worker's sandbox. Zero means the
// configured default.
type Resources struct {
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	CPUMillis   int64 `json:"cpu_millis,omitempty"`
	Pids        int64 `json:"pids,omitempty"`
}

// Origin says who asked for a task, so the result can be reported back to
// the conversation that asked (seed 000 worker_tasks, seed 002 reportToParent).
type Origin struct {
	ConversationID string `json:"conversation_id,omitempty"`
	InterfaceType  string `json:"interface_type,omitempty"`
	UserName       string `json:"user_name,omitempty"`
	// OriginWorkspace and OriginConversation are where a workspace task
	// was asked from (seed 002): its end is reported on the origin
	// conversation's stream (OriginConversation, else ConversationID).
	OriginWorkspace    string `json:"origin_workspace,omitempty"`
	OriginConversation string `json:"origin_conversation,omitempty"`
}

// ReportConversation is the conversation a workspace task's end is
// reported to, "" for none.
func (o Origin) ReportConversation() string {
	if o.OriginConversation != "" {
		return o.OriginConversation
	}
	return o.ConversationID
}

// ConversationStreamID is conversation id's event stream, where workspace
// tasks report.
func ConversationStreamID(id string) string { return "conversation/" + id }

// Spec is what a task was asked to do; it never changes after the task is
// created, but for its network policy (Network, NetworkAllow), which
// EventNetworkChanged changes while it runs.
type Spec struct {
	// Kind is "" for a worker task and KindExec for a code_execute call.
	Kind           string   `json:"kind,omitempty"`
	Description    string   `json:"task_description"`
	ContextFiles   []string `json:"context_files,omitempty"`
	AttachmentIDs  []string `json:"attachment_ids,omitempty"`
	Agent          string   `json:"agent"`
	Model          string   `json:"model,omitempty"`
	Command        []string `json:"command,omitempty"`
	TimeoutMinutes int      `json:"timeout_minutes"`
	// TimeoutSeconds, when set, is the wall-clock limit instead of
	// TimeoutMinutes (code_execute counts in seconds).
	TimeoutSeconds int    `json:"timeout_seconds,omitempty"`
	Runtime        string `json:"runtime"`
	Image          string `json:"image,omitempty"`
	Network        string `json:"network"`
	// NetworkAllow, when set (even empty), is the task's own egress
	// allowlist, in the place of the server's egress.allow; null, the
	// server's.
	NetworkAllow []string `json:"network_allow"`
	// Credentials name the egress credential rules given on request
	// (egress.credentials with on_request) that the task asked for.
	Credentials    []string          `json:"credentials,omitempty"`
	Resources      Resources         `json:"resources"`
	SaveToShared   bool              `json:"save_to_shared,omitempty"`
	DocumentIDs    []string          `json:"document_ids,omitempty"` // copied into context/
	NoteQuery      string            `json:"note_query,omitempty"`   // notes it finds go to context/notes/
	NoteIDs        []string          `json:"note_ids,omitempty"`     // the notes it found, set at spawn
	Labels         map[string]string `json:"labels,omitempty"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	// FollowUpOf is the task this one continues: its output is copied into
	// context/ and, for agents that can, its agent session resumed.
	FollowUpOf string `json:"follow_up_of,omitempty"`
	// ExecSession is the session the agent runs its commands in
	// (spawn_worker's session_id; Task.SessionID is the agent's own).
	ExecSession string `json:"exec_session_id,omitempty"`
	// Workspace is the named workspace (projects/<name>/) the agent works
	// in; tasks on one workspace run one at a time.
	Workspace string `json:"workspace,omitempty"`
	Origin
}

// KindExec is the Kind of a code_execute call: a command run once, its
// output returned.
const KindExec = "exec"

// Timeout returns the task's wall-clock limit.
func (s Spec) Timeout() time.Duration {
	if s.TimeoutSeconds > 0 {
		return time.Duration(s.TimeoutSeconds) * time.Second
	}
	return time.Duration(s.TimeoutMinutes) * time.Minute
}

// OutputFile is one file a worker produced.
type OutputFile struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
	Type string `json:"type"`
}

// Task is a task's current state, folded from its events. It is a value:
// copies are independent except for the slices and maps they share, which
// are never modified after an event sets them.
type Task struct {
	ID      string `json:"task_id"`
	Spec    `json:""`
	Status  Status `json:"status"`
	Version int64  `json:"version"`
	// CorrelationID is shared by every event the task brings about; it is
	// the request's (X-Correlation-ID) or a new one.
	CorrelationID string `json:"correlation_id,omitempty"`
	// LastEventID is the id of the task's latest event: what the next one
	// is caused by, unless a request causes it.
	LastEventID string `json:"-"`
	// PromptSHA256 is Created's: what the task's prompt.md must be for it
	// to start ("" for a task created before it was recorded).
	PromptSHA256 string `json:"-"`

	// Replica is the server (cluster.Replica) that starts and watches the
	// task from its start (Starting) until another adopts it (Adopted):
	// "" for a task that has not started, or that started before
	// replicas were recorded.
	Replica     string          `json:"replica,omitempty"`
	SandboxName string          `json:"sandbox_name,omitempty"`
	Handle      json.RawMessage `json:"-"`
	CreatedAt   time.Time       `json:"created_at"`
	UpdatedAt   time.Time       `json:"updated_at"`
	QueuedAt    *time.Time      `json:"queued_at,omitempty"`
	StartedAt   *time.Time      `json:"started_at,omitempty"`
	CompletedAt *time.Time      `json:"completed_at,omitempty"`
	// DurationSeconds is the run time in whole seconds (rounded), an
	// integer as in the seed's payloads; DurationMS the same in
	// milliseconds. Both are set when the task ended after it started.
	DurationSeconds *int64       `json:"duration_seconds,omitempty"`
	DurationMS      *int64       `json:"duration_ms,omitempty"`
	ExitCode        *int         `json:"exit_code,omitempty"`
	OutputFiles     []OutputFile `json:"output_files,omitempty"`
	// OutputFilesTotal and OutputFilesNote are set when OutputFiles lists
	// only some of the output (MaxOutputFiles): how many files there are,
	// and a sentence saying so for whoever reads the result.
	OutputFilesTotal int    `json:"output_files_total,omitempty"`
	OutputFilesNote  string `json:"output_files_note,omitempty"`
	Summary          string `json:"summary,omitempty"`
	ErrorMessage     string `json:"error_message,omitempty"`
	CancelRequested  bool   `json:"cancel_requested,omitempty"`
	LogsTruncated    bool   `json:"logs_truncated,omitempty"`
	// SessionID is the agent's session id, which a follow-up resumes.
	SessionID string `json:"session_id,omitempty"`
	// Usage and CostUSD are what the agent reported it used.
	Usage   *Usage  `json:"usage,omitempty"`
	CostUSD float64 `json:"cost_usd,omitempty"`
	// Changes is what a task in a git workspace changed there.
	Changes *Changes `json:"changes,omitempty"`
	// WorkspaceGit is what a workspace task left in the repository that
	// git runs as the workspace's owner (hooks, configuration), once its
	// sandbox is gone; nil when nothing.
	WorkspaceGit *WorkspaceGit `json:"workspace_git,omitempty"`
	// SharedOutputs is what became of the outputs of a task that asked
	// save_to_shared and succeeded: they are copied after its end, so
	// it says "pending" from the end until the copy's event.
	SharedOutputs *SharedOutputs `json:"shared_outputs,omitempty"`
	// QueueSeq orders queued tasks: the store position of the queued event.
	QueueSeq int64 `json:"-"`
	// Compactable counts the task's events that retention removes once it
	// has ended long enough (CompactedTypes, but EventCompacted): none
	// left, retention passes the task by.
	Compactable int64 `json:"-"`
}

// SaveState is where a task's save_to_shared copy stands.
type SaveState string

// The states of SharedOutputs.
const (
	// SavePending: the task has ended; its outputs are not copied yet
	// (queued behind other copies, being copied, or interrupted by a
	// crash and to be done again at the next start).
	SavePending SaveState = "pending"
	// SaveSaved: outputs_saved is recorded; the files are in Directory.
	SaveSaved SaveState = "saved"
	// SaveFailed: outputs_save_failed is recorded; Error says why.
	SaveFailed SaveState = "failed"
)

// SharedOutputs is Task.SharedOutputs, folded from the task's end and its
// outputs_saved or outputs_save_failed event (which carries the list of
// files). It is never changed once set: a new event sets a new one.
type SharedOutputs struct {
	State SaveState `json:"state"`
	// Directory is shared/outputs/YYYY-MM/<task-id>, once the copy's
	// event is recorded.
	Directory string `json:"directory,omitempty"`
	// Error says why the copy failed.
	Error string `json:"error,omitempty"`
	// After is the id of the event the copy follows, the task's end: the
	// copy's event is caused by it.
	After string `json:"-"`
}

// SavePending reports whether t ended with its save_to_shared copy still
// to be done.
func (t *Task) SavePending() bool {
	return t.SharedOutputs != nil && t.SharedOutputs.State == SavePending
}

const idPrefix = "task-"

// NewID returns a new sortable task id.
func NewID() string { return idPrefix + ids.New() }

// ValidID reports whether id is well formed: "task-" and an id from ids.New.
func ValidID(id string) bool {
	rest, ok := strings.CutPrefix(id, idPrefix)
	return ok && ids.Valid(rest)
}

// CheckID returns an ErrInvalidArgument naming field if id is malformed.
func CheckID(id string) error {
	if !ValidID(id) {
		return errdefs.Field("task_id", fmt.Sprintf("%q is not a task id (want task- and 26 lowercase letters or digits)", clip.String(id, 64)))
	}
	return nil
}

// StreamID returns the event stream that holds a task's events.
func StreamID(id string) string { return "task/" + id }

// IDFromStream returns the task id of a task stream, or "" for other streams.
func IDFromStream(stream string) string {
	id, ok := strings.CutPrefix(stream, "task/")
	if !ok {
		return ""
	}
	return id
}

// ImageAllowed reports whether image matches one of patterns (path.Match
// globs such as "python:*"); no patterns allow any image.
func ImageAllowed(patterns []string, image string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if ok, _ := path.Match(p, image); ok {
			return true
		}
	}
	return false
}
