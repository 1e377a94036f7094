package library

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/postgres"
	"github.com/corral-dev/corral/internal/eventstore/postgres/postgrestest"
	"github.com/corral-dev/corral/internal/eventstore/sqlite"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workspace"
)

// eventStores are the stores event retention runs on, each as a way to
// open a store on one log again and again (a server's restart).
func eventStores(t *testing.T) map[string]func(t *testing.T) eventstore.Store {
	path, dsn := filepath.Join(t.TempDir(), "corral.db"), ""
	return map[string]func(t *testing.T) eventstore.Store{
		"sqlite": func(t *testing.T) eventstore.Store {
			s, err := sqlite.Open(context.Background(), path, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"postgres": func(t *testing.T) eventstore.Store {
			if dsn == "" { // the first open makes the database
				dsn = postgrestest.New(t).DSN
			}
			s, err := postgres.Open(context.Background(), dsn, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
}

// runTask records a task that started and reported progress and egress
// connections, and, unless end is "", its end with that status.
func runTask(tb testing.TB, tasks *projection.Tasks, end task.Status) string {
	tb.Helper()
	ctx := context.Background()
	id := task.NewID()
	ev := func(typ string, payload any) eventstore.Proposed { return projection.NewEvent(typ, payload, "test") }
	if _, err := tasks.Create(ctx, id, ev(task.EventCreated, task.Created{Spec: task.Spec{Description: "d", Agent: task.AgentCommand}}), ev(task.EventQueued, nil)); err != nil {
		tb.Fatal(err)
	}
	evs := []eventstore.Proposed{ev(task.EventStarting, nil), ev(task.EventStarted, task.Started{SandboxName: id})}
	for i := range 5 {
		evs = append(evs, ev(task.EventProgress, task.Progress{Kind: "text", Text: "step " + string(rune('a'+i))}))
	}
	evs = append(evs, ev(task.EventEgressConnection, task.EgressConnection{Method: "CONNECT", Host: "example.com", Port: 443, Allowed: true}),
		ev(task.EventReattached, task.Reattached{SandboxName: id}), ev(task.EventProgress, task.Progress{Kind: "result", Text: "done"}))
	if end != "" {
		exit := 0
		evs = append(evs, ev(task.EventCompleted, task.Completed{Status: end, ExitCode: &exit, Summary: "it worked",
			OutputFiles: []task.OutputFile{{Name: "out.txt", Size: 3, Type: "text/plain"}}}),
			ev(task.EventDirectoryRemoved, task.DirectoryRemoved{Directory: "tasks/" + id}))
	}
	for _, e := range evs {
		if _, err := tasks.Update(ctx, id, func(task.Task) ([]eventstore.Proposed, error) { return []eventstore.Proposed{e}, nil }); err != nil {
			tb.Fatal(err)
		}
	}
	return id
}

// Event retention, on SQLite and on PostgreSQL: a task that ended more
// than event_retention_hours ago keeps only the events its record is
// folded from, and a marker saying how many went; a task that has not
// ended and one that ended since are left whole; a second sweep changes
// nothing; a restart (the store opened again, the projection folded from
// the log) shows the compacted task as it ended; a dry run changes
// nothing and says what would go.
func TestEventRetention(t *testing.T) {
	for name, open := range eventStores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			store := open(t)
			defer func() { store.Close() }()
			tasks := projection.New(store, slog.New(slog.DiscardHandler))
			data, err := workspace.Open(filepath.Join(t.TempDir(), "data"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { data.Close() })
			const keep = 24 * time.Hour
			clk := &testClock{}
			lib := New(Options{Store: store, Tasks: tasks, Data: data, Retention: Retention{Events: keep}, Now: clk.Now}, slog.New(slog.DiscardHandler))
			read := func(id string) []eventstore.Event {
				t.Helper()
				evs, err := store.ReadStream(ctx, task.StreamID(id), 0)
				if err != nil {
					t.Fatal(err)
				}
				return evs
			}
			gc := func(dry bool) service.GCReport {
				t.Helper()
				rep, err := lib.GC(ctx, service.GCRequest{DryRun: dry})
				if err != nil {
					t.Fatal(err)
				}
				if err := tasks.Sync(ctx); err != nil {
					t.Fatal(err)
				}
				return rep
			}
			compacted := func(rep service.GCReport) []string {
				var ids []string
				for _, it := range rep.TaskEvents {
					ids = append(ids, it.TaskID)
				}
				return ids
			}

			old := runTask(t, tasks, task.Success)
			time.Sleep(2 * time.Millisecond) // recent ends after old, by PostgreSQL's microseconds too
			recent := runTask(t, tasks, task.Failed)
			running := runTask(t, tasks, "")
			oldTask, _ := tasks.Get(old)
			oldEvents, recentEvents, runningEvents := read(old), read(recent), read(running)
			if len(oldEvents) != 14 || oldTask.Compactable != 8 {
				t.Fatalf("the ended task has %d events, %d of them compactable; want 14 and 8", len(oldEvents), oldTask.Compactable)
			}
			clk.t = oldTask.CompletedAt.Add(keep) // old is due, recent not yet

			rep := gc(true)
			if !slices.Equal(compacted(rep), []string{old}) || rep.TaskEvents[0].Events != 8 || rep.TaskEvents[0].Bytes == 0 {
				t.Errorf("dry run: %+v, want the 8 events of %s", rep.TaskEvents, old)
			}
			if diff := cmp.Diff(oldEvents, read(old)); diff != "" {
				t.Errorf("a dry run changed the events (-before +after):\n%s", diff)
			}

			rep = gc(false)
			if !slices.Equal(compacted(rep), []string{old}) || rep.TaskEvents[0].Events != 8 {
				t.Errorf("sweep: %+v, want the 8 events of %s", rep.TaskEvents, old)
			}
			after := read(old)
			var types []string
			for _, e := range after {
				types = append(types, e.Type)
			}
			want := []string{task.EventCreated, task.EventQueued, task.EventStarting, task.EventStarted, task.EventCompleted,
				task.EventDirectoryRemoved, task.EventCompacted}
			if !slices.Equal(types, want) {
				t.Errorf("the compacted task's events: %v, want %v", types, want)
			}
			for _, e := range after[:len(after)-1] {
				if i := slices.IndexFunc(oldEvents, func(o eventstore.Event) bool { return o.ID == e.ID }); i < 0 || !cmp.Equal(oldEvents[i], e) {
					t.Errorf("kept event %s (%s) is not as it was", e.ID, e.Type)
				}
			}
			marker := after[len(after)-1]
			if marker.StreamVersion != 15 || string(marker.Data) != `{"removed":8,"through_version":14}` {
				t.Errorf("marker: version %d, %s", marker.StreamVersion, marker.Data)
			}
			// The record is the task as it ended: only what the marker
			// itself moves has moved.
			sameEnd := cmpopts.IgnoreFields(task.Task{}, "Version", "UpdatedAt", "LastEventID", "Compactable")
			got, err := tasks.Get(old)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(oldTask, got, sameEnd); diff != "" || got.Version != 15 || got.Compactable != 0 {
				t.Errorf("the compacted task: version %d, compactable %d (-before +after):\n%s", got.Version, got.Compactable, diff)
			}
			if diff := cmp.Diff(recentEvents, read(recent)); diff != "" {
				t.Errorf("a task that ended within the horizon lost events (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(runningEvents, read(running)); diff != "" {
				t.Errorf("a running task lost events (-before +after):\n%s", diff)
			}

			// Again: nothing to do.
			if rep := gc(false); len(rep.TaskEvents) != 0 {
				t.Errorf("second sweep: %+v, want nothing", rep.TaskEvents)
			}
			if diff := cmp.Diff(after, read(old)); diff != "" {
				t.Errorf("a second sweep changed the compacted task's events (-first +second):\n%s", diff)
			}

			// Far later: the other ended task too; never the running one.
			clk.Advance(100 * keep)
			if rep := gc(false); !slices.Equal(compacted(rep), []string{recent}) {
				t.Errorf("sweep 100 horizons later: %+v, want %s", rep.TaskEvents, recent)
			}
			if diff := cmp.Diff(runningEvents, read(running)); diff != "" {
				t.Errorf("a running task lost events (-before +after):\n%s", diff)
			}

			// A restart folds the log with its gaps into the same tasks.
			all := func(*task.Task) bool { return true }
			before := tasks.Select(all)
			wantOld, _ := tasks.Get(old)
			if err := store.Close(); err != nil {
				t.Fatal(err)
			}
			store = open(t)
			restarted := projection.New(store, slog.New(slog.DiscardHandler))
			if err := restarted.Rebuild(ctx); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(before, restarted.Select(all)); diff != "" {
				t.Errorf("tasks after a restart (-before +after):\n%s", diff)
			}
			if got, err := restarted.Get(old); err != nil || !cmp.Equal(wantOld, got) || got.Status != task.Success || got.Summary != "it worked" {
				t.Errorf("the compacted task after a restart: %v (-before +after):\n%s", err, cmp.Diff(wantOld, got))
			}
			list, _, err := restarted.List(projection.Filter{Status: task.Success})
			if err != nil || len(list) != 1 || list[0].ID != old {
				t.Errorf("successful tasks after a restart: %v, %v; want %s", list, err, old)
			}
		})
	}
}

// A sweep compacts compactBatch tasks at most, those that ended first;
// the next sweep goes on with the rest.
func TestEventRetentionBounded(t *testing.T) {
	clk := &testClock{}
	f := MustNew(t, func(o *Options) {
		o.Now = clk.Now
		o.Retention = Retention{Events: time.Hour}
	})
	ctx := context.Background()
	ev := func(typ string, payload any) eventstore.Proposed { return projection.NewEvent(typ, payload, "test") }
	var ids []string
	for range compactBatch + 1 {
		id := task.NewID()
		if _, err := f.tasks.Create(ctx, id, ev(task.EventCreated, task.Created{Spec: task.Spec{Description: "d", Agent: task.AgentCommand}}),
			ev(task.EventQueued, nil), ev(task.EventProgress, task.Progress{Kind: "text", Text: "t"}), ev(task.EventCompleted, task.Completed{Status: task.Success})); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	clk.t = time.Now().Add(2 * time.Hour)
	rep, err := f.lib.GC(ctx, service.GCRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, it := range rep.TaskEvents {
		got = append(got, it.TaskID)
	}
	if !slices.Equal(got, ids[:compactBatch]) {
		t.Errorf("first sweep compacted %d tasks, want the %d that ended first", len(got), compactBatch)
	}
	if err := f.tasks.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	rep, err = f.lib.GC(ctx, service.GCRequest{})
	if err != nil || len(rep.TaskEvents) != 1 || rep.TaskEvents[0].TaskID != ids[compactBatch] {
		t.Errorf("second sweep: %+v, %v; want the last task", rep.TaskEvents, err)
	}
}

// An event of the kinds retention removes that comes after a task's
// compaction (an egress connection recorded late) is compacted by a later
// sweep, with the first marker: the stream keeps one, which counts all.
func TestEventRetentionLateEvent(t *testing.T) {
	clk := &testClock{}
	f := MustNew(t, func(o *Options) {
		o.Now = clk.Now
		o.Retention = Retention{Events: time.Hour}
	})
	ctx := context.Background()
	id := runTask(t, f.tasks, task.Success)
	clk.t = time.Now().Add(2 * time.Hour)
	sweep := func() []service.GCEvents {
		t.Helper()
		rep, err := f.lib.GC(ctx, service.GCRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.tasks.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		return rep.TaskEvents
	}
	if got := sweep(); len(got) != 1 || got[0].Events != 8 {
		t.Fatalf("first sweep: %+v, want 8 events of %s", got, id)
	}
	late := projection.NewEvent(task.EventEgressConnection, task.EgressConnection{Method: "CONNECT", Host: "example.com", Port: 443}, "test")
	if _, err := f.store.Append(ctx, task.StreamID(id), eventstore.AnyVersion, late); err != nil {
		t.Fatal(err)
	}
	if err := f.tasks.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sweep(); len(got) != 1 || got[0].Events != 1 {
		t.Fatalf("sweep after a late event: %+v, want 1 event of %s", got, id)
	}
	var markers []string
	for _, e := range f.events(t, id) {
		if e.Type == task.EventCompacted || slices.Contains(task.CompactedTypes, e.Type) {
			markers = append(markers, string(e.Data))
		}
	}
	if !slices.Equal(markers, []string{`{"removed":9,"through_version":16}`}) {
		t.Errorf("what is left of the compacted kinds: %v, want one marker counting 9", markers)
	}
	if got := sweep(); len(got) != 0 {
		t.Errorf("third sweep: %+v, want nothing", got)
	}
}
