// Package projectiontest makes what the use cases' tests stand on: a real
// event store, the task projection over it and a data root, in temporary
// directories, closed when the test ends.
package projectiontest

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/sqlite"
	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workspace"
)

// Env is an event store, its task projection and a data root.
type Env struct {
	Store *sqlite.Store
	Tasks *projection.Tasks
	Data  *workspace.DataRoot
}

// New makes an Env. Its projection answers from the log as it is read;
// Follow runs it as the server does.
func New(tb testing.TB) *Env {
	tb.Helper()
	store := sqlitetest.Open(tb)
	data, err := workspace.Open(filepath.Join(tb.TempDir(), "data"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { data.Close() })
	return &Env{Store: store, Tasks: projection.New(store, slog.New(slog.DiscardHandler)), Data: data}
}

// Follow runs the projection (projection.Tasks.Run) until the test ends.
func (e *Env) Follow(tb testing.TB) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Tasks.Run(ctx)
	}()
	tb.Cleanup(func() {
		cancel()
		<-done
	})
}

// MustAppend appends evs to task id's stream at its current version.
func MustAppend(tb testing.TB, tasks *projection.Tasks, id string, evs ...eventstore.Proposed) task.Task {
	tb.Helper()
	t, err := tasks.Update(context.Background(), id, func(task.Task) ([]eventstore.Proposed, error) { return evs, nil })
	if err != nil {
		tb.Fatal(err)
	}
	return t
}
