// Package orchestratortest builds the server's task and library use cases
// for the tests of what serves them: a real orchestrator and library over
// a SQLite store and a data root in a temporary directory, without a
// scheduler (tasks stay queued) and without sessions.
package orchestratortest

import (
	"log/slog"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/attachment"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/library"
	"github.com/corral-dev/corral/internal/orchestrator"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/projection/projectiontest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

// Fixture is a real orchestrator and library over one store and data root.
type Fixture struct {
	Orch    *orchestrator.Orchestrator
	Library *library.Library
	Tasks   *projection.Tasks
	Store   eventstore.Store
	Data    *workspace.DataRoot
}

// Set returns the fixture's use cases: tasks and the library, no sessions.
func (f *Fixture) Set() service.Set { return service.Set{Tasks: f.Orch, Library: f.Library} }

// New makes a Fixture in a temporary directory; edit may change the
// orchestrator's options before it is built.
func New(tb testing.TB, edit func(*orchestrator.Options)) *Fixture {
	tb.Helper()
	log := slog.New(slog.DiscardHandler)
	env := projectiontest.New(tb)
	store, tasks, data := env.Store, env.Tasks, env.Data
	attRoot, err := data.Root().OpenRoot(workspace.DirAttachments)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { attRoot.Close() })
	lib := library.New(library.Options{
		Store: store, Tasks: tasks, Data: data,
		Attachments: attachment.New(attRoot, attachment.Options{MaxFileBytes: 1 << 20}),
		Limits:      library.Limits{MaxTaskDirBytes: 1 << 20, MaxContextBytes: 1 << 20, MaxReadBytes: 256 << 10, MaxWriteBytes: 1 << 20},
	}, log)
	opts := orchestrator.Options{
		Store:   store,
		Tasks:   tasks,
		Data:    data,
		Library: lib,
		Limits: orchestrator.Limits{
			MaxPromptBytes:    10000,
			MaxContextBytes:   1 << 20,
			MaxQueued:         500,
			DefaultTimeoutMin: 30,
			MaxTimeoutMin:     120,
			StopGrace:         100 * time.Millisecond,
		},
		Defaults: orchestrator.Defaults{Agent: task.AgentClaude, Runtime: "local", Network: task.NetworkNone},
		Runtimes: map[string]string{"local": ""},
		Networks: map[string]string{task.NetworkNone: ""},
		Agents:   map[string]workerproto.AgentConfig{task.AgentClaude: {Binary: "/usr/local/bin/claude"}, task.AgentCommand: {}},
	}
	if edit != nil {
		edit(&opts)
	}
	return &Fixture{Orch: orchestrator.New(opts, log), Library: lib, Tasks: tasks, Store: store, Data: data}
}
