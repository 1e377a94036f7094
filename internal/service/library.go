package service

import (
	"encoding/json"
	"time"

	"github.com/corral-dev/corral/internal/attachment"
	"github.com/corral-dev/corral/internal/document"
	"github.com/corral-dev/corral/internal/skill"
	"github.com/corral-dev/corral/internal/workspace"
)

// GCRequest asks for a retention sweep.
type GCRequest struct {
	DryRun bool `json:"dry_run,omitempty"`
}

// GCReport says what a sweep removed (or, dry, would remove) and what it
// could not.
type GCReport struct {
	DryRun          bool      `json:"dry_run"`
	Now             time.Time `json:"now"`
	TaskDirectories []GCItem  `json:"task_directories"`
	Attachments     []GCItem  `json:"attachments"`
	// TaskEvents are the tasks whose events the sweep compacts.
	TaskEvents []GCEvents `json:"task_events"`
	Failed     []GCItem   `json:"failed,omitempty"`
	Bytes      int64      `json:"bytes"` // of the files removed
}

// GCEvents is an ended task whose events a sweep compacts: the events
// that told how it ran go from the log, those its record is folded from
// stay, and a task_events_compacted event says so.
type GCEvents struct {
	TaskID string    `json:"task_id"`
	Events int       `json:"events"` // how many go
	Bytes  int64     `json:"bytes"`  // their data
	Since  time.Time `json:"since"`  // when the task ended
	Reason string    `json:"reason"`
}

// GCItem is one thing a sweep removes.
type GCItem struct {
	Path   string    `json:"path"` // relative to the data root
	ID     string    `json:"id,omitempty"`
	Bytes  int64     `json:"bytes"`
	Since  time.Time `json:"since"` // when the task ended or the attachment was last used
	Reason string    `json:"reason"`
	Error  string    `json:"error,omitempty"`
}

// Attachment is an attachment's metadata (SPEC §1 attachments/XX/<id>.json).
type Attachment = attachment.Meta

// CreateAttachmentRequest holds create_attachment_from_workspace's
// arguments.
type CreateAttachmentRequest struct {
	// SourcePath names a task's output file, "tasks/<task-id>/output/<path>",
	// or a shared file, "shared/<path>" or a path relative to shared/. A
	// leading "/workspace/" (the seed's view of the volume) is ignored.
	SourcePath  string `json:"source_path"`
	Description string `json:"description,omitempty"`
}

// Document is a document of the index (a file ingested into documents/, or
// a note).
type Document = document.Doc

// DocumentHit is one search result.
type DocumentHit = document.Hit

// IngestRequest holds ingest_from_workspace's arguments, or a note pushed
// by the host with its content (POST /api/documents with content).
type IngestRequest struct {
	// SourcePath is a file of shared/ ("data/x.csv", "shared/data/x.csv",
	// "/workspace/shared/data/x.csv") or a task's output file
	// ("tasks/<id>/output/summary.md").
	SourcePath string `json:"source_path,omitempty"`
	// Content is a note's Markdown text, instead of SourcePath.
	Content *string `json:"content,omitempty"`
	Title   string  `json:"title"`
	// SourceType is worker_output (the default for a file), generated,
	// imported or note (the default for content).
	SourceType string `json:"source_type,omitempty"`
	// DocumentType is the seed's use case 2 spelling: "note" makes the
	// document a note.
	DocumentType string          `json:"document_type,omitempty"`
	Metadata     json.RawMessage `json:"metadata,omitempty"`
}

// SearchRequest is a document search.
type SearchRequest struct {
	Query string `json:"q"`
	// Type is "note", "document" or empty for both.
	Type  string `json:"type,omitempty"`
	Limit int    `json:"limit,omitempty"`
}

// SearchResult is a search's answer, best match first.
type SearchResult struct {
	Query     string        `json:"q"`
	Documents []DocumentHit `json:"documents"`
}

// ExportNotesRequest holds export_notes_to_workspace's arguments.
type ExportNotesRequest struct {
	Query          string `json:"query"`
	DestinationDir string `json:"destination_dir"`
	MaxNotes       int    `json:"max_notes,omitempty"`
}

// ExportedNote is one note written by ExportNotes.
type ExportedNote struct {
	DocumentID string `json:"document_id"`
	Title      string `json:"title"`
	Path       string `json:"path"` // relative to shared/
	Size       int64  `json:"size"`
}

// ExportNotesResult is export_notes_to_workspace's answer: seed 000's
// {exported, path} (the count, and the directory under shared/ with a
// trailing slash), and each note written.
type ExportNotesResult struct {
	Exported       int            `json:"exported"`
	Path           string         `json:"path"`
	DestinationDir string         `json:"destination_dir"`
	Notes          []ExportedNote `json:"notes"`
}

// SkillInfo is a skill as listed: its frontmatter, or why it cannot be read.
type SkillInfo struct {
	skill.Skill
	Path  string `json:"path"` // of SKILL.md, relative to shared/
	Error string `json:"error,omitempty"`
}

// SkillDetail is a skill with its SKILL.md and the files beside it.
type SkillDetail struct {
	SkillInfo
	Content string            `json:"content"` // SKILL.md
	Files   []workspace.Entry `json:"files"`   // relative to the skill's directory
}

// CreateSkillRequest holds create_skill's arguments. The SKILL.md comes
// from Content, or is built from Name, Description, DockerImage,
// Dependencies and Instructions, or (with TaskID and neither) is the task's
// output/SKILL.md. With TaskID, the task must have succeeded and its output
// files (Files, or all) are copied beside SKILL.md.
type CreateSkillRequest struct {
	Content      string   `json:"content,omitempty"`
	Name         string   `json:"name,omitempty"`
	Description  string   `json:"description,omitempty"`
	DockerImage  string   `json:"docker_image,omitempty"`
	Dependencies []string `json:"dependencies,omitempty"`
	Instructions string   `json:"instructions,omitempty"`
	TaskID       string   `json:"task_id,omitempty"`
	Files        []string `json:"files,omitempty"`
}
