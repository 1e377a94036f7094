package task

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
)

// Event types on a task's stream.
const (
	EventCreated         = "task_created"
	EventQueued          = "task_queued"
	EventStarting        = "task_starting"
	EventStarted         = "task_started"
	EventCancelRequested = "task_cancel_requested"
	EventReattached      = "task_reattached"
	// EventStartRetried records a restart finding a task's start cut
	// short before its worker had it (StartRetried): the task, still
	// starting, starts again. It changes nothing of the task but its
	// version.
	EventStartRetried = "task_start_retried"
	// EventAdopted records a replica taking over a starting or running
	// task from one whose lease lapsed (Adopted); the adopter then
	// reattaches to its sandbox, starts it again or ends it, as a
	// restarted server does.
	EventAdopted = "task_adopted"
	// EventNetworkChanged records a new network policy for a task that
	// has not ended (NetworkChanged): its egress proxy follows it at once.
	EventNetworkChanged = "task_network_changed"
	EventCompleted      = "worker_completed" // the seed's name; terminal
	// EventEgressConnection records one connection attempt through the
	// egress proxy. It changes nothing of the task but its version, and it
	// is appended with any expected version, also after the task ended.
	EventEgressConnection = "egress_connection"
	// EventProgress records what the agent did (text, a tool call, a tool's
	// result), as its worker reported it, coalesced. Like egress events it
	// changes nothing of the task but its version, and is appended with any
	// expected version.
	EventProgress = "task_progress"
	// EventCompacted records retention removing from the stream of a task
	// that ended long ago the events CompactedTypes names (Compacted): it
	// is the stream's last event, and changes nothing of the task but its
	// version.
	EventCompacted = "task_events_compacted"
)

// CompactedTypes are the types of the events retention removes from the
// stream of a task that ended more than event_retention_hours ago: those
// that tell how it ran (what its agent did, what it connected to, its
// sandbox found again or started again after a restart) and change
// nothing of the task but its version, and an earlier EventCompacted
// (the new one counts what it counted). What the task's record is folded
// from stays: its creation, queueing, start, end, network changes,
// cancel request, copy to shared/, and what became of its directory and
// its sandbox.
var CompactedTypes = []string{EventProgress, EventEgressConnection, EventReattached, EventStartRetried, EventCompacted}

// Compacted is the payload of EventCompacted.
type Compacted struct {
	// Removed counts the events retention removed from the stream, over
	// every compaction of it.
	Removed int `json:"removed"`
	// Through is the stream's version when it was compacted: of the
	// versions up to it, those the stream no longer holds were removed.
	Through int64 `json:"through_version"`
}

// Progress is the payload of EventProgress.
type Progress struct {
	Kind   string `json:"kind"` // init, text, tool_use, tool_result, result
	Text   string `json:"text,omitempty"`
	Tool   string `json:"tool,omitempty"`
	Input  string `json:"input,omitempty"`  // a bounded summary of the tool's input
	Status string `json:"status,omitempty"` // ok or error, for tool_result
	// Coalesced counts items of this kind the worker dropped for this one.
	Coalesced int `json:"coalesced,omitempty"`
}

// Line says what a progress item reports, on one line, for a person or
// an MCP progress notification: the agent's text, "Bash: ls -la" for a
// tool call, "Bash: ok" for its result. The text is the worker's: a
// terminal needs it escaped.
func (p Progress) Line() string {
	var s string
	switch p.Kind {
	case "tool_use":
		s = strings.TrimSpace(p.Tool + ": " + p.Input)
	case "tool_result":
		s = strings.TrimSpace(p.Tool + " " + p.Status)
		if s == "" {
			s = "tool result"
		}
	case "init":
		s = "agent started"
	default:
		s = p.Text
	}
	if s == "" {
		s = p.Kind
	}
	if p.Coalesced > 0 {
		s += fmt.Sprintf(" (+%d more)", p.Coalesced)
	}
	return strings.Join(strings.Fields(s), " ")
}

// Usage counts an agent run's tokens, as the agent reported them.
type Usage struct {
	InputTokens         int64 `json:"input_tokens"`
	OutputTokens        int64 `json:"output_tokens"`
	CacheReadTokens     int64 `json:"cache_read_tokens,omitempty"`
	CacheCreationTokens int64 `json:"cache_creation_tokens,omitempty"`
}

// Total is every token counted.
func (u Usage) Total() int64 {
	return u.InputTokens + u.OutputTokens + u.CacheReadTokens + u.CacheCreationTokens
}

// Event types on the system stream, recorded by start-up reconciliation.
const (
	SystemStream          = "system"
	EventOrphanStopped    = "sandbox_orphan_stopped"
	EventUnknownDirectory = "task_directory_unknown"
	EventReconciled       = "reconciled"
)

// Event types of the workspace bridges and retention. Attachment events go
// on the attachment's own stream (AttachmentStreamID); the others on the
// task's stream, appended with any expected version (also after the task
// ended) and changing nothing of the task but its version. Orphan files
// removed from attachments/ are recorded on the system stream.
const (
	EventAttachmentCreated = "attachment_created"
	// EventWorkspaceCreated records a named workspace (projects/<name>/) made
	// by POST /api/workspaces, on stream workspace/<name>.
	EventWorkspaceCreated = "workspace_created"
	// EventWorkspaceTaskCompleted and EventWorkspaceTaskFailed report a
	// workspace task's end on its origin conversation's stream
	// (WorkspaceTaskReport), once.
	EventWorkspaceTaskCompleted = "workspace_task_completed"
	EventWorkspaceTaskFailed    = "workspace_task_failed"
	// EventSharedFileWritten records a file of shared/ written by a caller
	// (write_workspace, PUT /api/workspace/..., an upload from the web UI)
	// on stream SharedStreamID (SharedFileWritten).
	EventSharedFileWritten = "shared_file_written"
	// EventWorkspaceTaskSpawned tells the origin conversation a workspace
	// task of its started (seed 002; WorkspaceTaskSpawned), once.
	EventWorkspaceTaskSpawned = "workspace_task_spawned"
	EventAttachmentRemoved    = "attachment_removed"
	// EventOutputsSaved records save_to_shared copying a successful task's
	// outputs into shared/; EventOutputsSaveFailed, that it could not.
	// Either comes once, after the task's end (Task.SharedOutputs).
	EventOutputsSaved      = "outputs_saved"
	EventOutputsSaveFailed = "outputs_save_failed"
	// EventDirectoryRemoved records retention removing an ended task's
	// directory; its events stay.
	EventDirectoryRemoved = "task_directory_removed"
	// EventRemovalFailed records a removal that failed or was partial; the
	// next sweep retries it.
	EventRemovalFailed = "removal_failed"
	// EventSandboxDestroyFailed records that the task's sandbox, after the
	// task's end, could not be destroyed whole: above all, a directory it
	// was given (the task's, a workspace) not given back whole and so
	// quarantined (closed to all but the server until an operator looks).
	EventSandboxDestroyFailed = "sandbox_destroy_failed"
	// EventSandboxDestroyed records that a sandbox whose destroy failed
	// (EventSandboxDestroyFailed, not quarantined) was destroyed by a
	// later attempt of the same server.
	EventSandboxDestroyed = "sandbox_destroyed"
)

// SandboxDestroyFailed is the payload of EventSandboxDestroyFailed.
type SandboxDestroyFailed struct {
	SandboxName string `json:"sandbox_name"`
	Error       string `json:"error"`
	// Quarantined: a directory the sandbox was given is closed to all
	// but the server; an operator must look at it and give it back.
	Quarantined bool `json:"quarantined"`
}

// SandboxDestroyed is the payload of EventSandboxDestroyed.
type SandboxDestroyed struct {
	SandboxName string `json:"sandbox_name"`
	// Attempts counts the destroys, the one that failed first included.
	Attempts int `json:"attempts"`
}

// AttachmentStreamID returns the event stream of an attachment.
func AttachmentStreamID(id string) string { return "attachment/" + id }

// AttachmentCreated is the payload of EventAttachmentCreated.
type AttachmentCreated struct {
	AttachmentID string `json:"attachment_id"`
	Name         string `json:"name"`
	Type         string `json:"type"`
	Size         int64  `json:"size"`
	SHA256       string `json:"sha256"`
	// Source is "upload" or the data-root path the attachment was made from
	// ("tasks/<id>/output/chart.png", "shared/scripts/x.py").
	Source      string `json:"source"`
	TaskID      string `json:"task_id,omitempty"`
	Description string `json:"description,omitempty"`
}

// AttachmentRemoved is the payload of EventAttachmentRemoved.
type AttachmentRemoved struct {
	AttachmentID string `json:"attachment_id,omitempty"`
	File         string `json:"file"` // relative to attachments/
	Bytes        int64  `json:"bytes"`
	Reason       string `json:"reason"` // "retention" or "orphan"
}

// SavedFile is one file save_to_shared copied.
type SavedFile struct {
	From string `json:"from"` // relative to the task's output/
	To   string `json:"to"`   // relative to shared/
	Size int64  `json:"size"`
	// Renamed is set when a file of that name with other content was
	// already there: To has a suffix and Wanted is the name it would have had.
	Renamed bool   `json:"renamed,omitempty"`
	Wanted  string `json:"wanted,omitempty"`
	// Unchanged is set when an identical file was already at To.
	Unchanged bool `json:"unchanged,omitempty"`
}

// OutputsSaved is the payload of EventOutputsSaved and, with Error set,
// of EventOutputsSaveFailed.
type OutputsSaved struct {
	Directory string      `json:"directory"` // shared/outputs/YYYY-MM/<task-id>, YYYY-MM of the task's end
	Files     []SavedFile `json:"files"`
	// Skipped are the outputs left out: names shared/ does not take
	// (control characters, invalid UTF-8), files that were no longer
	// regular files when copied, or scripts whose name and 999 suffixed
	// ones were taken in scripts/ (those are still under Directory).
	Skipped []SkippedFile `json:"skipped,omitempty"`
	// FilesTotal and SkippedTotal are set when Files or Skipped lists
	// only some (MaxSavedListed): how many entries there are.
	FilesTotal   int    `json:"files_total,omitempty"`
	SkippedTotal int    `json:"skipped_total,omitempty"`
	Error        string `json:"error,omitempty"`
}

// MaxSavedListed bounds each of OutputsSaved's lists, so that a task
// leaving 100,000 files does not make an event of megabytes.
const MaxSavedListed = 1000

// SkippedFile is an output file save_to_shared left out, and why.
type SkippedFile struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// DirectoryRemoved is the payload of EventDirectoryRemoved.
type DirectoryRemoved struct {
	Directory string    `json:"directory"` // tasks/<id>
	Bytes     int64     `json:"bytes"`
	EndedAt   time.Time `json:"ended_at"`
}

// RemovalFailed is the payload of EventRemovalFailed.
type RemovalFailed struct {
	Path  string `json:"path"` // relative to the data root
	Error string `json:"error"`
}

// Event types of the document index and of skills. Each document has its
// own stream (DocumentStreamID), each skill too (SkillStreamID). A document
// ingested from a workspace file and a note pushed by the host carry the same
// payload; the index (package document) is folded from them.
const (
	EventDocumentIngested = "document_ingested"
	EventNoteCreated      = "note_created"
	EventSkillCreated     = "skill_created"
)

// DocumentStreamID returns the event stream of a document.
func DocumentStreamID(id string) string { return "document/" + id }

// SkillStreamID returns the event stream of a skill.
func SkillStreamID(name string) string { return "skill/" + name }

// DocumentIngested is the payload of EventDocumentIngested and
// EventNoteCreated. The content is the file documents/<File>, not the event.
type DocumentIngested struct {
	DocumentID string `json:"document_id"`
	Title      string `json:"title"`
	// SourceType is worker_output, generated, imported or note.
	SourceType string `json:"source_type"`
	File       string `json:"file"` // relative to documents/: <id>_<name>
	Name       string `json:"name"` // the original file name
	// Source is the data-root path the document was copied from
	// ("shared/data/x.csv", "tasks/<id>/output/summary.md"); empty for a
	// note pushed with its content.
	Source      string          `json:"source,omitempty"`
	ContentType string          `json:"content_type"`
	Size        int64           `json:"size"`
	SHA256      string          `json:"sha256"`
	Metadata    json.RawMessage `json:"metadata,omitempty"`
}

// SkillCreated is the payload of EventSkillCreated.
type SkillCreated struct {
	Name         string   `json:"name"`
	Description  string   `json:"description"`
	DockerImage  string   `json:"docker_image,omitempty"`
	Dependencies []string `json:"dependencies,omitempty"`
	Files        []string `json:"files"` // relative to shared/skills/<name>/, SKILL.md included
	FromTaskID   string   `json:"from_task_id,omitempty"`
	SHA256       string   `json:"sha256"` // of SKILL.md
}

// Event types of outbound notifications to the host. Each delivery has its
// own stream (DeliveryStreamID); the notify stream records when
// notifications were turned on or off, so a restart knows which task ends
// it still owes the host.
const (
	NotifyStream           = "notify"
	EventNotifyEnabled     = "notify_enabled"
	EventNotifyDisabled    = "notify_disabled"
	EventDeliveryScheduled = "delivery_scheduled"
	EventDeliveryAttempted = "delivery_attempted"
	EventDeliverySucceeded = "delivery_succeeded"
	EventDeliveryFailed    = "delivery_failed" // dead letter: retries exhausted
	EventDeliveryRetried   = "delivery_retried"
)

// SchemaVersion is the version of every payload below. Bump it when a payload
// changes incompatibly and keep Apply able to read the old one.
const SchemaVersion = 1

// Created is the payload of EventCreated.
type Created struct {
	Spec Spec `json:"spec"`
	// RequestHash identifies the spawn arguments, to tell a retried spawn
	// with the same idempotency key from a different one.
	RequestHash string `json:"request_hash,omitempty"`
	// PromptSHA256 is the hex SHA-256 of the prompt.md written for the
	// task. The file reaches the disk while this event does, so a crash
	// can leave one without the other: a task whose prompt.md is not this
	// does not start.
	PromptSHA256 string `json:"prompt_sha256,omitempty"`
}

// Started is the payload of EventStarted.
type Started struct {
	SandboxName string          `json:"sandbox_name"`
	Handle      json.RawMessage `json:"handle"`
}

// CancelRequested is the payload of EventCancelRequested.
type CancelRequested struct {
	Reason string `json:"reason,omitempty"`
}

// Completed is the payload of EventCompleted: the task's result.
type Completed struct {
	Status      Status       `json:"status"`
	ExitCode    *int         `json:"exit_code,omitempty"`
	OutputFiles []OutputFile `json:"output_files,omitempty"`
	// OutputFilesTotal and OutputFilesNote: see Task.
	OutputFilesTotal int      `json:"output_files_total,omitempty"`
	OutputFilesNote  string   `json:"output_files_note,omitempty"`
	Summary          string   `json:"summary,omitempty"`
	ErrorMessage     string   `json:"error_message,omitempty"`
	LogsTruncated    bool     `json:"logs_truncated,omitempty"`
	Reason           string   `json:"reason,omitempty"` // e.g. "lost", "timeout", "webhook", "exit", "shutdown"
	DurationSeconds  *float64 `json:"duration_seconds,omitempty"`
	SessionID        string   `json:"session_id,omitempty"`
	Usage            *Usage   `json:"usage,omitempty"`
	CostUSD          float64  `json:"cost_usd,omitempty"`
	// Changes is what a task in a git workspace changed there.
	Changes *Changes `json:"changes,omitempty"`
}

// SharedStreamID is the stream of shared/'s writes by callers.
const SharedStreamID = "shared"

// SharedFileWritten is EventSharedFileWritten's payload.
type SharedFileWritten struct {
	Path   string `json:"path"` // relative to shared/
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// WorkspaceTaskSpawned is EventWorkspaceTaskSpawned's payload.
type WorkspaceTaskSpawned struct {
	TaskID    string `json:"task_id"`
	Workspace string `json:"workspace"`
	Origin
}

// WorkspaceTaskReport is the payload of EventWorkspaceTaskCompleted and
// EventWorkspaceTaskFailed.
type WorkspaceTaskReport struct {
	TaskID       string   `json:"task_id"`
	Workspace    string   `json:"workspace"`
	Status       Status   `json:"status"`
	Summary      string   `json:"summary,omitempty"`
	ErrorMessage string   `json:"error_message,omitempty"`
	Changes      *Changes `json:"changes,omitempty"`
	Origin
}

// The most a Changes holds: names in each list, and commits.
const (
	MaxChangedFiles = 1000
	MaxCommits      = 100
)

// Changes is what a task changed in its git workspace since it started:
// files added, modified and deleted (committed or not) and the commits it
// made. Lists are bounded; Truncated says some were left out.
type Changes struct {
	Added     []string `json:"added"`
	Modified  []string `json:"modified"`
	Deleted   []string `json:"deleted"`
	Commits   []Commit `json:"commits"`
	Truncated bool     `json:"truncated,omitempty"`
}

// Commit is one commit a task made.
type Commit struct {
	Hash    string `json:"hash"`
	Subject string `json:"subject"`
}

// EgressConnection is the payload of EventEgressConnection: one attempt by
// the task's worker to reach Host:Port through the egress proxy.
type EgressConnection struct {
	Method string `json:"method"` // CONNECT, or the method of a plain HTTP request
	Host   string `json:"host"`
	Port   int    `json:"port"`
	// Path is what a plain HTTP request, or one relayed to the agent's
	// model API (with its key added: Credential), asked of Host: its
	// path, never its query or a header.
	Path       string `json:"path,omitempty"`
	Credential bool   `json:"credential,omitempty"`
	Address    string `json:"address,omitempty"` // the IP and port connected to
	Allowed    bool   `json:"allowed"`
	Reason     string `json:"reason,omitempty"` // why it was denied
	Error      string `json:"error,omitempty"`  // why an allowed connection failed or ended early
	Status     int    `json:"status,omitempty"` // the HTTP status the worker got
	// BytesUp and BytesDown count bytes sent to and received from Host.
	BytesUp         int64   `json:"bytes_up"`
	BytesDown       int64   `json:"bytes_down"`
	DurationSeconds float64 `json:"duration_seconds"`
}

// StartingOn is the payload of EventStarting: the replica that starts the
// task (the leader chose it; on one server, the server itself).
type StartingOn struct {
	Replica string `json:"replica,omitempty"`
}

// Adopted is the payload of EventAdopted: the replica that adopts the
// task, the one it had, and why that one is taken to be gone.
type Adopted struct {
	Replica string `json:"replica"`
	From    string `json:"from,omitempty"`
	Reason  string `json:"reason"`
}

// NetworkChanged is the payload of EventNetworkChanged: the task's network
// policy from now on, and its own allowlist (none: the server's).
type NetworkChanged struct {
	Network string   `json:"network"`
	Allow   []string `json:"allow"`
}

// Reattached is the payload of EventReattached.
type Reattached struct {
	SandboxName string `json:"sandbox_name"`
}

// StartRetried is the payload of EventStartRetried: what was left of the
// task's sandbox (SandboxName, "" if nothing), destroyed, and why nothing
// of the task had run in it.
type StartRetried struct {
	SandboxName string `json:"sandbox_name,omitempty"`
	Reason      string `json:"reason"`
}

// Apply folds one event of the task's stream into t. Events that would move
// the status backwards are errors: the store never holds them, because
// every writer appends with an expected version.
func (t *Task) Apply(e eventstore.Event) error {
	typ, data, version, at, pos := e.Type, e.Data, e.StreamVersion, e.RecordedAt, e.Position
	// Versions follow one another, but where retention removed events
	// (EventCompacted): never a first event, which it keeps.
	if version <= t.Version || (t.Version == 0 && version != 1) {
		return fmt.Errorf("apply %s to task %s: version %d after %d", typ, t.ID, version, t.Version)
	}
	move := func(s Status) error {
		if !t.Status.CanMoveTo(s) && !(t.Version == 0 && s == Pending) {
			return fmt.Errorf("apply %s to task %s: cannot move from %s to %s", typ, t.ID, t.Status, s)
		}
		t.Status = s
		return nil
	}
	switch typ {
	case EventCreated:
		var p Created
		if err := json.Unmarshal(data, &p); err != nil {
			return fmt.Errorf("decode %s: %w", typ, err)
		}
		t.Spec = p.Spec
		t.PromptSHA256 = p.PromptSHA256
		t.CreatedAt = at
		t.CorrelationID = e.CorrelationID
		if err := move(Pending); err != nil {
			return err
		}
	case EventQueued:
		if err := move(Queued); err != nil {
			return err
		}
		t.QueuedAt, t.QueueSeq = &at, pos
	case EventStarting:
		// A payload from before replicas were recorded may be empty.
		var p StartingOn
		if len(data) > 0 {
			if err := json.Unmarshal(data, &p); err != nil {
				return fmt.Errorf("decode %s: %w", typ, err)
			}
		}
		if err := move(Starting); err != nil {
			return err
		}
		t.Replica = p.Replica
	case EventAdopted:
		var p Adopted
		if err := json.Unmarshal(data, &p); err != nil {
			return fmt.Errorf("decode %s: %w", typ, err)
		}
		if t.Status != Starting && t.Status != Running {
			return fmt.Errorf("apply %s to task %s: a %s task has no replica to adopt it from", typ, t.ID, t.Status)
		}
		t.Replica = p.Replica
	case EventStarted:
		var p Started
		if err := json.Unmarshal(data, &p); err != nil {
			return fmt.Errorf("decode %s: %w", typ, err)
		}
		if err := move(Running); err != nil {
			return err
		}
		t.SandboxName, t.Handle, t.StartedAt = p.SandboxName, p.Handle, &at
	case EventCancelRequested:
		t.CancelRequested = true
	case EventNetworkChanged:
		var p NetworkChanged
		if err := json.Unmarshal(data, &p); err != nil {
			return fmt.Errorf("decode %s: %w", typ, err)
		}
		if t.Status.Terminal() {
			return fmt.Errorf("apply %s to task %s: it ended", typ, t.ID)
		}
		t.Network, t.NetworkAllow = p.Network, p.Allow
	case EventReattached, EventStartRetried, EventEgressConnection, EventProgress:
		t.Compactable++
	case EventCompacted:
		t.Compactable = 0
	case EventDirectoryRemoved, EventRemovalFailed, EventSandboxDestroyFailed, EventSandboxDestroyed:
	case EventWorkspaceGit:
		var p WorkspaceGit
		if err := json.Unmarshal(data, &p); err != nil {
			return fmt.Errorf("decode %s: %w", typ, err)
		}
		t.WorkspaceGit = &p
	case EventOutputsSaved, EventOutputsSaveFailed:
		// The copy happened, whatever its payload says: one that does not
		// decode still ends the wait.
		var p OutputsSaved
		_ = json.Unmarshal(data, &p)
		s := &SharedOutputs{State: SaveSaved, Directory: p.Directory}
		if typ == EventOutputsSaveFailed {
			s.State, s.Error = SaveFailed, p.Error
		}
		t.SharedOutputs = s
	case EventCompleted:
		var p Completed
		if err := json.Unmarshal(data, &p); err != nil {
			return fmt.Errorf("decode %s: %w", typ, err)
		}
		if !p.Status.Terminal() {
			return fmt.Errorf("apply %s to task %s: status %q is not terminal", typ, t.ID, p.Status)
		}
		if err := move(p.Status); err != nil {
			return err
		}
		t.CompletedAt = &at
		// What only a live task needs goes: its sandbox's handle (to
		// reattach after a restart) and its prompt's hash (checked at its
		// start). A server holds every ended task.
		t.Handle, t.PromptSHA256 = nil, ""
		t.ExitCode, t.OutputFiles, t.Summary, t.ErrorMessage, t.LogsTruncated = p.ExitCode, p.OutputFiles, p.Summary, p.ErrorMessage, p.LogsTruncated
		t.SessionID, t.Usage, t.CostUSD, t.Changes = p.SessionID, p.Usage, p.CostUSD, p.Changes
		t.OutputFilesTotal, t.OutputFilesNote = p.OutputFilesTotal, p.OutputFilesNote
		// save_to_shared copies a successful task's outputs after its end.
		// A log from before the copy followed the end has the copy's event
		// first: that one stands.
		if p.Status == Success && t.SaveToShared && t.SharedOutputs == nil {
			t.SharedOutputs = &SharedOutputs{State: SavePending, After: e.ID}
		}
		switch {
		case p.DurationSeconds != nil:
			t.setDuration(time.Duration(*p.DurationSeconds * float64(time.Second)))
		case t.StartedAt != nil:
			t.setDuration(at.Sub(*t.StartedAt))
		}
	default:
		// Unknown event types (from a newer version) change nothing but the version.
	}
	t.Version = version
	t.UpdatedAt = at
	t.LastEventID = e.ID
	return nil
}

// NotifyEnabled is the payload of EventNotifyEnabled: from this event on,
// events of these types (and every task ending) are delivered.
type NotifyEnabled struct {
	Events []string `json:"events"`
}

// DeliveryScheduled is the payload of EventDeliveryScheduled: one
// notification, fixed at scheduling so every attempt sends the same body.
type DeliveryScheduled struct {
	SourceEventID string          `json:"source_event_id"`
	EventType     string          `json:"event_type"`
	TaskID        string          `json:"task_id,omitempty"`
	Payload       json.RawMessage `json:"payload"`
}

// DeliveryAttempted is the payload of EventDeliveryAttempted: one POST.
type DeliveryAttempted struct {
	Attempt    int     `json:"attempt"`               // 1 for the first, across retries
	StatusCode int     `json:"status_code,omitempty"` // 0 when no response came
	Error      string  `json:"error,omitempty"`
	DurationMS float64 `json:"duration_ms"`
	// NextAttemptAt is when the next attempt is due, if there is one.
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
}

// DeliveryFailed is the payload of EventDeliveryFailed.
type DeliveryFailed struct {
	Reason string `json:"reason"`
}

// DeliveryRetried is the payload of EventDeliveryRetried: a dead letter
// queued again by hand, for a new round of attempts.
type DeliveryRetried struct {
	By string `json:"by,omitempty"`
}

// setDuration sets the task's run time, in whole seconds (rounded) and in
// milliseconds.
func (t *Task) setDuration(d time.Duration) {
	secs, ms := int64(d.Round(time.Second)/time.Second), d.Milliseconds()
	t.DurationSeconds, t.DurationMS = &secs, &ms
}
