package service

import "github.com/corral-dev/corral/internal/task"

// ExecRequest is a code_execute call (seed 004): a shell command run once
// with `sh -c` in a fresh sandbox, its output and files returned when it
// ends. Inputs (attachments, context files) are in /workspace/input/;
// files the command writes to /workspace/output/ come back as
// attachments; /workspace/shared/ is the shared workspace, read-only.
type ExecRequest struct {
	Command string `json:"command"`
	// Image is the image to run in (docker, kubernetes); default
	// execution.default_image.
	Image string `json:"image,omitempty"`
	// WorkingDir is where the command starts, an absolute path inside the
	// sandbox; default /workspace.
	WorkingDir string `json:"working_dir,omitempty"`
	// TimeoutSeconds is the wall-clock limit, at most MaxExecTimeout;
	// default execution.timeout.
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
	// Network gives the command the server's egress policy (its
	// allowlist by default); without it the sandbox has loopback only.
	Network        bool              `json:"network,omitempty"`
	AttachmentIDs  []string          `json:"attachment_ids,omitempty"`
	ContextFiles   []string          `json:"context_files,omitempty"`
	Runtime        string            `json:"runtime,omitempty"`
	ConversationID string            `json:"conversation_id,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
}

// MaxExecTimeout is the most a code_execute call may run, in seconds.
const MaxExecTimeout = 300

// ExecResult is how a code_execute call ended. Stdout and Stderr are cut at
// execution.max_output_size, and say so.
type ExecResult struct {
	TaskID          string      `json:"task_id"`
	Status          task.Status `json:"status"`
	Success         bool        `json:"success"`
	ExitCode        *int        `json:"exit_code"`
	Stdout          string      `json:"stdout"`
	Stderr          string      `json:"stderr"`
	StdoutTruncated bool        `json:"stdout_truncated,omitempty"`
	StderrTruncated bool        `json:"stderr_truncated,omitempty"`
	OutputFiles     []ExecFile  `json:"output_files"`
	// Error says why the call did not succeed: a timeout, a full output,
	// a sandbox that could not start.
	Error string `json:"error,omitempty"`
}

// ExecFile is a file the command wrote to /workspace/output/, stored as an
// attachment a caller can download or pass on.
type ExecFile struct {
	Name         string `json:"name"`
	Size         int64  `json:"size"`
	Type         string `json:"type"`
	AttachmentID string `json:"attachment_id,omitempty"`
	// Note says why a file has no attachment (over the size limit).
	Note string `json:"note,omitempty"`
}

// SessionExecRequest is workspace_exec: a command run with sh -c in a
// running session.
type SessionExecRequest struct {
	SessionID      string `json:"session_id"`
	Command        string `json:"command"`
	Cwd            string `json:"cwd,omitempty"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty"`
}

// SessionRequest names a session: suspend_session's and resume_session's
// arguments.
type SessionRequest struct {
	SessionID string `json:"session_id"`
}

// ForkSessionRequest is fork_session's arguments: the session and how many
// forks to make of it (default 1).
type ForkSessionRequest struct {
	SessionID string `json:"session_id"`
	Count     int    `json:"count,omitempty"`
}

// SessionExecResult is how a workspace_exec command ended, with its output
// cut at the server's limit (and saying so).
type SessionExecResult struct {
	ExitCode        int    `json:"exit_code"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	DurationMS      int64  `json:"duration_ms"`
	Error           string `json:"error,omitempty"`
}

// MaxSessionExecOutput bounds the stdout and the stderr a workspace_exec
// answer holds, each.
const MaxSessionExecOutput = 1 << 20
