package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workspace"
)

// Exec configures code_execute (the seed's execution section).
type Exec struct {
	// Disabled refuses code_execute with errdefs.ErrUnavailable.
	Disabled bool
	// DefaultImage is the image of a call on an image runtime that names
	// none; "" falls back on Images.Default.
	DefaultImage string
	// AllowedImages are the glob patterns a call's image must match;
	// empty: Images.Allowed.
	AllowedImages []string
	// DefaultTimeout is a call's limit when it gives none; default 60 s.
	DefaultTimeout time.Duration
	// MaxOutputBytes bounds the stdout and the stderr returned, each;
	// default 1 MiB.
	MaxOutputBytes int64
	// MaxMemoryBytes is a call's memory limit; 0: the workers' default.
	MaxMemoryBytes int64
	// NetworkEnabled lets a call ask for the network.
	NetworkEnabled bool
}

// The sandbox's view of a code_execute call: where it starts, where its
// inputs are and where its outputs are taken from.
const (
	execWorkDir = "/workspace"
)

// Execute runs req.Command once with `sh -c` in a fresh sandbox, as a task
// of kind exec, waits for it to end and returns its output, with the files
// it wrote to /workspace/output/ stored as attachments.
func (o *Orchestrator) Execute(ctx context.Context, req service.ExecRequest) (service.ExecResult, error) {
	if o.opts.Exec.Disabled {
		return service.ExecResult{}, fmt.Errorf("code_execute is disabled on this server (execution.enabled: false): %w", errdefs.ErrUnavailable)
	}
	timeout, err := o.checkExec(&req)
	if err != nil {
		return service.ExecResult{}, err
	}
	network := "none"
	if req.Network {
		network = o.opts.Defaults.Network
	}
	sreq := service.SpawnRequest{
		TaskDescription: "code_execute: " + req.Command,
		Agent:           task.AgentCommand,
		// The working directory is an argument, never part of the script.
		Command:        []string{"/bin/sh", "-c", `cd -- "$1" && exec /bin/sh -c "$2"`, "sh", req.WorkingDir, req.Command},
		TimeoutMinutes: new(int((timeout + time.Minute - 1) / time.Minute)),
		Runtime:        req.Runtime,
		Image:          req.Image,
		Network:        network,
		AttachmentIDs:  req.AttachmentIDs,
		ContextFiles:   req.ContextFiles,
		ConversationID: req.ConversationID,
		Labels:         req.Labels,
	}
	runtime := req.Runtime
	if runtime == "" {
		runtime = o.opts.Defaults.Runtime
	}
	if sreq.Image == "" && rtkind.RunsImages(runtime) {
		sreq.Image = o.opts.Exec.DefaultImage
	}
	allowed := o.opts.Exec.AllowedImages
	if len(allowed) == 0 {
		allowed = o.opts.Images.Allowed
	}
	t, _, err := o.spawn(ctx, sreq, allowed, func(s *task.Spec) {
		s.Kind = task.KindExec
		s.TimeoutSeconds = int(timeout / time.Second)
		if m := o.opts.Exec.MaxMemoryBytes; m > 0 {
			s.Resources.MemoryBytes = m
		}
	})
	if err != nil {
		return service.ExecResult{}, err
	}
	// The scheduler ends the task at its timeout; the margin is for the
	// queue and the sandbox's start and end.
	if t, err = o.waitEnded(ctx, t.ID, timeout+2*time.Minute); err != nil {
		return service.ExecResult{}, err
	}
	return o.execResult(ctx, t)
}

// checkExec validates a call and fills in its defaults; it returns the
// call's timeout.
func (o *Orchestrator) checkExec(req *service.ExecRequest) (time.Duration, error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, errdefs.Field(field, fmt.Sprintf(format, args...)))
	}
	switch {
	case strings.TrimSpace(req.Command) == "":
		bad("command", "is required and must not be blank")
	case !utf8.ValidString(req.Command) || strings.ContainsRune(req.Command, 0):
		bad("command", "must be UTF-8 text without NUL bytes")
	case len(req.Command) > maxArgBytes:
		bad("command", "is %d bytes, over the limit of %d", len(req.Command), maxArgBytes)
	}
	if req.WorkingDir == "" {
		req.WorkingDir = execWorkDir
	}
	if !path.IsAbs(req.WorkingDir) || path.Clean(req.WorkingDir) != req.WorkingDir || strings.ContainsRune(req.WorkingDir, 0) || len(req.WorkingDir) > 4096 {
		bad("working_dir", "must be an absolute, clean path inside the sandbox, such as /workspace/input")
	}
	timeout := o.opts.Exec.DefaultTimeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	if req.TimeoutSeconds != 0 {
		if req.TimeoutSeconds < 1 || req.TimeoutSeconds > service.MaxExecTimeout {
			bad("timeout_seconds", "must be between 1 and %d, got %d", service.MaxExecTimeout, req.TimeoutSeconds)
		}
		timeout = time.Duration(req.TimeoutSeconds) * time.Second
	}
	if req.Network && !o.opts.Exec.NetworkEnabled {
		errs = append(errs, &errdefs.FieldError{Field: "network", Err: fmt.Errorf("is off for code_execute on this server (execution.network_enabled: false): %w", errdefs.ErrFailedPrecondition)})
	}
	runtime := req.Runtime
	if runtime == "" {
		runtime = o.opts.Defaults.Runtime
	}
	if req.Image != "" && !rtkind.RunsImages(runtime) {
		errs = append(errs, &errdefs.FieldError{Field: "image", Err: fmt.Errorf("the %s runtime runs commands on the host's /usr and takes no image; use runtime docker for an image: %w", runtime, errdefs.ErrFailedPrecondition)})
	}
	return timeout, errors.Join(errs...)
}

// execResult is the answer to a code_execute call whose task t ended.
func (o *Orchestrator) execResult(ctx context.Context, t task.Task) (service.ExecResult, error) {
	res := service.ExecResult{TaskID: t.ID, Status: t.Status, Success: t.Status == task.Success, ExitCode: t.ExitCode, OutputFiles: []service.ExecFile{}}
	if !res.Success {
		res.Error = t.ErrorMessage
	}
	max := o.opts.Exec.MaxOutputBytes
	if max <= 0 {
		max = 1 << 20
	}
	dir, err := o.data.OpenTask(t.ID)
	if err != nil {
		return service.ExecResult{}, err
	}
	defer dir.Close()
	res.Stdout, res.StdoutTruncated = readBounded(dir, "logs/stdout.log", max)
	res.Stderr, res.StderrTruncated = readBounded(dir, "logs/stderr.log", max)
	for _, f := range t.OutputFiles {
		ef := service.ExecFile{Name: f.Name, Size: f.Size, Type: f.Type}
		m, err := o.lib.CreateAttachmentFromWorkspace(ctx, service.CreateAttachmentRequest{
			SourcePath: "tasks/" + t.ID + "/output/" + f.Name, Description: "output of code_execute " + t.ID})
		if err != nil {
			ef.Note = "not stored as an attachment: " + err.Error()
		} else {
			ef.AttachmentID = m.ID
		}
		res.OutputFiles = append(res.OutputFiles, ef)
	}
	return res, nil
}

// readBounded reads at most max bytes of the task file name, as text, and
// says whether there was more. A missing file reads as empty.
func readBounded(dir *os.Root, name string, max int64) (string, bool) {
	f, _, err := workspace.OpenFile(dir, name)
	if err != nil {
		return "", false
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, max+1))
	cut := int64(len(b)) > max
	if cut {
		b = b[:max]
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), cut
}
