// Package logkey holds the log/slog attribute keys shared by every package, so
// one field has one name in every log line.
package logkey

// Attribute keys.
const (
	TaskID        = "task_id"
	SandboxID     = "sandbox_id"
	Runtime       = "runtime"
	Subsystem     = "subsystem"
	RequestID     = "request_id"
	CorrelationID = "correlation_id"
	EventID       = "event_id"
	StreamID      = "stream_id"
	Status        = "status"
	Error         = "err"
)
