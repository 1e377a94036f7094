package service

import (
	"errors"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/units"
)

// SpawnRequest holds the spawn_worker arguments (seed 000 plus SPEC §2).
//
// SharedFiles is seed use case 3's name for ContextFiles: both name files
// of shared/ to copy into context/ and are taken as one list. AttachmentIDs
// are copied into context/ under their original names. SaveToShared copies
// a successful task's outputs to shared/outputs/YYYY-MM/<task-id>/, and its
// scripts also to shared/scripts/, after its end (the task's
// shared_outputs says "pending" until outputs_saved or
// outputs_save_failed is recorded).
type SpawnRequest struct {
	TaskDescription string   `json:"task_description"`
	ContextFiles    []string `json:"context_files,omitempty"`
	SharedFiles     []string `json:"shared_files,omitempty"`
	AttachmentIDs   []string `json:"attachment_ids,omitempty"`
	SaveToShared    bool     `json:"save_to_shared,omitempty"`
	DocumentIDs     []string `json:"document_ids,omitempty"`
	NoteQuery       string   `json:"note_query,omitempty"`
	Model           string   `json:"model,omitempty"`
	Agent           string   `json:"agent,omitempty"`
	Command         []string `json:"command,omitempty"`
	// TimeoutMinutes is the task's limit; nil: the server's default.
	TimeoutMinutes *int   `json:"timeout_minutes,omitempty"`
	Runtime        string `json:"runtime,omitempty"`
	Image          string `json:"image,omitempty"`
	Network        string `json:"network,omitempty"`
	// NetworkAllow is the task's own egress allowlist in the place of the
	// server's: within it, unless egress.task_hosts is "add".
	NetworkAllow []string `json:"network_allow"`
	// Credentials name egress credential rules given on request
	// (egress.credentials with on_request) for the task's HTTPS requests.
	Credentials    []string          `json:"credentials,omitempty"`
	Resources      *ResourceRequest  `json:"resources,omitempty"`
	ConversationID string            `json:"conversation_id,omitempty"`
	InterfaceType  string            `json:"interface_type,omitempty"`
	UserName       string            `json:"user_name,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	// FollowUpOf continues an ended task: its output is copied into
	// context/previous/, and the agent's session resumes where the agent
	// supports it (Claude Code's --resume).
	FollowUpOf string `json:"follow_up_of,omitempty"`
	// SessionID runs the agent's commands in that session: its own shell
	// tool is off, and a workspace_exec tool bound to the session is its
	// way to run anything (claude only).
	SessionID string `json:"session_id,omitempty"`
	// Workspace runs the agent in a named workspace (projects/<name>/,
	// POST /api/workspaces), read-write as its working directory; tasks on
	// one workspace run one at a time.
	Workspace string `json:"workspace,omitempty"`
	// OriginWorkspace and OriginConversation say where a workspace task
	// was asked from; its end is reported to that conversation.
	OriginWorkspace    string `json:"origin_workspace,omitempty"`
	OriginConversation string `json:"origin_conversation,omitempty"`
}

// ResourceRequest overrides the configured sandbox limits for one task, in
// the configuration's units ("2Gi", "500m").
type ResourceRequest struct {
	MemoryLimit string `json:"memory_limit,omitempty"`
	CPULimit    string `json:"cpu_limit,omitempty"`
	PidsLimit   int64  `json:"pids_limit,omitempty"`
}

// Apply returns base with the limits r gives, or every problem with them
// as errdefs.FieldErrors joined.
func (r *ResourceRequest) Apply(base task.Resources) (task.Resources, error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, errdefs.Field(field, fmt.Sprintf(format, args...)))
	}
	if r.MemoryLimit != "" {
		n, err := units.ParseSize(r.MemoryLimit)
		if err != nil || n < 16<<20 {
			bad("resources.memory_limit", "must be a size of at least 16Mi (e.g. 512Mi, 2Gi), got %q", clip.String(r.MemoryLimit, 32))
		}
		base.MemoryBytes = n
	}
	if r.CPULimit != "" {
		n, err := units.ParseCPU(r.CPULimit)
		if err != nil || n < 10 {
			bad("resources.cpu_limit", "must be a CPU amount of at least 10m (e.g. 2, 0.5, 500m), got %q", clip.String(r.CPULimit, 32))
		}
		base.CPUMillis = n
	}
	if r.PidsLimit != 0 {
		if r.PidsLimit < task.MinPids || r.PidsLimit > 1<<20 {
			bad("resources.pids_limit", "must be between %d and 1048576 (%s), got %d", task.MinPids, task.MinPidsReason, r.PidsLimit)
		}
		base.Pids = r.PidsLimit
	}
	return base, errors.Join(errs...)
}

// ListRequest filters and pages List.
type ListRequest struct {
	Status         string `json:"status,omitempty"`
	ConversationID string `json:"conversation_id,omitempty"`
	Workspace      string `json:"workspace,omitempty"`
	Limit          int    `json:"limit,omitempty"`
	Cursor         string `json:"cursor,omitempty"`
}

// ListPage is one page of tasks; NextCursor is empty on the last page.
type ListPage struct {
	Tasks      []task.Task `json:"tasks"`
	NextCursor string      `json:"next_cursor,omitempty"`
}

// ResultRequest asks for a task's result.
type ResultRequest struct {
	TaskID string `json:"task_id"`
	// Wait long-polls up to this long for the task to end.
	Wait time.Duration `json:"-"`
	// IncludeFileContents names output files whose content to include.
	IncludeFileContents []string `json:"include_file_contents,omitempty"`
}

// Result is read_task_result's answer: the task and, when asked, the
// contents of some of its output files. Done is set at the task's end,
// which does not wait for save_to_shared's copy: until the copy's event,
// the task's SharedOutputs says "pending".
type Result struct {
	task.Task
	Done         bool            `json:"done"`
	FileContents map[string]File `json:"file_contents,omitempty"`
}

// File is a file's content as returned to a caller: text as is, anything
// else base64-encoded, cut at the read limit.
type File struct {
	Path      string `json:"path"`
	Size      int64  `json:"size"`
	Type      string `json:"type"`
	Encoding  string `json:"encoding"` // "utf-8" or "base64"
	Content   string `json:"content"`
	Truncated bool   `json:"truncated,omitempty"`
	Note      string `json:"note,omitempty"`
}

// LogsRequest asks for a task's transcript.
type LogsRequest struct {
	TaskID string
	Follow bool
	// Stream is "agent" (the agent's stdout or JSON transcript, the default),
	// "stderr", or "prompt" (prompt.md, as the worker reads it).
	Stream string
}

// EventsRequest selects events.
type EventsRequest struct {
	TaskID string // empty for every stream
	// ConversationID selects the conversation's stream instead, where
	// workspace tasks report their ends.
	ConversationID string
	// After is an event id, AfterNow for only the events recorded from
	// now on, or empty for the beginning.
	After  string
	Follow bool
}

// AfterNow is the EventsRequest.After that skips the events the server's
// current state already reflects (its task list's position in the log): a
// live view that reads the state follows the changes from there without
// replaying the whole log.
const AfterNow = "now"

// NetworkRequest is PATCH /api/tasks/{id}/network: the network policy of a
// task that has not ended, from now on. Allow, when set, is the task's own
// allowlist; absent, the server's. A task that started with network none
// has no way to the proxy: it stays none.
type NetworkRequest struct {
	TaskID  string   `json:"-"`
	Network string   `json:"network"`
	Allow   []string `json:"allow"`
}
