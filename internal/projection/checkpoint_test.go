package projection

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
	"github.com/corral-dev/corral/internal/task"
)

// randomLog is a log of random tasks in a real store: created (some with
// an idempotency key, a workspace, a conversation, attachments, labels,
// save_to_shared), queued, started and ended in every status, some with
// their save_to_shared copy pending and some with it done, some with
// events after their end, some still live; their events interleaved, with
// events of other streams, an event for no task and one that does not
// apply.
type randomLog struct {
	store  eventstore.Store
	events []eventstore.Event
	ids    []string // every task's, and one no event names
	keys   []string // every idempotency key, and one never used
	convs  []string
	spaces []string
}

func makeRandomLog(t *testing.T, seed uint64, tasks int) *randomLog {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed))
	ctx := context.Background()
	l := &randomLog{store: sqlitetest.Open(t), convs: []string{"c1", "c2", "c3"}, spaces: []string{"alpha", "beta"}}
	pick := func(of []string) string {
		if rng.IntN(3) == 0 {
			return ""
		}
		return of[rng.IntN(len(of))]
	}
	statuses := []task.Status{task.Success, task.Success, task.Failed, task.Timeout, task.Cancelled}
	lives := map[string][]eventstore.Proposed{}
	for i := range tasks {
		id := task.NewID()
		l.ids = append(l.ids, id)
		spec := task.Spec{Description: fmt.Sprintf("task %d", i), Agent: []string{"claude", "codex"}[rng.IntN(2)], Workspace: pick(l.spaces),
			Origin: task.Origin{ConversationID: pick(l.convs)}, SaveToShared: rng.IntN(3) == 0}
		if rng.IntN(3) == 0 {
			spec.IdempotencyKey = fmt.Sprintf("key-%d", rng.IntN(tasks)) // some taken again: the later task has it
			l.keys = append(l.keys, spec.IdempotencyKey)
		}
		if rng.IntN(4) == 0 {
			spec.AttachmentIDs = []string{fmt.Sprintf("att-%d", i)}
		}
		if rng.IntN(4) == 0 {
			spec.Labels = map[string]string{"n": fmt.Sprint(i)}
		}
		life := []eventstore.Proposed{created(spec), ev(task.EventQueued), ev(task.EventStarting),
			NewEvent(task.EventStarted, task.Started{SandboxName: "sb-" + id, Handle: realHandle}, "test")}
		if rng.IntN(5) == 0 {
			life = append(life, ev(task.EventCancelRequested))
		}
		exit := rng.IntN(2)
		st := statuses[rng.IntN(len(statuses))]
		end := NewEvent(task.EventCompleted, task.Completed{Status: st, ExitCode: &exit, Summary: "done " + id, OutputFiles: tenFiles()[:rng.IntN(3)],
			CostUSD: float64(rng.IntN(100)) / 64, Usage: &task.Usage{InputTokens: int64(rng.IntN(1000)), OutputTokens: 7, CacheReadTokens: 3}}, "test")
		switch stop := rng.IntN(10); {
		case stop == 0: // still pending, queued or starting
			life = life[:1+rng.IntN(3)]
		case stop == 1: // cancelled while queued
			life = append(life[:2], NewEvent(task.EventCompleted, task.Completed{Status: task.Cancelled}, "test"))
		case stop == 2: // an end that does not apply: the task stays running, its later events are refused
			life = append(life, NewEvent(task.EventCompleted, task.Completed{Status: task.Running}, "test"), end)
		default:
			life = append(life, end)
			if st == task.Success && spec.SaveToShared && rng.IntN(2) == 0 {
				life = append(life, NewEvent(task.EventOutputsSaved, task.OutputsSaved{Directory: "shared/outputs/" + id}, "test"))
			}
			if rng.IntN(3) == 0 {
				life = append(life, NewEvent(task.EventDirectoryRemoved, task.DirectoryRemoved{Directory: "tasks/" + id}, "test"))
			}
		}
		lives[id] = life
	}
	version := map[string]int64{}
	for len(lives) > 0 {
		if rng.IntN(20) == 0 {
			if _, err := l.store.Append(ctx, task.SystemStream, eventstore.AnyVersion, ev(task.EventReconciled)); err != nil {
				t.Fatal(err)
			}
		}
		ids := slices.Sorted(func(yield func(string) bool) {
			for id := range lives {
				if !yield(id) {
					return
				}
			}
		})
		id := ids[rng.IntN(len(ids))]
		n := min(len(lives[id]), 1+rng.IntN(2)) // now and then two events in one append
		if _, err := l.store.Append(ctx, task.StreamID(id), version[id], lives[id][:n]...); err != nil {
			t.Fatal(err)
		}
		version[id] += int64(n)
		if lives[id] = lives[id][n:]; len(lives[id]) == 0 {
			delete(lives, id)
		}
	}
	stray := task.NewID() // an event for a task no event created
	if _, err := l.store.Append(ctx, task.StreamID(stray), 0, ev(task.EventQueued)); err != nil {
		t.Fatal(err)
	}
	l.ids = append(l.ids, stray, task.NewID())
	l.keys = append(l.keys, "never-used")
	for after := int64(0); ; {
		evs, err := l.store.ReadAll(ctx, after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			break
		}
		l.events = append(l.events, evs...)
		after = evs[len(evs)-1].Position
	}
	return l
}

// upTo returns a projection, not over the store's checkpoints, that has
// applied the log's events up to position pos.
func (l *randomLog) upTo(keep int, pos int64) *Tasks {
	p := New(withoutCheckpoints{l.store}, discard())
	p.keep = keep
	p.apply(l.events[:pos]...)
	return p
}

// withoutCheckpoints is a store that keeps none.
type withoutCheckpoints struct{ eventstore.Store }

// sameAs fails the test where got and want differ in anything a caller
// can see: Position, Get, Status and SavePending of every task (and of
// ids no task has), List walked page by page and under every filter,
// Counts, Ended, PendingSaves, ByIdempotencyKey of every key, Select,
// SelectLive and Waiting.
func (l *randomLog) sameAs(t *testing.T, what string, want, got *Tasks) {
	t.Helper()
	if w, g := want.Position(), got.Position(); w != g {
		t.Fatalf("%s: Position %d, want %d", what, g, w)
	}
	check := func(api string, w, g any) {
		t.Helper()
		if diff := cmp.Diff(w, g); diff != "" {
			t.Fatalf("%s: %s (-want +got):\n%s", what, api, diff)
		}
	}
	errText := func(err error) string {
		if err == nil {
			return ""
		}
		return err.Error()
	}
	for _, id := range l.ids {
		wt, werr := want.Get(id)
		gt, gerr := got.Get(id)
		check("Get("+id+")", []any{wt, errText(werr), errors.Is(werr, errdefs.ErrNotFound)}, []any{gt, errText(gerr), errors.Is(gerr, errdefs.ErrNotFound)})
		ws, wat, wok := want.Status(id)
		gs, gat, gok := got.Status(id)
		check("Status("+id+")", []any{ws, wat, wok, want.SavePending(id)}, []any{gs, gat, gok, got.SavePending(id)})
	}
	filters := []Filter{{Status: task.Queued}, {Status: task.Running}, {Status: task.Failed, Limit: 3}, {ConversationID: "c1"},
		{ConversationID: "c2", Status: task.Success, Limit: 2}, {Workspace: "beta", Limit: 4}, {Before: l.ids[len(l.ids)/3], Limit: 5}}
	for _, f := range filters {
		wl, wm, werr := want.List(f)
		gl, gm, gerr := got.List(f)
		check(fmt.Sprintf("List(%+v)", f), []any{wl, wm, errText(werr)}, []any{gl, gm, errText(gerr)})
	}
	walk := func(p *Tasks) []string {
		var all []string
		for f := (Filter{Limit: 3}); ; {
			page, more := mustList(t, p, f)
			all = append(all, ids(page)...)
			if !more {
				return all
			}
			f.Before = page[len(page)-1].ID
		}
	}
	check("List page by page", walk(want), walk(got))
	check("Counts", want.Counts(), got.Counts())
	check("Ended", want.Ended(), got.Ended())
	check("PendingSaves", want.PendingSaves(), got.PendingSaves())
	for _, k := range l.keys {
		wt, wok, werr := want.ByIdempotencyKey(k)
		gt, gok, gerr := got.ByIdempotencyKey(k)
		check("ByIdempotencyKey("+k+")", []any{wt, wok, errText(werr)}, []any{gt, gok, errText(gerr)})
	}
	all := func(*task.Task) bool { return true }
	check("Select", want.Select(all), got.Select(all))
	check("SelectLive", want.SelectLive(all), got.SelectLive(all))
	check("Waiting", want.Waiting(slices.Values(l.ids)), got.Waiting(slices.Values(l.ids)))
}

// TestCheckpointProperty: for random logs, a projection started from a
// checkpoint at a random position and then the events after it is the
// projection folded from the whole log, in everything a caller can see
// (Select too: the same tasks are held whole); and so is one that saves
// checkpoints as it goes (each save puts the archive it writes in place
// of what it held), at each of them, and one that starts from a
// checkpoint of a server that kept more ended tasks whole.
func TestCheckpointProperty(t *testing.T) {
	ctx := context.Background()
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			l := makeRandomLog(t, seed, 20+rng.IntN(30))
			keep := 1 + rng.IntN(6)
			end := int64(len(l.events))
			cuts := []int64{rng.Int64N(end + 1), rng.Int64N(end + 1), rng.Int64N(end + 1)}
			slices.Sort(cuts)

			full := New(withoutCheckpoints{l.store}, discard())
			full.keep = keep
			if err := full.Rebuild(ctx); err != nil {
				t.Fatal(err)
			}

			// One projection saves at the first cut; another starts
			// there, applies events, saves at the second and third cut.
			// The first keeps more ended tasks whole than the other,
			// which puts those past its own keep in part as it loads.
			first := l.upTo(keep+2, cuts[0])
			first.store = l.store
			if err := first.SaveCheckpoint(ctx); err != nil {
				t.Fatal(err)
			}
			l.sameAs(t, fmt.Sprintf("after a save at %d", cuts[0]), l.upTo(keep+2, cuts[0]), first)
			p := New(l.store, discard())
			p.keep = keep
			if h := p.loadCheckpoint(ctx); h == nil || h.pos != cuts[0] {
				t.Fatalf("loaded the checkpoint %+v, want the one at %d", h, cuts[0])
			} else {
				p.loadArchive(ctx, h.archive)
			}
			l.sameAs(t, fmt.Sprintf("loaded at %d", cuts[0]), l.upTo(keep, cuts[0]), p)
			for i, cut := range cuts[1:] {
				p.apply(l.events[cuts[i]:cut]...)
				l.sameAs(t, fmt.Sprintf("loaded at %d, applied to %d", cuts[i], cut), l.upTo(keep, cut), p)
				if err := p.SaveCheckpoint(ctx); err != nil {
					t.Fatal(err)
				}
				l.sameAs(t, fmt.Sprintf("saved at %d", cut), l.upTo(keep, cut), p)
			}

			// A start from the last, reading before the archive is in
			// place, and after.
			for _, wait := range []bool{false, true} {
				q := New(l.store, discard())
				q.keep = keep
				if err := q.Rebuild(ctx); err != nil {
					t.Fatal(err)
				}
				if wait {
					<-q.Archived()
				}
				l.sameAs(t, fmt.Sprintf("started at %d (archive awaited: %v)", cuts[2], wait), full, q)
				<-q.Archived()
			}
		})
	}
}

// logged is a logger whose lines a test reads.
type logged struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logged) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(b)
}

func (l *logged) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logged) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// rewrite changes a checkpoint row kept as name and keeps it at the same
// position, with its checksum made right again unless badSum.
func rewrite(t *testing.T, s eventstore.Store, name string, change func([]byte), badSum bool) {
	t.Helper()
	cp := s.(eventstore.Checkpoints)
	pos, data, ok, err := cp.LoadCheckpoint(context.Background(), name)
	if err != nil || !ok {
		t.Fatalf("LoadCheckpoint(%s): %v, %v", name, ok, err)
	}
	change(data)
	if !badSum {
		w := &enc{b: data[:len(data)-4]}
		data, _ = endRow(w)
	}
	if err := cp.SaveCheckpoint(context.Background(), name, pos, data); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointNotUsable: a head that is corrupt, of another version or
// of another shape of task.Task starts the projection from the whole log;
// an archive that is corrupt, missing or not the one the head names
// (a save that failed between the two) makes it fold the whole log in
// the background. Either way it ends as the whole log folded, and says
// why.
func TestCheckpointNotUsable(t *testing.T) {
	versionAt := len(checkpointMagic)
	cases := []struct {
		name    string
		spoil   func(t *testing.T, s eventstore.Store)
		logs    string
		archive bool // the head is used, the archive is not
	}{
		{"corrupt head", func(t *testing.T, s eventstore.Store) {
			rewrite(t, s, headName, func(b []byte) { b[len(b)/2] ^= 0x10 }, true)
		}, "checksum mismatch", false},
		{"head of an older version", func(t *testing.T, s eventstore.Store) {
			rewrite(t, s, headName, func(b []byte) { b[versionAt] = checkpointVersion - 1 }, false)
		}, fmt.Sprintf("version %d, this binary reads %d", checkpointVersion-1, checkpointVersion), false},
		{"head of another task shape", func(t *testing.T, s eventstore.Store) {
			rewrite(t, s, headName, func(b []byte) { b[versionAt+1] ^= 0xff }, false)
		}, "another shape of task.Task", false},
		{"head that decodes to nonsense", func(t *testing.T, s eventstore.Store) {
			rewrite(t, s, headName, func(b []byte) { // the count of tasks, past the end of the row
				r := dec{s: string(b[versionAt:])}
				r.uvarint()
				r.take(9) // shape, kind
				r.varint()
				r.varint() // the archive's position, size and checksum
				r.uvarint()
				r.u32()
				copy(b[len(b)-len(r.s):], []byte{0xff, 0xff, 0xff, 0xff, 0x0f})
			}, false)
		}, "count past the end", false},
		{"corrupt archive", func(t *testing.T, s eventstore.Store) {
			rewrite(t, s, archiveName, func(b []byte) { b[len(b)-10] ^= 0x01 }, true)
		}, "checksum mismatch", true},
		{"archive of another save", func(t *testing.T, s eventstore.Store) {
			rewrite(t, s, archiveName, func(b []byte) { b[len(b)-5] ^= 0x01 }, false) // sound, but not the one the head names
		}, "is not the one the checkpoint names", true},
	}
	ctx := context.Background()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := makeRandomLog(t, 7, 30)
			const keep = 3
			half := int64(len(l.events) / 2)
			saver := l.upTo(keep, half)
			saver.store = l.store
			if err := saver.SaveCheckpoint(ctx); err != nil {
				t.Fatal(err)
			}
			c.spoil(t, l.store)
			var log logged
			p := New(l.store, log.logger())
			p.keep = keep
			if err := p.Rebuild(ctx); err != nil {
				t.Fatalf("Rebuild: %v", err)
			}
			<-p.Archived()
			l.sameAs(t, "started", l.upTo(keep, int64(len(l.events))), p)
			out := log.String()
			if !strings.Contains(out, c.logs) {
				t.Errorf("the log does not say %q:\n%s", c.logs, out)
			}
			from := "checkpoint=0 "
			if c.archive {
				from = fmt.Sprintf("checkpoint=%d ", half)
			}
			if !strings.Contains(out, from) {
				t.Errorf("Rebuild did not start from %q:\n%s", from, out)
			}
		})
	}
}

// slowArchive holds back the archive's read until release is closed.
type slowArchive struct {
	checkpointStore
	release chan struct{}
}

type checkpointStore interface {
	eventstore.Store
	eventstore.Checkpoints
}

func (s slowArchive) LoadCheckpoint(ctx context.Context, name string) (int64, []byte, bool, error) {
	if name == archiveName {
		<-s.release
	}
	return s.checkpointStore.LoadCheckpoint(ctx, name)
}

// TestBeforeTheArchive: between Rebuild and the archive's read, the tasks
// held whole are served, what needs the archive waits for it, and events
// for tasks in it (an ended task's directory removed) are applied, folded
// from their events.
func TestBeforeTheArchive(t *testing.T) {
	ctx := context.Background()
	store := sqlitetest.Open(t)
	p := New(store, discard())
	p.keep = 1
	old := MustCreate(t, p, task.Spec{Description: "ends first", IdempotencyKey: "k-old"})
	runToEnd(t, p, old.ID)
	whole := MustCreate(t, p, task.Spec{Description: "ends last"})
	runToEnd(t, p, whole.ID)
	if err := p.SaveCheckpoint(ctx); err != nil {
		t.Fatal(err)
	}

	slow := slowArchive{checkpointStore: store, release: make(chan struct{})}
	q := New(slow, discard())
	q.keep = 1
	if err := q.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := q.Get(whole.ID); err != nil || got.Summary != "summary of "+whole.ID {
		t.Errorf("Get of a task held whole before the archive: %v, %v", got.Summary, err)
	}
	if _, err := store.Append(ctx, task.StreamID(old.ID), eventstore.AnyVersion, NewEvent(task.EventDirectoryRemoved, task.DirectoryRemoved{Directory: "tasks/" + old.ID}, "test")); err != nil {
		t.Fatal(err)
	}
	live := MustCreate(t, q, task.Spec{Description: "new"})
	if err := q.CatchUp(ctx, live.Version); err != nil {
		t.Fatal(err)
	}
	got := make(chan task.Task)
	go func() {
		tk, _, _ := q.ByIdempotencyKey("k-old")
		got <- tk
	}()
	select {
	case tk := <-got:
		t.Fatalf("ByIdempotencyKey of a task in the archive returned before it was read: %+v", tk)
	case <-time.After(50 * time.Millisecond):
	}
	close(slow.release)
	tk := <-got
	ref := New(withoutCheckpoints{store}, discard())
	ref.keep = 1
	if err := ref.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	want, err := ref.Get(old.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, tk); diff != "" || tk.Version != 6 {
		t.Errorf("the task in the archive, after an event applied before the archive was read (-want +got):\n%s", diff)
	}
	if st, _, _ := q.Status(old.ID); st != task.Success || held(q, old.ID).version != 6 {
		t.Errorf("held in part: status %s, version %d; want success, 6", st, held(q, old.ID).version)
	}
	l := &randomLog{store: store, ids: []string{old.ID, whole.ID, live.ID}, keys: []string{"k-old"}}
	l.sameAs(t, "after the archive", ref, q)
}

// memStore keeps checkpoints in memory and nothing else: its other
// methods are those of a nil Store, which no test here calls.
type memStore struct {
	eventstore.Store
	mu    sync.Mutex
	rows  map[string][]byte
	pos   map[string]int64
	heads []int64 // the positions of the heads saved, in order
}

func (m *memStore) SaveCheckpoint(_ context.Context, name string, pos int64, data []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rows == nil {
		m.rows, m.pos = map[string][]byte{}, map[string]int64{}
	}
	m.rows[name], m.pos[name] = slices.Clone(data), pos
	if name == headName {
		m.heads = append(m.heads, pos)
	}
	return nil
}

func (m *memStore) LoadCheckpoint(_ context.Context, name string) (int64, []byte, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	data, ok := m.rows[name]
	return m.pos[name], slices.Clone(data), ok, nil
}

func (m *memStore) saved() []int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.heads)
}

// fixedLog is a log of every kind of task event with ids, times and
// positions fixed: the same on every machine and every run.
func fixedLog() []eventstore.Event {
	var evs []eventstore.Event
	at := time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC)
	version := map[string]int64{}
	add := func(id string, p eventstore.Proposed) {
		version[id]++
		at = at.Add(1500 * time.Millisecond)
		evs = append(evs, eventstore.Event{ID: fmt.Sprintf("evt_%03d", len(evs)+1), StreamID: task.StreamID(id), StreamVersion: version[id],
			Type: p.Type, SchemaVersion: p.SchemaVersion, Data: p.Data, Actor: p.Actor, CorrelationID: "corr_" + id, RecordedAt: at, Position: int64(len(evs) + 1)})
	}
	exit0, exit3, took := 0, 3, 12.5
	start := func(id string, spec task.Spec) {
		add(id, created(spec))
		add(id, ev(task.EventQueued))
		add(id, ev(task.EventStarting))
		add(id, NewEvent(task.EventStarted, task.Started{SandboxName: "sb-" + id, Handle: []byte(`{"pid":1}`)}, "test"))
	}
	start("task-a", task.Spec{Description: "a", Agent: "claude", IdempotencyKey: "ka", SaveToShared: true, Labels: map[string]string{"l": "1"},
		AttachmentIDs: []string{"att-1"}, Workspace: "alpha", Origin: task.Origin{ConversationID: "conv"}})
	start("task-b", task.Spec{Description: "b", Agent: "codex"})
	add("task-b", NewEvent(task.EventProgress, task.Progress{Kind: "text", Text: "working"}, "test"))
	add("task-b", NewEvent(task.EventEgressConnection, task.EgressConnection{Method: "CONNECT", Host: "example.com", Port: 443, Allowed: true}, "test"))
	add("task-a", NewEvent(task.EventCompleted, task.Completed{Status: task.Success, ExitCode: &exit0, Summary: "done", OutputFiles: tenFiles()[:2],
		Usage: &task.Usage{InputTokens: 10, OutputTokens: 20, CacheReadTokens: 5}, CostUSD: 0.125, SessionID: "sess",
		Changes: &task.Changes{Added: []string{"x"}, Commits: []task.Commit{{Hash: "abc", Subject: "s"}}}}, "test"))
	add("task-b", ev(task.EventCancelRequested))
	add("task-b", NewEvent(task.EventCompleted, task.Completed{Status: task.Failed, ExitCode: &exit3, ErrorMessage: "boom", DurationSeconds: &took}, "test"))
	add("task-c", created(task.Spec{Description: "c", Agent: "claude", IdempotencyKey: "kc"}))
	add("task-c", ev(task.EventQueued))
	add("task-c", NewEvent(task.EventCompleted, task.Completed{Status: task.Cancelled}, "test"))
	start("task-d", task.Spec{Description: "d", Agent: "claude", SaveToShared: true})
	add("task-d", NewEvent(task.EventCompleted, task.Completed{Status: task.Success, Summary: "d done"}, "test"))
	add("task-a", NewEvent(task.EventOutputsSaved, task.OutputsSaved{Directory: "shared/outputs/2026-11/task-a"}, "test"))
	add("task-a", NewEvent(task.EventDirectoryRemoved, task.DirectoryRemoved{Directory: "tasks/task-a", Bytes: 42, EndedAt: at}, "test"))
	start("task-e", task.Spec{Description: "e", Agent: "claude", Workspace: "alpha"})
	add("task-f", created(task.Spec{Description: "f", Agent: "claude"}))
	add("task-f", ev(task.EventQueued))
	add("task-g", created(task.Spec{Description: "g", Agent: "claude"}))
	start("task-h", task.Spec{Description: "h", Agent: "gemini"})
	version["task-h"] += 2 // two progress events retention removed
	add("task-h", NewEvent(task.EventCompleted, task.Completed{Status: task.Timeout, Reason: "timeout"}, "test"))
	add("task-h", NewEvent(task.EventCompacted, task.Compacted{Removed: 2, Through: version["task-h"]}, "corral/retention"))
	return evs
}

// foldDigests is, for each checkpointVersion, the SHA-256 of the
// checkpoint of fixedLog (TestFoldVersion).
var foldDigests = map[int]string{
	1: "f04706e3acfd9ddd72bb666b0a14707b39c478dddeddbdf0a9378ef0373da9d7",
	2: "d3bf3870c98256ad900f113681a3876913dcc9d0e076c5a49d579851df490225",
}

// TestFoldVersion: the checkpoint of a fixed log is the one recorded for
// this checkpointVersion. If it is not, the fold or the checkpoint's
// encoding changed (or task.Task's fields did), and a checkpoint written
// before would be read into another state than the log's.
func TestFoldVersion(t *testing.T) {
	mem := &memStore{}
	p := New(mem, discard())
	p.keep = 2
	p.apply(fixedLog()...)
	if err := p.SaveCheckpoint(context.Background()); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(append(mem.rows[headName], mem.rows[archiveName]...))
	if got, want := hex.EncodeToString(sum[:]), foldDigests[checkpointVersion]; got != want {
		t.Errorf("the checkpoint of fixedLog is %s, and %q is recorded for checkpointVersion %d.\n"+
			"If what task.Task.Apply, apply or index make of events changed, or how a checkpoint is written, bump checkpointVersion:"+
			" checkpoints written before would be read into another state than the log's. Then (or if only task.Task's fields changed,"+
			" which retires old checkpoints by itself) record %s for it in foldDigests.", got, want, checkpointVersion, got)
	}
	// And the checkpoint reads back into what the log folds to.
	q := New(mem, discard())
	q.keep = 2
	h := q.loadCheckpoint(context.Background())
	if h == nil || h.pos != int64(len(fixedLog())) {
		t.Fatalf("loaded %+v", h)
	}
	q.loadArchive(context.Background(), h.archive)
	for _, id := range []string{"task-a", "task-b", "task-c", "task-d", "task-e", "task-f", "task-g", "task-h"} {
		ws, wat, _ := p.Status(id)
		gs, gat, _ := q.Status(id)
		if ws != gs || !wat.Equal(gat) || p.SavePending(id) != q.SavePending(id) {
			t.Errorf("%s: %s %v, want %s %v", id, gs, gat, ws, wat)
		}
	}
	if diff := cmp.Diff(p.Ended(), q.Ended()); diff != "" {
		t.Errorf("Ended (-log +checkpoint):\n%s", diff)
	}
	// p's ended tasks held in part are in the archive it saved, as q's
	// are: r's are as the fold made them.
	r := New(&memStore{}, discard())
	r.keep = 2
	r.apply(fixedLog()...)
	all := func(*task.Task) bool { return true }
	if diff := cmp.Diff(r.Select(all), q.Select(all)); diff != "" {
		t.Errorf("Select (-log +checkpoint):\n%s", diff)
	}
}

// TestKeepCheckpoints: a server saves after p.every events, no sooner
// than p.spacing after the last save, and once more when it stops if
// anything happened since.
func TestKeepCheckpoints(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := &memStore{}
		p := New(mem, discard())
		p.every, p.spacing = 10, time.Minute
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- p.KeepCheckpoints(ctx) }()
		step := func(events int, wait time.Duration, want ...int64) {
			t.Helper()
			for range events {
				pos := p.Position() + 1
				p.apply(eventstore.Event{ID: fmt.Sprint(pos), StreamID: task.StreamID(task.NewID()), StreamVersion: 1,
					Type: task.EventCreated, Data: created(task.Spec{Description: "t"}).Data, RecordedAt: time.Now(), Position: pos})
			}
			time.Sleep(wait)
			synctest.Wait()
			if got := mem.saved(); !slices.Equal(got, want) {
				t.Fatalf("at position %d, %v after: saved at %v, want %v", p.Position(), wait, got, want)
			}
		}
		step(0, 0)
		step(8, 0)                     // 8 events
		step(2, 0, 10)                 // 10: saved
		step(24, 0, 10)                // 34, within the minute
		step(0, time.Minute, 10, 34)   // the minute is up
		step(4, 2*time.Minute, 10, 34) // only 4 since
		step(6, 0, 10, 34, 44)         // 10 since, and the minute is long up
		step(10, 0, 10, 34, 44)        // 10 since, within the minute
		step(0, time.Minute, 10, 34, 44, 54)
		step(2, 0, 10, 34, 44, 54)
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got, want := mem.saved(), []int64{10, 34, 44, 54, 56}; !slices.Equal(got, want) {
			t.Fatalf("after the stop: saved at %v, want %v", got, want)
		}
	})
}
