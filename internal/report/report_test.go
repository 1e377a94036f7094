package report

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/task"
)

// A server shutting down while Run reads the log it has not caught up
// with is not an error (TestBearerToken's server ended with "read events
// to report: context canceled").
func TestRunEndsQuietlyWhenCancelled(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	store := sqlitetest.Open(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Run(ctx, store, log); err != nil {
		t.Errorf("Run with its context cancelled: %v, want nil", err)
	}
}

// countingStore counts the reads of single streams.
type countingStore struct {
	eventstore.Store
	streams atomic.Int64
}

func (s *countingStore) ReadStream(ctx context.Context, stream string, after int64) ([]eventstore.Event, error) {
	s.streams.Add(1)
	return s.Store.ReadStream(ctx, stream, after)
}

// TestReportsWorkspaceTasksOnly: a workspace task with an origin
// conversation has its end reported there, once; the end of any other
// task costs no read of its stream (Run knows them from their
// task_created events), which every task's end took before.
func TestReportsWorkspaceTasksOnly(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	db := sqlitetest.Open(t)
	store := &countingStore{Store: db}
	end := func(spec task.Spec) string {
		t.Helper()
		id := task.NewID()
		created := projection.NewEvent(task.EventCreated, task.Created{Spec: spec}, "test")
		ended := projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Cancelled, Reason: "cancel"}, "test")
		if _, err := db.Append(ctx, task.StreamID(id), 0, created, ended); err != nil {
			t.Fatal(err)
		}
		return id
	}
	for range 5 {
		end(task.Spec{Description: "plain"})
		end(task.Spec{Description: "in a workspace, asked from no conversation", Workspace: "w"})
		end(task.Spec{Description: "asked from a conversation", Origin: task.Origin{ConversationID: "c0"}})
	}
	reported := end(task.Spec{Description: "reported", Workspace: "w", Origin: task.Origin{ConversationID: "c1"}})

	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(ctx, store, log) }()
	var evs []eventstore.Event
	var err error
	for deadline := time.Now().Add(10 * time.Second); len(evs) < 2 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if evs, err = db.ReadStream(ctx, task.ConversationStreamID("c1"), 0); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var spawned task.WorkspaceTaskSpawned
	var r task.WorkspaceTaskReport
	if len(evs) != 2 || evs[0].Type != task.EventWorkspaceTaskSpawned || json.Unmarshal(evs[0].Data, &spawned) != nil || spawned.TaskID != reported ||
		evs[1].Type != task.EventWorkspaceTaskFailed || json.Unmarshal(evs[1].Data, &r) != nil || r.TaskID != reported {
		t.Fatalf("conversation c1's events: %+v, want the start and the end of %s", evs, reported)
	}
	if evs, _ := db.ReadStream(context.Background(), task.ConversationStreamID("c0"), 0); len(evs) != 0 {
		t.Errorf("conversation c0 of a task outside a workspace got %d events, want none", len(evs))
	}
	// Its conversation's (for the start), the reported task's, then its
	// conversation's again.
	if n := store.streams.Load(); n != 3 {
		t.Errorf("Run read %d streams, want 3: the reported task's and twice its conversation's", n)
	}
}

// caughtUp cancels when Run's first pass over the log finds no more.
type caughtUp struct {
	eventstore.Store
	cancel context.CancelFunc
}

func (s caughtUp) ReadAll(ctx context.Context, after int64, limit int) ([]eventstore.Event, error) {
	evs, err := s.Store.ReadAll(ctx, after, limit)
	if err == nil && len(evs) == 0 {
		s.cancel()
	}
	return evs, err
}

// BenchmarkCatchUp: Run's pass at start-up over a log of 1,000 ended
// tasks, none in a workspace (each created, then cancelled), per task.
//
//	go test -run '^$' -bench CatchUp ./internal/report/
func BenchmarkCatchUp(b *testing.B) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	db := sqlitetest.Open(b)
	const tasks = 1000
	for range tasks {
		created := projection.NewEvent(task.EventCreated, task.Created{Spec: task.Spec{Description: "plain", Agent: "command", Command: []string{"echo", "hi"}}}, "test")
		ended := projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Cancelled, Reason: "cancel"}, "test")
		if _, err := db.Append(ctx, task.StreamID(task.NewID()), 0, created, ended); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		ctx, cancel := context.WithCancel(ctx)
		if err := Run(ctx, caughtUp{db, cancel}, log); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*tasks)/1e3, "µs/task")
}
