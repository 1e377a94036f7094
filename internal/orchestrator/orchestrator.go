package orchestrator

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/library"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

// Limits bound what callers and workers may do with tasks (the library
// has its own).
type Limits struct {
	MaxPromptBytes    int64
	MaxContextBytes   int64
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
	// Library places a new task's context (attachments, documents, skills,
	// shared files) and stores code_execute's output files; required.
	Library  *library.Library
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
	// Sessions says whether a session runs, for a task that runs its
	// commands in one; nil: sessions are off.
	Sessions interface{ Running(id string) error }
	Agents   map[string]workerproto.AgentConfig
	// AgentMissing says why an agent cannot run here ("" if it can), e.g. its
	// binary is not installed; checked at spawn on the host runtimes (the
	// image runtimes find out when the task starts, and say so).
	AgentMissing func(name string, cfg workerproto.AgentConfig) string
	// AgentCredentials says what an agent's configured environment lacks
	// to authenticate with its model API ("" if nothing), on any runtime:
	// its CLI would start and fail on its first request, asking for a
	// login no sandbox can give it. Nil: not checked.
	AgentCredentials func(name string, cfg workerproto.AgentConfig) string
	// CheckAllow checks a task's own egress allowlist (network_allow):
	// entries the proxy reads, within what the operator lets a task ask.
	// Nil: no task may have one.
	CheckAllow func(entries []string) error
	// Credentials name the egress credential rules a task may ask for
	// (those given on request).
	Credentials []string
	// NetworkChanged, if set, is called with a task whose network policy
	// SetNetwork changed, for this server's egress to follow it at once
	// (the others follow the log).
	NetworkChanged func(task.Task)
	// Admit, if set, is asked at each spawn whether the new task may be
	// given its replica in the spawn's own commit (scheduler.Admit): if
	// so, it returns the task_starting to record after task_queued, and
	// done, called once that commit is applied or has failed.
	Admit func(task.Spec) (starting eventstore.Proposed, done func(), ok bool)
}

// Images are the images tasks on the image runtimes run: Default for a task
// that names none, and the glob patterns (path.Match) one of which every
// image must match (none: any image).
type Images struct {
	Default string
	Allowed []string
}

// Orchestrator implements service.Tasks over the event store, the task
// projection and the data root, with the library placing what a new task
// is given. It is safe for concurrent use.
type Orchestrator struct {
	lib   *library.Library
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

var _ service.Tasks = (*Orchestrator)(nil)

// New returns an Orchestrator.
func New(opts Options, log *slog.Logger) *Orchestrator {
	if opts.Admit == nil {
		opts.Admit = func(task.Spec) (eventstore.Proposed, func(), bool) { return eventstore.Proposed{}, nil, false }
	}
	return &Orchestrator{lib: opts.Library, opts: opts, store: opts.Store, tasks: opts.Tasks, data: opts.Data, log: log}
}

// Get returns a task.
func (o *Orchestrator) Get(ctx context.Context, id string) (task.Task, error) {
	if err := task.CheckID(id); err != nil {
		return task.Task{}, err
	}
	return o.tasks.Lookup(ctx, id)
}
