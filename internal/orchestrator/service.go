// Package orchestrator holds Corral's use cases — spawn a task, read its
// result, cancel it, follow its logs and events, read and write the shared
// workspace — behind the Service interface that every transport (HTTP, MCP,
// the CLI through httpapi.Client) calls. It also gives the scheduler what it
// needs to build a task's sandbox and to read a finished task's result.
package orchestrator

import (
	"context"
	"io"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workspace"
)

// Service is what a caller can do with Corral. httpapi.Client implements it
// over HTTP, so the CLI and the server share one contract.
//
// Errors are classified with errdefs: ErrInvalidArgument (a FieldError
// naming the field) for bad input, ErrNotFound for unknown ids and paths,
// ErrConflict for an idempotency key reused with other arguments or a
// cancel of an ended task, ErrTooLarge for input over a size limit,
// ErrResourceExhausted when the queue is full.
type Service interface {
	// Spawn validates req, prepares the task directory and queues the task.
	// With an idempotency key it returns the task already spawned with that
	// key (existing=true) instead of a second one.
	Spawn(ctx context.Context, req SpawnRequest) (t task.Task, existing bool, err error)
	// Get returns a task as projected from its events.
	Get(ctx context.Context, id string) (task.Task, error)
	// List returns tasks newest first, a page at a time.
	List(ctx context.Context, req ListRequest) (ListPage, error)
	// Result returns a task's result, waiting up to req.Wait for it to end.
	Result(ctx context.Context, req ResultRequest) (Result, error)
	// Cancel stops a task in any non-terminal state.
	Cancel(ctx context.Context, id string) (task.Task, error)
	// Logs writes a task's transcript to w; with follow it keeps writing
	// until the task ends.
	Logs(ctx context.Context, req LogsRequest, w io.Writer) error
	// Events calls fn with each event after req.After (an event id), of one
	// task or of all; with follow it waits for new ones until ctx is done.
	Events(ctx context.Context, req EventsRequest, fn func(eventstore.Event) error) error
	// ListWorkspace lists a directory of shared/.
	ListWorkspace(ctx context.Context, path string, recursive bool) ([]workspace.Entry, error)
	// ReadWorkspace reads a file of shared/, up to the read limit.
	ReadWorkspace(ctx context.Context, path string) (File, error)
	// WriteWorkspace writes a file of shared/ atomically.
	WriteWorkspace(ctx context.Context, path string, content []byte) (workspace.Entry, error)
	// UploadAttachments stores files as attachments, streaming each. next
	// returns the files in turn and io.EOF after the last. All or none: if
	// one file fails (empty, over the per-file limit, a read error), none is
	// kept and no event is recorded.
	UploadAttachments(ctx context.Context, next func() (name string, content io.Reader, err error)) ([]Attachment, error)
	// OpenAttachment returns an attachment and its content; the caller
	// closes it. ErrNotFound for an unknown id.
	OpenAttachment(ctx context.Context, id string) (Attachment, io.ReadCloser, error)
	// CreateAttachmentFromWorkspace makes an attachment of a task's output
	// file or a shared file (create_attachment_from_workspace).
	CreateAttachmentFromWorkspace(ctx context.Context, req CreateAttachmentRequest) (Attachment, error)
	// GC removes ended tasks' directories and unused attachments past their
	// retention; with req.DryRun it only reports what would go.
	GC(ctx context.Context, req GCRequest) (GCReport, error)
	// IngestDocument copies a workspace file into documents/ and indexes it
	// (ingest_from_workspace), or stores a note pushed with its content.
	IngestDocument(ctx context.Context, req IngestRequest) (Document, error)
	// SearchDocuments searches documents and notes, best match first.
	SearchDocuments(ctx context.Context, req SearchRequest) (SearchResult, error)
	// ExportNotes writes the notes matching a query as Markdown files under
	// shared/ (export_notes_to_workspace).
	ExportNotes(ctx context.Context, req ExportNotesRequest) (ExportNotesResult, error)
	// ListSkills lists the skills in shared/skills/, by name; a skill whose
	// SKILL.md does not parse is listed with its error.
	ListSkills(ctx context.Context) ([]SkillInfo, error)
	// GetSkill returns a skill's SKILL.md and its files; ErrNotFound for an
	// unknown name.
	GetSkill(ctx context.Context, name string) (SkillDetail, error)
	// CreateSkill writes shared/skills/<name>/ from a SKILL.md (or its
	// fields) and optionally a finished task's output files. A name taken
	// is ErrAlreadyExists; nothing is written on any error.
	CreateSkill(ctx context.Context, req CreateSkillRequest) (SkillDetail, error)
}

// SpawnRequest holds the spawn_worker arguments (seed 000 plus SPEC §2).
//
// SharedFiles is seed use case 3's name for ContextFiles: both name files
// of shared/ to copy into context/ and are taken as one list. AttachmentIDs
// are copied into context/ under their original names. SaveToShared copies
// a successful task's outputs to shared/outputs/YYYY-MM/<task-id>/, and its
// scripts also to shared/scripts/.
type SpawnRequest struct {
	TaskDescription string            `json:"task_description"`
	ContextFiles    []string          `json:"context_files,omitempty"`
	SharedFiles     []string          `json:"shared_files,omitempty"`
	AttachmentIDs   []string          `json:"attachment_ids,omitempty"`
	SaveToShared    bool              `json:"save_to_shared,omitempty"`
	DocumentIDs     []string          `json:"document_ids,omitempty"`
	NoteQuery       string            `json:"note_query,omitempty"`
	Model           string            `json:"model,omitempty"`
	Agent           string            `json:"agent,omitempty"`
	Command         []string          `json:"command,omitempty"`
	TimeoutMinutes  int               `json:"timeout_minutes,omitempty"`
	Runtime         string            `json:"runtime,omitempty"`
	Image           string            `json:"image,omitempty"`
	Network         string            `json:"network,omitempty"`
	Resources       *ResourceRequest  `json:"resources,omitempty"`
	ConversationID  string            `json:"conversation_id,omitempty"`
	InterfaceType   string            `json:"interface_type,omitempty"`
	UserName        string            `json:"user_name,omitempty"`
	Labels          map[string]string `json:"labels,omitempty"`
	IdempotencyKey  string            `json:"idempotency_key,omitempty"`
	// FollowUpOf continues an ended task: its output is copied into
	// context/previous/, and the agent's session resumes where the agent
	// supports it (Claude Code's --resume).
	FollowUpOf string `json:"follow_up_of,omitempty"`
}

// ResourceRequest overrides the configured sandbox limits for one task, in
// the configuration's units ("2Gi", "500m").
type ResourceRequest struct {
	MemoryLimit string `json:"memory_limit,omitempty"`
	CPULimit    string `json:"cpu_limit,omitempty"`
	PidsLimit   int64  `json:"pids_limit,omitempty"`
}

// ListRequest filters and pages List.
type ListRequest struct {
	Status         string `json:"status,omitempty"`
	ConversationID string `json:"conversation_id,omitempty"`
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
// contents of some of its output files.
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
	// Stream is "agent" (the agent's stdout or JSON transcript, the default)
	// or "stderr".
	Stream string
}

// EventsRequest selects events.
type EventsRequest struct {
	TaskID string // empty for every stream
	After  string // an event id; empty for the beginning
	Follow bool
}
