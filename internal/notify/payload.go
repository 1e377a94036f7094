package notify

import (
	"encoding/json"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/task"
)

// Completion is the body of a worker_completed notification: seed 000's
// worker_completed payload (event_type, source, task_id, status,
// duration_seconds, exit_code, output_files, error_message) plus the
// task's summary, the origin it was spawned with, so the host can wake the
// right conversation, and the event it reports.
type Completion struct {
	EventType       string            `json:"event_type"` // always "worker_completed"
	Source          string            `json:"source"`     // the runtime: "local", "docker", "kubernetes", ...
	TaskID          string            `json:"task_id"`
	Status          task.Status       `json:"status"`           // success, failed, timeout or cancelled
	DurationSeconds *int64            `json:"duration_seconds"` // whole seconds, as the seed's payload
	DurationMS      *int64            `json:"duration_ms"`
	ExitCode        *int              `json:"exit_code"`
	OutputFiles     []string          `json:"output_files"` // names under the task's output/
	ErrorMessage    *string           `json:"error_message"`
	Summary         string            `json:"summary"`
	Reason          string            `json:"reason,omitempty"` // how it ended: exit, webhook, timeout, lost, cancel, shutdown
	ConversationID  string            `json:"conversation_id"`
	InterfaceType   string            `json:"interface_type"`
	UserName        string            `json:"user_name"`
	Labels          map[string]string `json:"labels,omitempty"`
	EventID         string            `json:"event_id"`
	CorrelationID   string            `json:"correlation_id,omitempty"` // the task's, as on its events
	CausationID     string            `json:"causation_id,omitempty"`   // what caused the reported event
	OccurredAt      time.Time         `json:"occurred_at"`

	// SharedOutputs is {"state": "pending"} for a task that asked
	// save_to_shared and succeeded: the copy follows the end, and its own
	// event (outputs_saved or outputs_save_failed, notify.events) says
	// when it is done. Absent otherwise.
	SharedOutputs *task.SharedOutputs `json:"shared_outputs,omitempty"`
}

// Event is the body of a notification for any other subscribed event
// type: the event's own payload in data, with the task and its origin when
// the event is on a task's stream.
type Event struct {
	EventType      string          `json:"event_type"`
	EventID        string          `json:"event_id"`
	CorrelationID  string          `json:"correlation_id,omitempty"`
	CausationID    string          `json:"causation_id,omitempty"`
	StreamID       string          `json:"stream_id"`
	TaskID         string          `json:"task_id,omitempty"`
	Status         task.Status     `json:"status,omitempty"`
	ConversationID string          `json:"conversation_id,omitempty"`
	InterfaceType  string          `json:"interface_type,omitempty"`
	UserName       string          `json:"user_name,omitempty"`
	OccurredAt     time.Time       `json:"occurred_at"`
	Data           json.RawMessage `json:"data"`
}

// completionBody builds the notification of a worker_completed event from
// the task as folded up to that event.
func completionBody(t task.Task, e eventstore.Event, reason string) Completion {
	c := Completion{
		EventType:       task.EventCompleted,
		Source:          t.Runtime,
		TaskID:          t.ID,
		Status:          t.Status,
		DurationSeconds: t.DurationSeconds,
		DurationMS:      t.DurationMS,
		ExitCode:        t.ExitCode,
		OutputFiles:     []string{},
		Summary:         t.Summary,
		Reason:          reason,
		SharedOutputs:   t.SharedOutputs,
		ConversationID:  t.ConversationID,
		InterfaceType:   t.InterfaceType,
		UserName:        t.UserName,
		Labels:          t.Labels,
		EventID:         e.ID,
		CorrelationID:   e.CorrelationID,
		CausationID:     e.CausationID,
		OccurredAt:      e.RecordedAt.UTC(),
	}
	for _, f := range t.OutputFiles {
		c.OutputFiles = append(c.OutputFiles, f.Name)
	}
	if t.ErrorMessage != "" {
		msg := t.ErrorMessage
		c.ErrorMessage = &msg
	}
	return c
}
