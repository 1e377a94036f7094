package workerproto

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workspace"
)

// Status is the content of a task's status.json (SPEC §6), written by the
// worker when its agent ends and read by the server.
type Status struct {
	Status      string    `json:"status"` // "success" or "failed"
	StartedAt   time.Time `json:"started_at"`
	CompletedAt time.Time `json:"completed_at"`
	// DurationSeconds is the run time in whole seconds (rounded),
	// DurationMS in milliseconds (SPEC §6).
	DurationSeconds int64        `json:"duration_seconds"`
	DurationMS      int64        `json:"duration_ms"`
	ExitCode        int          `json:"exit_code"`
	OutputFiles     []OutputFile `json:"output_files"`
	Summary         string       `json:"summary"`
	ErrorMessage    string       `json:"error_message"` // "" is written as null
	LogsTruncated   bool         `json:"logs_truncated"`
	// SessionID is the agent's session, for a follow-up to resume.
	SessionID string `json:"session_id,omitempty"`
	// Usage and CostUSD are what the agent reported it used.
	Usage   *task.Usage `json:"usage,omitempty"`
	CostUSD float64     `json:"cost_usd,omitempty"`
	// Changes is what the agent changed in its git workspace, as git
	// inside the sandbox saw it.
	Changes *task.Changes `json:"changes,omitempty"`
}

// OutputFile is one regular file beneath the task's output/ directory.
type OutputFile struct {
	Name string `json:"name"` // slash-separated, relative to output/
	Size int64  `json:"size"`
	Type string `json:"type"` // MIME type, without parameters
}

// MarshalJSON writes the SPEC's format: an empty ErrorMessage as null, nil
// OutputFiles as [], times as RFC 3339 in UTC to the second.
func (s Status) MarshalJSON() ([]byte, error) {
	type plain Status
	out := struct {
		plain
		StartedAt    string       `json:"started_at"`
		CompletedAt  string       `json:"completed_at"`
		OutputFiles  []OutputFile `json:"output_files"`
		ErrorMessage *string      `json:"error_message"`
	}{
		plain:       plain(s),
		StartedAt:   s.StartedAt.UTC().Format(time.RFC3339),
		CompletedAt: s.CompletedAt.UTC().Format(time.RFC3339),
		OutputFiles: s.OutputFiles,
	}
	if out.OutputFiles == nil {
		out.OutputFiles = []OutputFile{}
	}
	if s.ErrorMessage != "" {
		out.ErrorMessage = &s.ErrorMessage
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads a status, taking a duration_seconds with a fraction
// too (as workers before 2026-11-29 wrote it; duration_ms then from it).
func (s *Status) UnmarshalJSON(b []byte) error {
	type plain Status
	var in struct {
		plain
		DurationSeconds json.Number `json:"duration_seconds"`
	}
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	*s = Status(in.plain)
	if in.DurationSeconds == "" {
		return nil
	}
	f, err := in.DurationSeconds.Float64()
	if err != nil {
		return fmt.Errorf("duration_seconds: %w", err)
	}
	s.DurationSeconds = int64(math.Round(f))
	if s.DurationMS == 0 {
		s.DurationMS = int64(math.Round(f * 1000))
	}
	return nil
}

// ReadStatus reads and checks status.json beneath root, the task directory,
// reading at most maxBytes. A missing file returns an error wrapping
// errdefs.ErrNotFound; a symbolic link, errdefs.ErrPermissionDenied (the
// worker does not get to point the server at another file); a larger file,
// workspace.ErrTooLarge; a file that is not a status, errdefs.ErrInvalidArgument.
// The worker is not trusted: the server should treat every field as input.
func ReadStatus(root *os.Root, maxBytes int64) (Status, error) {
	data, truncated, err := workspace.ReadFile(root, StatusFile, maxBytes)
	if err != nil {
		return Status{}, fmt.Errorf("read %s: %w", StatusFile, err)
	}
	if truncated {
		return Status{}, fmt.Errorf("read %s: larger than %d bytes: %w", StatusFile, maxBytes, workspace.ErrTooLarge)
	}
	var s Status
	if err := json.Unmarshal(data, &s); err != nil {
		return Status{}, fmt.Errorf("decode %s: %v: %w", StatusFile, err, errdefs.ErrInvalidArgument)
	}
	if s.DurationMS < 0 {
		return Status{}, fmt.Errorf("decode %s: negative duration_ms: %w", StatusFile, errdefs.ErrInvalidArgument)
	}
	switch s.Status {
	case "success", "failed", "timeout", "cancelled":
	default:
		return Status{}, fmt.Errorf("decode %s: status %q is not success, failed, timeout or cancelled: %w", StatusFile, s.Status, errdefs.ErrInvalidArgument)
	}
	if s.DurationSeconds < 0 {
		return Status{}, fmt.Errorf("decode %s: negative duration_seconds: %w", StatusFile, errdefs.ErrInvalidArgument)
	}
	return s, nil
}
