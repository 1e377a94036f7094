package orchestrator

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/attachment"
	"github.com/corral-dev/corral/internal/document"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/library"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

// Limits bound what callers and workers may do.
type Limits struct {
	MaxPromptBytes    int64
	MaxTaskDirBytes   int64
	MaxContextBytes   int64
	MaxReadBytes      int64 // file contents returned by read_workspace and results
	MaxWriteBytes     int64 // content accepted by write_workspace
	MaxSharedBytes    int64 // total size of shared/; 0 means no limit
	MinFreeBytes      int64 // the data root's free-space floor; 0 means none
	MaxQueued         int
	DefaultTimeoutMin int
	MaxTimeoutMin     int
	StopGrace         time.Duration
}

// Defaults fill what a spawn request leaves out.
type Defaults struct {
	Agent     string
	Runtime   string
	Network   string
	Resources task.Resources
}

// Options configure an Orchestrator.
type Options struct {
	// Disabled refuses new tasks (ai_worker_config.enabled: false) with
	// errdefs.ErrUnavailable; everything else keeps working.
	Disabled bool
	Store    eventstore.Store
	Tasks    *projection.Tasks
	Data     *workspace.DataRoot
	Limits   Limits
	Defaults Defaults
	// Runtimes maps each runtime name to why it cannot be used ("" if it can).
	Runtimes map[string]string
	// Networks maps each network policy to why it cannot be used ("" if it can).
	Networks map[string]string
	// NoEgress maps each runtime whose sandboxes cannot reach the egress
	// proxy to why: tasks there run with network none, by default and
	// only.
	NoEgress map[string]string
	// Images are the images tasks on the image runtimes (docker,
	// kubernetes) run.
	Images Images
	// Exec configures code_execute.
	Exec Exec
	// Sessions runs workspace_exec; nil: sessions are off.
	Sessions SessionExecutor
	Agents   map[string]workerproto.AgentConfig
	// AgentMissing says why an agent cannot run here ("" if it can), e.g. its
	// binary is not installed; checked at spawn on the host runtimes (the
	// image runtimes find out when the task starts, and say so).
	AgentMissing func(name string, cfg workerproto.AgentConfig) string
	// Documents is the document index; nil turns documents and notes off.
	Documents *document.Index
	// Attachments stores attachments; nil turns them off.
	Attachments *attachment.Store
	// Retention says how long ended tasks' directories and unused
	// attachments are kept, and how often the sweeper looks.
	Retention library.Retention
	// Projects are the named workspaces; nil: projects/ of the data root
	// alone.
	Projects *workspace.Projects
	// Now is the clock of retention and save_to_shared; nil means time.Now.
	Now func() time.Time
}

// SessionExecutor runs a command in a session (the session manager).
type SessionExecutor interface {
	// Running returns nil if the session runs, else why not.
	Running(id string) error
	ExecBounded(ctx context.Context, req service.SessionExecRequest, max int, onOutput func(stream string, data []byte)) (service.SessionExecResult, error)
}

// SessionExec runs workspace_exec through the session manager.
func (o *Orchestrator) SessionExec(ctx context.Context, req service.SessionExecRequest, onOutput func(stream string, data []byte)) (service.SessionExecResult, error) {
	if o.opts.Sessions == nil {
		return service.SessionExecResult{}, fmt.Errorf("sessions are not served here: %w", errdefs.ErrNotImplemented)
	}
	return o.opts.Sessions.ExecBounded(ctx, req, service.MaxSessionExecOutput, onOutput)
}

// Images are the images tasks on the image runtimes run: Default for a task
// that names none, and the glob patterns (path.Match) one of which every
// image must match (none: any image).
type Images struct {
	Default string
	Allowed []string
}

// Orchestrator implements service.Service over the event store, the task
// projection and the data root: the tasks' use cases here, the library's
// (files, attachments, documents, skills, retention) through the embedded
// Library. It is safe for concurrent use.
type Orchestrator struct {
	*library.Library
	opts  Options
	store eventstore.Store
	tasks *projection.Tasks
	data  *workspace.DataRoot
	log   *slog.Logger

	spawnMu sync.Mutex // serialises spawns that carry an idempotency key
	// queueMu guards spawning, the tasks of spawns past the queue check
	// (reserveQueueSlot).
	queueMu  sync.Mutex
	spawning map[string]bool
}

var _ service.Service = (*Orchestrator)(nil)

// New returns an Orchestrator.
func New(opts Options, log *slog.Logger) *Orchestrator {
	l := opts.Limits
	lib := library.New(library.Options{
		Store: opts.Store, Tasks: opts.Tasks, Data: opts.Data, Projects: opts.Projects,
		Limits: library.Limits{MaxTaskDirBytes: l.MaxTaskDirBytes, MaxContextBytes: l.MaxContextBytes, MaxReadBytes: l.MaxReadBytes,
			MaxWriteBytes: l.MaxWriteBytes, MaxSharedBytes: l.MaxSharedBytes, MinFreeBytes: l.MinFreeBytes},
		Documents: opts.Documents, Attachments: opts.Attachments, Retention: opts.Retention, Now: opts.Now,
	}, log)
	return &Orchestrator{Library: lib, opts: opts, store: opts.Store, tasks: opts.Tasks, data: opts.Data, log: log}
}

// Get returns a task.
func (o *Orchestrator) Get(ctx context.Context, id string) (task.Task, error) {
	if err := task.CheckID(id); err != nil {
		return task.Task{}, err
	}
	return o.tasks.Get(id)
}
