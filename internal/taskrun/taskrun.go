// Package taskrun is a task's life in a sandbox, as the scheduler drives
// it: the sandbox's spec (Prepare), its disk quota (TaskQuota), its egress
// proxy (RunEgress), the worker's reports (WorkerComplete, WorkerProgress)
// and its result (Collect, Reported), and the task directories found at
// start-up (Reconcile). The orchestrator spawns tasks; the
// scheduler starts them through a Runner.
package taskrun

import (
	"log/slog"
	"sync"

	"context"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

// Options configure a Runner.
type Options struct {
	Store eventstore.Store
	Tasks *projection.Tasks
	Data  *workspace.DataRoot
	// Projects are the named workspaces tasks work in; nil: projects/ of
	// Data alone.
	Projects *workspace.Projects
	Agents   map[string]workerproto.AgentConfig
	// Worker is how a sandbox starts the in-sandbox entrypoint.
	Worker WorkerOptions
	// Sessions grants a task working through a session a token of it;
	// nil: sessions are off.
	Sessions Sessions
	// Verifier checks the workers' webhooks.
	Verifier Verifier
	// Egress runs the proxies of tasks with network allowlist or open; nil
	// when the server runs none (such tasks then fail to start).
	Egress Egress
	// MaxLogBytes bounds each of a worker's log files.
	MaxLogBytes int64
	// MaxTaskDirBytes is a task directory's quota, checked once more when
	// its result is collected.
	MaxTaskDirBytes int64
	// AllowHooks leaves executable the git hooks a task leaves in its
	// workspace (workspaces.allow_hooks); they are listed either way.
	AllowHooks bool
}

// Runner runs tasks' sandboxes' lives. It is safe for concurrent use.
type Runner struct {
	opts  Options
	store eventstore.Store
	tasks *projection.Tasks
	data  *workspace.DataRoot
	log   *slog.Logger

	// egressApplied holds, for each task proxy opened here, the policy
	// it has (policyKey).
	egressMu      sync.Mutex
	egressApplied map[string]string
}

// New returns a Runner.
func New(opts Options, log *slog.Logger) *Runner {
	if opts.Projects == nil && opts.Data != nil {
		opts.Projects, _ = workspace.NewProjects(opts.Data, nil) // no roots: nothing to refuse
	}
	return &Runner{opts: opts, store: opts.Store, tasks: opts.Tasks, data: opts.Data, log: log, egressApplied: map[string]string{}}
}

// Sessions is what taskrun needs of the session manager.
type Sessions interface {
	Grant(ctx context.Context, sessionID, taskID string) (string, error)
}
