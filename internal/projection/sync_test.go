package projection

import (
	"context"
	"errors"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
	"github.com/corral-dev/corral/internal/task"
)

// Two servers' projections over one store: a task one makes is unknown to
// the other's Get until it follows, and found by its Lookup at once.
func TestLookupFindsATaskMadeElsewhere(t *testing.T) {
	store := sqlitetest.Open(t)
	ctx := context.Background()
	here, there := New(store, discard()), New(store, discard())
	id := task.NewID()
	if _, err := there.Create(ctx, id, NewEvent(task.EventCreated, task.Created{}, "test")); err != nil {
		t.Fatal(err)
	}
	if _, err := here.Get(id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Get before following: %v, want not found", err)
	}
	got, err := here.Lookup(ctx, id)
	if err != nil || got.ID != id || got.Status != task.Pending {
		t.Errorf("Lookup: %+v, %v; want the task, pending", got, err)
	}
	if _, err := here.Lookup(ctx, task.NewID()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Lookup of a task no one made: %v, want not found", err)
	}
}
