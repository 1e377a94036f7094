package projection

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
	"github.com/corral-dev/corral/internal/task"
)

// runToEnd moves a queued task through its start to a successful end with
// a summary and output files, and returns it as Update left it.
func runToEnd(tb testing.TB, p *Tasks, id string) task.Task {
	tb.Helper()
	var t task.Task
	for _, e := range []eventstore.Proposed{ev(task.EventStarting),
		NewEvent(task.EventStarted, task.Started{SandboxName: "sb-" + id, Handle: realHandle}, "test"),
		NewEvent(task.EventCompleted, task.Completed{Status: task.Success, Summary: "summary of " + id, OutputFiles: tenFiles()}, "test")} {
		var err error
		t, err = p.Update(context.Background(), id, func(task.Task) ([]eventstore.Proposed, error) { return []eventstore.Proposed{e}, nil })
		if err != nil {
			tb.Fatal(err)
		}
	}
	return t
}

// TestEndedTasksHeldInPart: past the last keep that ended, an ended task is
// held in part, and Get, List, ByIdempotencyKey and a rebuilt projection
// still give it whole, as it was at its end, and Status its status and end; an event after its end moves
// its version; a task that has not ended is always held whole.
func TestEndedTasksHeldInPart(t *testing.T) {
	store := sqlitetest.Open(t)
	ctx := context.Background()
	p := New(store, discard())
	p.keep = 2
	ended := map[string]task.Task{}
	var order []string // creation order
	for i := range 5 {
		spec := task.Spec{Description: strings.Repeat(fmt.Sprintf("prompt %d. ", i), 50), Agent: task.AgentCommand,
			Labels: map[string]string{"n": fmt.Sprint(i)}, AttachmentIDs: []string{fmt.Sprintf("att-%d", i)},
			Origin: task.Origin{ConversationID: []string{"even", "odd"}[i%2]}}
		if i == 0 {
			spec.IdempotencyKey = "first"
		}
		tk := MustCreate(t, p, spec)
		order = append(order, tk.ID)
		ended[tk.ID] = runToEnd(t, p, tk.ID)
	}
	live := MustCreate(t, p, task.Spec{Description: "still queued"})

	if len(p.tasks) != 3 || p.old.len() != 3 {
		t.Fatalf("held whole %d, in part %d; want 3 (the last 2 ended and the queued one) and 3", len(p.tasks), p.old.len())
	}
	for _, id := range order[:3] {
		if !p.old.has(id) {
			t.Errorf("%s, among the first 3 to end, is not held in part", id)
		}
	}
	check := func(p *Tasks, what string) {
		t.Helper()
		for _, id := range order {
			got, err := p.Get(id)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(ended[id], got); diff != "" {
				t.Errorf("%s: Get(%s) differs from the task at its end (-end +get):\n%s", what, id, diff)
			}
		}
		all, more := mustList(t, p, Filter{})
		want := []task.Task{}
		for _, id := range slices.Backward(order) {
			want = append(want, ended[id])
		}
		if diff := cmp.Diff(append([]task.Task{live}, want...), all); diff != "" || more {
			t.Errorf("%s: List, more %v (-want +got):\n%s", what, more, diff)
		}
		// A page across the two forms, after a cursor, with a filter.
		page, more := mustList(t, p, Filter{ConversationID: "even", Before: order[4], Limit: 1})
		if diff := cmp.Diff([]task.Task{ended[order[2]]}, page); diff != "" || !more {
			t.Errorf("%s: List(even, before the 5th, 1), more %v (-want +got):\n%s", what, more, diff)
		}
		k, ok, err := p.ByIdempotencyKey("first")
		if diff := cmp.Diff(ended[order[0]], k); !ok || err != nil || diff != "" {
			t.Errorf("%s: ByIdempotencyKey(first) = %v, %v (-want +got):\n%s", what, ok, err, diff)
		}
		sel := p.Select(func(t *task.Task) bool { return len(t.AttachmentIDs) > 0 })
		if len(sel) != 5 {
			t.Fatalf("%s: Select by attachments gave %d tasks, want 5", what, len(sel))
		}
		for _, s := range sel {
			e := ended[s.ID]
			if s.Status != e.Status || s.Version != e.Version || !s.CompletedAt.Equal(*e.CompletedAt) || !slices.Equal(s.AttachmentIDs, e.AttachmentIDs) || s.ConversationID != e.ConversationID {
				t.Errorf("%s: Select's %s = %s v%d ended %v %v %q; want %s v%d ended %v %v %q", what, s.ID, s.Status, s.Version, s.CompletedAt, s.AttachmentIDs, s.ConversationID,
					e.Status, e.Version, e.CompletedAt, e.AttachmentIDs, e.ConversationID)
			}
		}
		for _, id := range order {
			st, at, ok := p.Status(id)
			if !ok || st != ended[id].Status || !at.Equal(*ended[id].CompletedAt) {
				t.Errorf("%s: Status(%s) = %s, %v, %v; want %s, %v, true", what, id, st, at, ok, ended[id].Status, ended[id].CompletedAt)
			}
		}
		if st, at, ok := p.Status(live.ID); !ok || st != task.Queued || !at.IsZero() {
			t.Errorf("%s: Status of the queued task = %s, %v, %v; want queued, no end, true", what, st, at, ok)
		}
		if _, _, ok := p.Status(task.NewID()); ok {
			t.Errorf("%s: Status of an unknown task is ok", what)
		}
		if c := p.Counts(); c[task.Success] != 5 || c[task.Queued] != 1 {
			t.Errorf("%s: Counts = %v", what, c)
		}
		if e := p.Ended(); e.Timed != 5 {
			t.Errorf("%s: Ended counted %d run times, want 5", what, e.Timed)
		}
	}
	check(p, "live")

	// An event after its end (retention removing its directory) on a task
	// held in part: Update sees it whole, and the version moves.
	first := order[0]
	after, err := p.Update(ctx, first, func(cur task.Task) ([]eventstore.Proposed, error) {
		if cur.Summary != ended[first].Summary {
			t.Errorf("Update's decision saw summary %q, want %q", cur.Summary, ended[first].Summary)
		}
		return []eventstore.Proposed{NewEvent(task.EventDirectoryRemoved, task.DirectoryRemoved{Directory: "tasks/" + first}, "test")}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if after.Version != ended[first].Version+1 || held(p, first).version != after.Version {
		t.Errorf("after an event past its end: Update gave v%d, held v%d; want v%d", after.Version, held(p, first).version, ended[first].Version+1)
	}
	ended[first] = after
	check(p, "after an event past the end")

	q := New(store, discard())
	q.keep = 2
	if err := q.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	if q.old.len() != 3 {
		t.Errorf("rebuilt: %d held in part, want 3", q.old.len())
	}
	check(q, "rebuilt")
}

// TestPendingSaves: the tasks that ended with a save_to_shared copy to do
// are listed in the order they ended, also once held in part (an event
// after the end keeps them listed) and after a rebuild; the copy's event
// takes a task off the list, held whole or in part.
func TestPendingSaves(t *testing.T) {
	store := sqlitetest.Open(t)
	ctx := context.Background()
	p := New(store, discard())
	p.keep = 1
	var saving []string
	for i := range 4 {
		tk := MustCreate(t, p, task.Spec{Description: "d", Agent: task.AgentCommand, SaveToShared: i != 2})
		runToEnd(t, p, tk.ID)
		if i != 2 {
			saving = append(saving, tk.ID)
		}
	}
	if got := p.PendingSaves(); !slices.Equal(got, saving) {
		t.Fatalf("PendingSaves = %v, want %v", got, saving)
	}
	if !p.old.has(saving[0]) {
		t.Fatalf("%s is not held in part", saving[0])
	}
	// An event after the end of a task held in part keeps its copy pending.
	if _, err := p.Update(ctx, saving[0], func(task.Task) ([]eventstore.Proposed, error) {
		return []eventstore.Proposed{NewEvent(task.EventRemovalFailed, task.RemovalFailed{Path: "x", Error: "e"}, "test")}, nil
	}); err != nil {
		t.Fatal(err)
	}
	sel := p.Select(func(t *task.Task) bool { return t.SavePending() })
	if len(sel) != 3 || !p.SavePending(saving[0]) {
		t.Errorf("after an event past the end: Select by pending save gave %d, SavePending %v; want 3, true", len(sel), p.SavePending(saving[0]))
	}
	// The copies' events: one held in part, one held whole.
	for _, id := range []string{saving[0], saving[2]} {
		if _, err := p.Update(ctx, id, func(task.Task) ([]eventstore.Proposed, error) {
			return []eventstore.Proposed{NewEvent(task.EventOutputsSaved, task.OutputsSaved{Directory: "shared/outputs/x/" + id}, "test")}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{saving[1]}
	if got := p.PendingSaves(); !slices.Equal(got, want) {
		t.Errorf("after two copies: PendingSaves = %v, want %v", got, want)
	}
	if got, err := p.Get(saving[0]); err != nil || got.SharedOutputs == nil || got.SharedOutputs.State != task.SaveSaved {
		t.Errorf("Get of a copied task held in part: %+v, %v", got.SharedOutputs, err)
	}
	q := New(store, discard())
	q.keep = 1
	if err := q.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	if got := q.PendingSaves(); !slices.Equal(got, want) || !q.SavePending(saving[1]) || q.SavePending(saving[0]) {
		t.Errorf("rebuilt: PendingSaves = %v, want %v", got, want)
	}
}

// held is what p holds of task id, ended and held in part.
func held(p *Tasks, id string) endedTask {
	p.mu.RLock()
	defer p.mu.RUnlock()
	e, _ := p.old.get(id)
	return e
}
