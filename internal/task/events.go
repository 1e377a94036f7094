package task

import (
	"encoding/json"
	"fmt"
	"time"
)

// Event types on a task's stream.
const (
	EventCreated         = "task_created"
	EventQueued          = "task_queued"
	EventStarting        = "task_starting"
	EventStarted         = "task_started"
	EventCancelRequested = "task_cancel_requested"
	EventReattached      = "task_reattached"
	EventCompleted       = "worker_completed" // the seed's name; terminal
)

// Event types on the system stream, recorded by start-up reconciliation.
const (
	SystemStream          = "system"
	EventOrphanStopped    = "sandbox_orphan_stopped"
	EventUnknownDirectory = "task_directory_unknown"
	EventReconciled       = "reconciled"
)

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
	Status          Status       `json:"status"`
	ExitCode        *int         `json:"exit_code,omitempty"`
	OutputFiles     []OutputFile `json:"output_files,omitempty"`
	Summary         string       `json:"summary,omitempty"`
	ErrorMessage    string       `json:"error_message,omitempty"`
	LogsTruncated   bool         `json:"logs_truncated,omitempty"`
	Reason          string       `json:"reason,omitempty"` // e.g. "lost", "timeout", "webhook", "exit"
	DurationSeconds *float64     `json:"duration_seconds,omitempty"`
}

// Reattached is the payload of EventReattached.
type Reattached struct {
	SandboxName string `json:"sandbox_name"`
}

// Apply folds one event of the task's stream into t. version is the event's
// stream version, at its recorded time and pos its global position. Events
// that would move the status backwards are errors: the store never holds
// them, because every writer appends with an expected version.
func (t *Task) Apply(typ string, data []byte, version int64, at time.Time, pos int64) error {
	if version != t.Version+1 {
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
		t.CreatedAt = at
		if err := move(Pending); err != nil {
			return err
		}
	case EventQueued:
		if err := move(Queued); err != nil {
			return err
		}
		t.QueuedAt, t.QueueSeq = &at, pos
	case EventStarting:
		if err := move(Starting); err != nil {
			return err
		}
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
	case EventReattached:
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
		t.ExitCode, t.OutputFiles, t.Summary, t.ErrorMessage, t.LogsTruncated = p.ExitCode, p.OutputFiles, p.Summary, p.ErrorMessage, p.LogsTruncated
		switch {
		case p.DurationSeconds != nil:
			t.DurationSeconds = p.DurationSeconds
		case t.StartedAt != nil:
			d := at.Sub(*t.StartedAt).Seconds()
			t.DurationSeconds = &d
		}
	default:
		// Unknown event types (from a newer version) change nothing but the version.
	}
	t.Version = version
	t.UpdatedAt = at
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
