package scheduler

import (
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/task"
)

// fakeMembers is a replica's view of a cluster that a test sets.
type fakeMembers struct {
	self string

	mu      sync.Mutex
	live    map[string]cluster.Replica
	steady  bool
	changed chan struct{}
}

func newMembers(self string, steady bool, live ...cluster.Replica) *fakeMembers {
	m := &fakeMembers{self: self, steady: steady, live: map[string]cluster.Replica{}, changed: make(chan struct{})}
	for _, r := range live {
		m.live[r.ID] = r
	}
	return m
}

func (m *fakeMembers) Self() string { return m.self }

func (m *fakeMembers) Live() map[string]cluster.Replica {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.live)
}

func (m *fakeMembers) Steady() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.steady
}

func (m *fakeMembers) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

func (m *fakeMembers) Lead(ctx context.Context, fn func(context.Context)) { fn(ctx) }

func (m *fakeMembers) Holding() bool { return true }

func (m *fakeMembers) Alive(id string) (cluster.Replica, bool) {
	r, ok := m.Live()[id]
	return r, ok
}

// set changes what the replica sees: who is alive, and whether it is
// steady.
func (m *fakeMembers) set(steady bool, live ...cluster.Replica) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.steady = steady
	m.live = map[string]cluster.Replica{}
	for _, r := range live {
		m.live[r.ID] = r
	}
	close(m.changed)
	m.changed = make(chan struct{})
}

// lead has h's scheduler lead until the test ends.
func lead(t *testing.T, h *harness) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.sched.Lead(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// Two replicas on one store share its queue: the leader gives each task
// to the less busy replica, max_concurrent_workers holds for both
// together, and every task runs once.
func TestReplicasShareTheQueueAndTheSlots(t *testing.T) {
	store := sqlitetest.Open(t)
	a := cluster.Replica{ID: "replica-a", Runtimes: []string{"fake"}}
	b := cluster.Replica{ID: "replica-b", Runtimes: []string{"fake"}}
	finish := make(chan struct{})
	var now, most atomic.Int32
	run := func(ctx context.Context, spec sandbox.Spec) sandbox.ExitStatus {
		n := now.Add(1)
		defer now.Add(-1)
		for cur := most.Load(); n > cur && !most.CompareAndSwap(cur, n); cur = most.Load() {
		}
		return runUntilFinished(finish)(ctx, spec)
	}
	fakeA, fakeB := MustNewFake(t, run), MustNewFake(t, run)
	ha := MustStart(t, store, Options{Members: newMembers(a.ID, true, a, b), MaxConcurrent: 3}, fakeA)
	hb := MustStart(t, store, Options{Members: newMembers(b.ID, true, a, b), MaxConcurrent: 3}, fakeB)
	lead(t, ha)

	var ids []string
	for range 8 {
		ids = append(ids, MustEnqueue(t, ha.tasks, task.Spec{}))
	}
	waitFor(t, "three tasks running", func() bool { return ha.tasks.Counts()[task.Running] == 3 })
	time.Sleep(300 * time.Millisecond) // a fourth would start now, if it could
	if n := len(fakeA.Created()) + len(fakeB.Created()); n != 3 {
		t.Errorf("%d sandboxes with 3 slots for the cluster", n)
	}
	if len(fakeA.Created()) == 0 || len(fakeB.Created()) == 0 {
		t.Errorf("replica a started %d, b %d; want both some", len(fakeA.Created()), len(fakeB.Created()))
	}
	close(finish)
	for _, id := range ids {
		got := waitStatus(t, hb.tasks, id, task.Success)
		if got.Replica != a.ID && got.Replica != b.ID {
			t.Errorf("task %s ran on %q", id, got.Replica)
		}
	}
	if n := len(fakeA.Created()) + len(fakeB.Created()); n != 8 {
		t.Errorf("%d sandboxes for 8 tasks, want each task once", n)
	}
	if most.Load() > 3 {
		t.Errorf("%d tasks ran at once with 3 slots for the cluster", most.Load())
	}
}

// A replica gone (its lease lapsed) leaves its running tasks to the
// others: a steady survivor records task_adopted, reattaches to the
// sandboxes (one host: the same runtime) and ends each with its real
// result, running none twice. One not steady yet judges no one.
func TestAdoptsTheTasksOfAReplicaGone(t *testing.T) {
	store := sqlitetest.Open(t)
	a := cluster.Replica{ID: "replica-a", Runtimes: []string{"fake"}}
	b := cluster.Replica{ID: "replica-b"} // offers no runtime: a gets every task
	finish := make(chan struct{})
	fake := MustNewFake(t, runUntilFinished(finish))
	ha := MustStart(t, store, Options{Members: newMembers(a.ID, true, a, b), MaxConcurrent: 4}, fake)
	mb := newMembers(b.ID, true, a, b)
	hb := MustStart(t, store, Options{Members: mb, MaxConcurrent: 4}, fake)
	lead(t, ha)
	ids := []string{MustEnqueue(t, ha.tasks, task.Spec{}), MustEnqueue(t, ha.tasks, task.Spec{})}
	for _, id := range ids {
		if got := waitStatus(t, hb.tasks, id, task.Running); got.Replica != a.ID {
			t.Fatalf("task %s on %q, want replica-a", id, got.Replica)
		}
	}

	ha.stop() // its sandboxes run on
	mb.set(false, b)
	time.Sleep(300 * time.Millisecond)
	for _, id := range ids {
		if got, _ := hb.tasks.Get(id); got.Replica != a.ID {
			t.Errorf("task %s adopted by a replica not steady", id)
		}
	}
	mb.set(true, b)
	for _, id := range ids {
		waitFor(t, "task "+id+" adopted", func() bool { got, _ := hb.tasks.Get(id); return got.Replica == b.ID })
	}
	close(finish)
	for _, id := range ids {
		got := waitStatus(t, hb.tasks, id, task.Success)
		if got.Summary != "collected" {
			t.Errorf("task %s ended %q, want its sandbox's result", id, got.Summary)
		}
		types := streamTypes(t, store, task.StreamID(id))
		want := []string{task.EventCreated, task.EventQueued, task.EventStarting, task.EventStarted, task.EventAdopted, task.EventReattached, task.EventCompleted}
		if !slices.Equal(types, want) {
			t.Errorf("task %s events %v, want %v", id, types, want)
		}
	}
	if n := len(fake.Created()); n != 2 {
		t.Errorf("%d sandboxes for 2 tasks, want each once", n)
	}
}
