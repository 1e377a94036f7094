package projection

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
	"github.com/corral-dev/corral/internal/task"
)

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// MustRun runs p until the test ends.
func MustRun(tb testing.TB, p *Tasks) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("Run: %v", err)
		}
	})
}

func created(spec task.Spec) eventstore.Proposed {
	return NewEvent(task.EventCreated, task.Created{Spec: spec}, "test")
}

func ev(typ string) eventstore.Proposed { return NewEvent(typ, nil, "test") }

// MustCreate records a queued task and returns it.
func MustCreate(tb testing.TB, p *Tasks, spec task.Spec) task.Task {
	tb.Helper()
	t, err := p.Create(context.Background(), task.NewID(), created(spec), ev(task.EventQueued))
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

// mustList is p.List, failing the test on an error.
func mustList(tb testing.TB, p *Tasks, f Filter) ([]task.Task, bool) {
	tb.Helper()
	ts, more, err := p.List(f)
	if err != nil {
		tb.Fatalf("List(%+v): %v", f, err)
	}
	return ts, more
}

func ids(ts []task.Task) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.ID)
	}
	return out
}

func TestCreateAndGet(t *testing.T) {
	p := New(sqlitetest.Open(t), discard())
	tk := MustCreate(t, p, task.Spec{Description: "hello", Agent: task.AgentCommand})
	if tk.Status != task.Queued || tk.Version != 2 || tk.Description != "hello" || tk.QueueSeq != 2 {
		t.Errorf("Create returned %+v", tk)
	}
	got, err := p.Get(tk.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(tk, got); diff != "" {
		t.Errorf("Get differs from Create's result (-create +get):\n%s", diff)
	}
	if _, err := p.Get(task.NewID()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get(unknown) = %v, want ErrNotFound", err)
	}
}

func TestCreateOnExistingStreamConflicts(t *testing.T) {
	p := New(sqlitetest.Open(t), discard())
	tk := MustCreate(t, p, task.Spec{Description: "first"})
	_, err := p.Create(context.Background(), tk.ID, created(task.Spec{Description: "second"}))
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second Create = %v, want ErrConflict", err)
	}
	got, _ := p.Get(tk.ID)
	if got.Description != "first" || got.Version != 2 {
		t.Errorf("task changed after a refused create: %+v", got)
	}
}

func TestRebuild(t *testing.T) {
	store := sqlitetest.Open(t)
	ctx := context.Background()
	p := New(store, discard())
	a := MustCreate(t, p, task.Spec{Description: "a", IdempotencyKey: "ka"})
	b := MustCreate(t, p, task.Spec{Description: "b"})
	c := MustCreate(t, p, task.Spec{Description: "c"})
	for _, typ := range []string{task.EventStarting, task.EventStarted} {
		if _, err := p.Update(ctx, b.ID, func(task.Task) ([]eventstore.Proposed, error) {
			return []eventstore.Proposed{NewEvent(typ, task.Started{SandboxName: "sb"}, "test")}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Update(ctx, c.ID, func(task.Task) ([]eventstore.Proposed, error) {
		return []eventstore.Proposed{NewEvent(task.EventCompleted, task.Completed{Status: task.Cancelled}, "test")}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, task.SystemStream, eventstore.AnyVersion, ev(task.EventReconciled)); err != nil {
		t.Fatal(err)
	}

	q := New(store, discard())
	if err := q.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	if q.Position() != p.Position()+1 || q.Position() != 10 {
		t.Errorf("rebuilt position %d, live %d; want 10", q.Position(), p.Position())
	}
	want, _ := mustList(t, p, Filter{})
	got, _ := mustList(t, q, Filter{})
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rebuilt state differs (-live +rebuilt):\n%s", diff)
	}
	if diff := cmp.Diff(map[task.Status]int{task.Queued: 1, task.Running: 1, task.Cancelled: 1}, q.Counts()); diff != "" {
		t.Errorf("Counts (-want +got):\n%s", diff)
	}
	if k, ok, err := q.ByIdempotencyKey("ka"); !ok || err != nil || k.ID != a.ID {
		t.Errorf("ByIdempotencyKey(ka) after rebuild = %s, %v, %v; want %s", k.ID, ok, err, a.ID)
	}
	if bt, _ := q.Get(b.ID); bt.Status != task.Running || bt.SandboxName != "sb" {
		t.Errorf("rebuilt b = %+v", bt)
	}
}

// failingReads is a store whose ReadAll fails from its nth call on.
type failingReads struct {
	eventstore.Store
	n, calls int
}

var errRead = errors.New("disk read error")

func (s *failingReads) ReadAll(ctx context.Context, after int64, limit int) ([]eventstore.Event, error) {
	if s.calls++; s.calls >= s.n {
		return nil, errRead
	}
	return s.Store.ReadAll(ctx, after, limit)
}

// TestRebuildReadError: a read that fails while the log is read ahead of
// the fold fails the rebuild, after the batches read before it are
// applied, and leaves no goroutine behind (TestMain's goleak).
func TestRebuildReadError(t *testing.T) {
	store := sqlitetest.Open(t)
	p := New(store, discard())
	MustCreate(t, p, task.Spec{Description: "a"})
	q := New(&failingReads{Store: store, n: 2}, discard())
	if err := q.Rebuild(context.Background()); !errors.Is(err, errRead) {
		t.Fatalf("Rebuild = %v, want the read's error", err)
	}
	if q.Position() != p.Position() {
		t.Errorf("position %d after the failed rebuild, want %d: the first batch applied", q.Position(), p.Position())
	}
}

func TestUnknownTaskEventsSkipped(t *testing.T) {
	store := sqlitetest.Open(t)
	ctx := context.Background()
	ghost := task.NewID()
	if _, err := store.Append(ctx, task.StreamID(ghost), 0, ev(task.EventQueued), ev(task.EventStarting)); err != nil {
		t.Fatal(err)
	}
	// A stream that is not a task's, and a version gap the fold refuses.
	if _, err := store.Append(ctx, "session/s1", 0, ev("session_started")); err != nil {
		t.Fatal(err)
	}
	p := New(store, discard())
	kept := MustCreate(t, p, task.Spec{Description: "kept"})
	if err := p.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ghost); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get(ghost) = %v, want ErrNotFound", err)
	}
	if p.Position() != 5 {
		t.Errorf("position = %d, want 5 (skipped events still advance it)", p.Position())
	}
	if got, _ := mustList(t, p, Filter{}); len(got) != 1 || got[0].ID != kept.ID {
		t.Errorf("List = %v, want only %s", ids(got), kept.ID)
	}
}

func TestUpdateRace(t *testing.T) {
	p := New(sqlitetest.Open(t), discard())
	ctx := context.Background()
	tk := MustCreate(t, p, task.Spec{Description: "race"})

	var firstCalls sync.WaitGroup
	firstCalls.Add(2)
	var wins, noChange, calls atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			_, err := p.Update(ctx, tk.ID, func(cur task.Task) ([]eventstore.Proposed, error) {
				calls.Add(1)
				if first {
					// Both writers decide on the same queued task before
					// either appends, so one must hit a version conflict.
					first = false
					firstCalls.Done()
					firstCalls.Wait()
				}
				if cur.Status != task.Queued {
					noChange.Add(1)
					return nil, ErrNoChange
				}
				return []eventstore.Proposed{ev(task.EventStarting)}, nil
			})
			if err != nil {
				t.Errorf("Update: %v", err)
				return
			}
			wins.Add(1)
		}()
	}
	wg.Wait()
	if wins.Load() != 2 || noChange.Load() != 1 || calls.Load() != 3 {
		t.Errorf("updates returned %d, decisions %d, no-change %d; want 2, 3, 1", wins.Load(), calls.Load(), noChange.Load())
	}
	evs, err := p.store.ReadStream(ctx, task.StreamID(tk.ID), 0)
	if err != nil {
		t.Fatal(err)
	}
	var starting int
	for _, e := range evs {
		if e.Type == task.EventStarting {
			starting++
		}
	}
	if starting != 1 {
		t.Errorf("%d task_starting events, want exactly 1", starting)
	}
	if got, _ := p.Get(tk.ID); got.Status != task.Starting || got.Version != 3 {
		t.Errorf("task = %s v%d, want starting v3", got.Status, got.Version)
	}
}

func TestUpdateDecisionError(t *testing.T) {
	p := New(sqlitetest.Open(t), discard())
	tk := MustCreate(t, p, task.Spec{})
	boom := errors.New("boom")
	got, err := p.Update(context.Background(), tk.ID, func(task.Task) ([]eventstore.Proposed, error) { return nil, boom })
	if !errors.Is(err, boom) || got.Version != 2 {
		t.Errorf("Update = v%d, %v; want v2, boom", got.Version, err)
	}
	got, err = p.Update(context.Background(), tk.ID, func(task.Task) ([]eventstore.Proposed, error) { return nil, nil })
	if err != nil || got.Version != 2 {
		t.Errorf("Update with no events = v%d, %v; want v2, nil", got.Version, err)
	}
	if _, err := p.Update(context.Background(), task.NewID(), func(task.Task) ([]eventstore.Proposed, error) {
		t.Error("decide called for an unknown task")
		return nil, nil
	}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Update(unknown) = %v, want ErrNotFound", err)
	}
}

func TestListAndCursor(t *testing.T) {
	p := New(sqlitetest.Open(t), discard())
	ctx := context.Background()
	var all []task.Task
	for i := 0; i < 5; i++ {
		conv := "c1"
		if i%2 == 1 {
			conv = "c2"
		}
		all = append(all, MustCreate(t, p, task.Spec{Description: "t", Origin: task.Origin{ConversationID: conv}}))
	}
	if _, err := p.Update(ctx, all[1].ID, func(task.Task) ([]eventstore.Proposed, error) {
		return []eventstore.Proposed{NewEvent(task.EventCompleted, task.Completed{Status: task.Cancelled}, "test")}, nil
	}); err != nil {
		t.Fatal(err)
	}
	newestFirst := []string{all[4].ID, all[3].ID, all[2].ID, all[1].ID, all[0].ID}

	got, more := mustList(t, p, Filter{})
	if diff := cmp.Diff(newestFirst, ids(got)); diff != "" || more {
		t.Errorf("List all, more=%v (-want +got):\n%s", more, diff)
	}
	got, more = mustList(t, p, Filter{Limit: 2})
	if diff := cmp.Diff(newestFirst[:2], ids(got)); diff != "" || !more {
		t.Errorf("List limit 2, more=%v (-want +got):\n%s", more, diff)
	}
	got, more = mustList(t, p, Filter{Limit: 2, Before: got[1].ID})
	if diff := cmp.Diff(newestFirst[2:4], ids(got)); diff != "" || !more {
		t.Errorf("second page, more=%v (-want +got):\n%s", more, diff)
	}
	got, more = mustList(t, p, Filter{Limit: 2, Before: got[1].ID})
	if diff := cmp.Diff(newestFirst[4:], ids(got)); diff != "" || more {
		t.Errorf("last page, more=%v (-want +got):\n%s", more, diff)
	}
	got, _ = mustList(t, p, Filter{ConversationID: "c2"})
	if diff := cmp.Diff([]string{all[3].ID, all[1].ID}, ids(got)); diff != "" {
		t.Errorf("conversation c2 (-want +got):\n%s", diff)
	}
	got, _ = mustList(t, p, Filter{Status: task.Queued, ConversationID: "c2"})
	if diff := cmp.Diff([]string{all[3].ID}, ids(got)); diff != "" {
		t.Errorf("queued in c2 (-want +got):\n%s", diff)
	}
	got, _ = mustList(t, p, Filter{Status: task.Cancelled})
	if diff := cmp.Diff([]string{all[1].ID}, ids(got)); diff != "" {
		t.Errorf("cancelled (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[task.Status]int{task.Queued: 4, task.Cancelled: 1}, p.Counts()); diff != "" {
		t.Errorf("Counts (-want +got):\n%s", diff)
	}
}

func TestByIdempotencyKey(t *testing.T) {
	p := New(sqlitetest.Open(t), discard())
	a := MustCreate(t, p, task.Spec{IdempotencyKey: "k1"})
	MustCreate(t, p, task.Spec{})
	got, ok, err := p.ByIdempotencyKey("k1")
	if err != nil {
		t.Fatal(err)
	}
	if !ok || got.ID != a.ID {
		t.Errorf("ByIdempotencyKey(k1) = %s, %v; want %s", got.ID, ok, a.ID)
	}
	if _, ok, _ := p.ByIdempotencyKey("k2"); ok {
		t.Error("ByIdempotencyKey(k2) found a task")
	}
	if _, ok, _ := p.ByIdempotencyKey(""); ok {
		t.Error("ByIdempotencyKey(\"\") found a task without a key")
	}
}

func TestSelectQueueOrder(t *testing.T) {
	p := New(sqlitetest.Open(t), discard())
	ctx := context.Background()
	var made []string
	for i := 0; i < 3; i++ {
		id := task.NewID()
		if _, err := p.Create(ctx, id, created(task.Spec{})); err != nil {
			t.Fatal(err)
		}
		made = append(made, id)
	}
	// Queue them in the order 2, 0, 1: the queue follows that, not the ids.
	for _, i := range []int{2, 0, 1} {
		if _, err := p.Update(ctx, made[i], func(task.Task) ([]eventstore.Proposed, error) {
			return []eventstore.Proposed{ev(task.EventQueued)}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	pending := MustCreate(t, p, task.Spec{})
	got := p.Select(func(t *task.Task) bool { return t.Status == task.Queued && t.ID != pending.ID })
	if diff := cmp.Diff([]string{made[2], made[0], made[1]}, ids(got)); diff != "" {
		t.Errorf("Select order (-want +got):\n%s", diff)
	}
	if got := p.Select(func(*task.Task) bool { return false }); len(got) != 0 {
		t.Errorf("Select(none) = %v", ids(got))
	}
}

func TestRunAndWaitPosition(t *testing.T) {
	store := sqlitetest.Open(t)
	p := New(store, discard())
	MustRun(t, p)
	ctx := context.Background()
	id := task.NewID()
	changed := p.Changed()
	// Appended by another writer, straight to the store: Run applies it.
	evs, err := store.Append(ctx, task.StreamID(id), 0, created(task.Spec{Description: "live"}), ev(task.EventQueued))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.WaitPosition(wctx, evs[1].Position); err != nil {
		t.Fatalf("WaitPosition: %v", err)
	}
	select {
	case <-changed:
	default:
		t.Error("Changed channel not closed after an apply")
	}
	if got, err := p.Get(id); err != nil || got.Status != task.Queued {
		t.Errorf("Get after WaitPosition = %s, %v", got.Status, err)
	}
	// A position nobody wrote: WaitPosition gives up with ctx.
	short, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	if err := p.WaitPosition(short, evs[1].Position+1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitPosition(future) = %v, want DeadlineExceeded", err)
	}
	// Already applied: returns at once even with a done ctx.
	done, cancel3 := context.WithCancel(ctx)
	cancel3()
	if err := p.WaitPosition(done, evs[0].Position); err != nil {
		t.Errorf("WaitPosition(past, done ctx) = %v", err)
	}
}

func TestNewEvent(t *testing.T) {
	e := NewEvent(task.EventCancelRequested, task.CancelRequested{Reason: "r"}, "me")
	if e.Type != task.EventCancelRequested || e.Actor != "me" || e.SchemaVersion != task.SchemaVersion || string(e.Data) != `{"reason":"r"}` {
		t.Errorf("NewEvent = %+v (data %s)", e, e.Data)
	}
	if e := NewEvent(task.EventQueued, nil, "me"); string(e.Data) != "{}" {
		t.Errorf("NewEvent(nil payload).Data = %s, want {}", e.Data)
	}
}
