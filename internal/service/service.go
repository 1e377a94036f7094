// Package service is Corral's service contract: the use cases every
// transport offers, one interface per domain (Tasks, Library, Sessions,
// gathered in a Set), and their request and answer types. The
// orchestrator, the library and the session manager implement them in
// process and httpapi.Client over HTTP; the HTTP API, the tools catalogue,
// the MCP server and the CLI are written against them, and servicetest
// checks that both implementations answer alike.
package service

import (
	"context"
	"io"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workspace"
)

// Set is Corral's use cases, one contract per domain: what a transport (the
// HTTP API, the tools catalogue, the MCP server, the CLI) is given. The
// server's Set is the orchestrator, the library and the session manager;
// httpapi.Client's is the same contracts over HTTP. A nil Sessions means
// sessions are off.
//
// Errors are classified with errdefs: ErrInvalidArgument (a FieldError
// naming the field) for bad input, ErrNotFound for unknown ids and paths,
// ErrConflict for an idempotency key reused with other arguments or a
// cancel of an ended task, ErrTooLarge for input over a size limit,
// ErrResourceExhausted when the queue is full, ErrNotImplemented for a
// domain this server does not serve.
type Set struct {
	Tasks    Tasks
	Library  Library
	Sessions Sessions
}

// Tasks is the task contract: tasks spawned, watched, read and cancelled,
// and code_execute's one-shot commands (recorded as tasks).
type Tasks interface {
	// Spawn validates req, prepares the task directory and queues the task.
	// With an idempotency key it returns the task already spawned with that
	// key (existing=true) instead of a second one.
	Spawn(ctx context.Context, req SpawnRequest) (t task.Task, existing bool, err error)
	// Execute runs a command once in a fresh sandbox (code_execute) and
	// returns its output when it ends; the call is recorded as a task of
	// kind exec.
	Execute(ctx context.Context, req ExecRequest) (ExecResult, error)
	// Get returns a task as projected from its events.
	Get(ctx context.Context, id string) (task.Task, error)
	// List returns tasks newest first, a page at a time.
	List(ctx context.Context, req ListRequest) (ListPage, error)
	// Result returns a task's result, waiting up to req.Wait for it to end.
	Result(ctx context.Context, req ResultRequest) (Result, error)
	// Cancel stops a task in any non-terminal state.
	Cancel(ctx context.Context, id string) (task.Task, error)
	// SetNetwork changes the network policy of a task that has not ended;
	// its egress proxy follows at once: new connections meet the new
	// policy, open ones it no longer allows are closed.
	SetNetwork(ctx context.Context, req NetworkRequest) (task.Task, error)
	// Logs writes a task's transcript to w; with follow it keeps writing
	// until the task ends.
	Logs(ctx context.Context, req LogsRequest, w io.Writer) error
	// Events calls fn with each event after req.After (an event id), of one
	// task or of all; with follow it waits for new ones until ctx is done.
	Events(ctx context.Context, req EventsRequest, fn func(eventstore.Event) error) error
}

// Library is the contract of what Corral keeps beside tasks: the shared
// workspace and the named ones, attachments, documents and notes, skills,
// and the retention sweep.
type Library interface {
	// ListProjects lists the named workspaces (projects/).
	ListProjects(ctx context.Context) ([]Project, error)
	// CreateProject makes a named workspace, with git when asked.
	CreateProject(ctx context.Context, req CreateProjectRequest) (Project, error)
	// ListProjectFiles lists a directory of a named workspace.
	ListProjectFiles(ctx context.Context, name, path string, recursive bool) ([]ProjectEntry, error)
	// ReadProjectFile reads a file of a named workspace.
	ReadProjectFile(ctx context.Context, name, path string) (File, error)
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

// MaxWait bounds a long poll (ResultRequest.Wait).
const MaxWait = 10 * time.Minute

type actorKey struct{}

// WithActor returns a context that names the caller recorded as the actor of
// the events a request causes.
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

// ActorFrom returns the caller named by WithActor, or "anonymous".
func ActorFrom(ctx context.Context) string {
	if a, ok := ctx.Value(actorKey{}).(string); ok && a != "" {
		return a
	}
	return "anonymous"
}
