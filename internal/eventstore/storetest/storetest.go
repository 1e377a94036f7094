// Package storetest is the conformance suite for eventstore.Store. Every
// implementation runs it from its own tests:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) eventstore.Store { return MustOpen(t) })
//	}
//
// newStore must return an empty store for each call and close it in
// t.Cleanup. The suite requires global positions to start at 1 and have no
// gaps (only a compaction leaves some: RunCompact): subscribers resume
// from a position and must never find an event appear behind their
// cursor, so a multi-writer store must serialize position assignment (for
// example under an advisory lock) rather than use a plain sequence.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
)

// waitLimit bounds every wait in the suite so a broken store fails instead
// of hanging the test binary.
const waitLimit = 10 * time.Second

// Run runs the conformance suite against stores made by newStore.
func Run(t *testing.T, newStore func(t *testing.T) eventstore.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s eventstore.Store)
	}{
		{"AppendRead", testAppendRead},
		{"EnvelopeRoundTrip", testEnvelopeRoundTrip},
		{"Cause", testCause},
		{"VersionConflict", testVersionConflict},
		{"AnyVersion", testAnyVersion},
		{"EmptyAppend", testEmptyAppend},
		{"MultiEventAtomic", testMultiEventAtomic},
		{"ReadStreamAfter", testReadStreamAfter},
		{"ReadAllCursor", testReadAllCursor},
		{"Position", testPosition},
		{"ConcurrentSameStream", testConcurrentSameStream},
		{"ConcurrentStreams", testConcurrentStreams},
		{"Subscribe", testSubscribe},
		{"WaitFor", testWaitFor},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, newStore(t))
		})
	}
}

// testCause: events appended under a context with a Cause carry its
// correlation id, the first is caused by its causation and each later one
// by the event before it; ids and causes the caller sets are kept.
func testCause(t *testing.T, s eventstore.Store) {
	ctx := eventstore.WithCause(context.Background(), eventstore.Cause{CorrelationID: "corr_1", CausationID: "request/r1"})
	own := ev("t.own", `{}`)
	own.CorrelationID, own.CausationID = "corr_own", "evt_elsewhere"
	got, err := s.Append(ctx, "s", 0, ev("t.a", `{}`), ev("t.b", `{}`), own, ev("t.c", `{}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ corr, cause string }{
		{"corr_1", "request/r1"},
		{"corr_1", got[0].ID},
		{"corr_own", "evt_elsewhere"},
		{"corr_1", got[2].ID},
	}
	read := mustReadStream(t, s, "s", 0)
	for i, w := range want {
		for _, e := range []eventstore.Event{got[i], read[i]} {
			if e.CorrelationID != w.corr || e.CausationID != w.cause {
				t.Errorf("event %d (%s): correlation %q causation %q, want %q %q", i, e.Type, e.CorrelationID, e.CausationID, w.corr, w.cause)
			}
		}
	}
	plain := MustAppend(t, s, "plain", 0, ev("t.p", `{}`))
	if plain[0].CorrelationID != "" || plain[0].CausationID != "" {
		t.Errorf("without a Cause: correlation %q causation %q, want both empty", plain[0].CorrelationID, plain[0].CausationID)
	}
}

func ev(typ string, data string) eventstore.Proposed {
	return eventstore.Proposed{Type: typ, SchemaVersion: 1, Data: json.RawMessage(data)}
}

// MustAppend appends and fails the test on error.
func MustAppend(tb testing.TB, s eventstore.Store, stream string, expected int64, events ...eventstore.Proposed) []eventstore.Event {
	tb.Helper()
	got, err := s.Append(context.Background(), stream, expected, events...)
	if err != nil {
		tb.Fatalf("Append(%q, %d): %v", stream, expected, err)
	}
	if len(got) != len(events) {
		tb.Fatalf("Append(%q, %d) returned %d events, want %d", stream, expected, len(got), len(events))
	}
	return got
}

// MustReadAll reads every event after the cursor, in pages, and fails the
// test on error.
func MustReadAll(tb testing.TB, s eventstore.Store, after int64) []eventstore.Event {
	tb.Helper()
	var all []eventstore.Event
	for {
		page, err := s.ReadAll(context.Background(), after, 100)
		if err != nil {
			tb.Fatalf("ReadAll(%d, 100): %v", after, err)
		}
		if len(page) == 0 {
			return all
		}
		all = append(all, page...)
		after = page[len(page)-1].Position
	}
}

func mustReadStream(tb testing.TB, s eventstore.Store, stream string, after int64) []eventstore.Event {
	tb.Helper()
	got, err := s.ReadStream(context.Background(), stream, after)
	if err != nil {
		tb.Fatalf("ReadStream(%q, %d): %v", stream, after, err)
	}
	return got
}

func versions(evs []eventstore.Event) []int64 {
	var vs []int64
	for _, e := range evs {
		vs = append(vs, e.StreamVersion)
	}
	return vs
}

func positions(evs []eventstore.Event) []int64 {
	var ps []int64
	for _, e := range evs {
		ps = append(ps, e.Position)
	}
	return ps
}

func seq(from, to int64) []int64 {
	var s []int64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

func testAppendRead(t *testing.T, s eventstore.Store) {
	MustAppend(t, s, "a", 0, ev("t.one", `{"n":1}`))
	MustAppend(t, s, "b", 0, ev("t.one", `{"n":2}`))
	MustAppend(t, s, "a", 1, ev("t.two", `{"n":3}`), ev("t.three", `{"n":4}`))

	a := mustReadStream(t, s, "a", 0)
	if diff := cmp.Diff([]int64{1, 2, 3}, versions(a)); diff != "" {
		t.Errorf("stream a versions (-want +got):\n%s", diff)
	}
	var types []string
	for _, e := range a {
		types = append(types, e.Type)
		if e.StreamID != "a" {
			t.Errorf("event %s in stream a has StreamID %q", e.ID, e.StreamID)
		}
	}
	if diff := cmp.Diff([]string{"t.one", "t.two", "t.three"}, types); diff != "" {
		t.Errorf("stream a types (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{1, 3, 4}, positions(a)); diff != "" {
		t.Errorf("stream a positions (-want +got):\n%s", diff)
	}

	all := MustReadAll(t, s, 0)
	if diff := cmp.Diff(seq(1, 4), positions(all)); diff != "" {
		t.Errorf("ReadAll positions (-want +got):\n%s", diff)
	}
	var data []string
	for _, e := range all {
		data = append(data, string(e.Data))
	}
	if diff := cmp.Diff([]string{`{"n":1}`, `{"n":2}`, `{"n":3}`, `{"n":4}`}, data); diff != "" {
		t.Errorf("ReadAll data (-want +got):\n%s", diff)
	}

	if got := mustReadStream(t, s, "unknown", 0); len(got) != 0 {
		t.Errorf("ReadStream(unknown) = %d events, want none", len(got))
	}
}

func testEnvelopeRoundTrip(t *testing.T, s eventstore.Store) {
	before := time.Now()
	in := []eventstore.Proposed{
		{
			ID:            "evt_caller_chosen",
			Type:          "task.created",
			SchemaVersion: 3,
			Data:          json.RawMessage(`{"title":"x","n":[1,2,3],"s":"h\u00e9 \"q\""}`),
			Actor:         "user:alice",
			CorrelationID: "corr_1",
			CausationID:   "cause_1",
		},
		{Type: "task.started", SchemaVersion: 1}, // no id, no data, no actor
	}
	appended := MustAppend(t, s, "task_1", 0, in...)
	after := time.Now()

	first, second := appended[0], appended[1]
	if first.ID != "evt_caller_chosen" {
		t.Errorf("ID = %q, want the caller's id", first.ID)
	}
	if second.ID == "" || second.ID == first.ID {
		t.Errorf("generated ID = %q, want a new non-empty id", second.ID)
	}
	for _, e := range appended {
		if e.RecordedAt.Location() != time.UTC {
			t.Errorf("event %s RecordedAt location = %v, want UTC", e.ID, e.RecordedAt.Location())
		}
		// Allow for stores that keep only microseconds (PostgreSQL).
		if e.RecordedAt.Before(before.Add(-time.Millisecond)) || e.RecordedAt.After(after.Add(time.Millisecond)) {
			t.Errorf("event %s RecordedAt = %v, want between %v and %v", e.ID, e.RecordedAt, before, after)
		}
	}
	want := []eventstore.Event{
		{
			ID: first.ID, StreamID: "task_1", StreamVersion: 1, Type: "task.created", SchemaVersion: 3,
			Data: in[0].Data, Actor: "user:alice", CorrelationID: "corr_1", CausationID: "cause_1",
			RecordedAt: first.RecordedAt, Position: 1,
		},
		{
			ID: second.ID, StreamID: "task_1", StreamVersion: 2, Type: "task.started", SchemaVersion: 1,
			RecordedAt: second.RecordedAt, Position: 2,
		},
	}
	// JSON is compared by meaning: a store may normalize whitespace (jsonb).
	opts := cmp.Options{cmp.Comparer(jsonEqual)}
	if diff := cmp.Diff(want, appended, opts); diff != "" {
		t.Errorf("Append result (-want +got):\n%s", diff)
	}
	read := mustReadStream(t, s, "task_1", 0)
	if diff := cmp.Diff(appended, read, opts); diff != "" {
		t.Errorf("ReadStream differs from Append result (-append +read):\n%s", diff)
	}
	for _, e := range read {
		if e.RecordedAt.Location() != time.UTC {
			t.Errorf("read event %s RecordedAt location = %v, want UTC", e.ID, e.RecordedAt.Location())
		}
	}
	if diff := cmp.Diff(appended, MustReadAll(t, s, 0), opts); diff != "" {
		t.Errorf("ReadAll differs from Append result (-append +read):\n%s", diff)
	}
}

// jsonEqual compares JSON documents by value; empty equals empty (or null).
func jsonEqual(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return string(a) == string(b)
	}
	return cmp.Equal(x, y)
}

func testVersionConflict(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	MustAppend(t, s, "s", 0, ev("t", `{}`), ev("t", `{}`)) // stream at version 2

	for _, expected := range []int64{0, 1, 3, 10} {
		got, err := s.Append(ctx, "s", expected, ev("t.bad", `{}`))
		if !errors.Is(err, eventstore.ErrVersionConflict) {
			t.Errorf("Append(expected=%d) error = %v, want ErrVersionConflict", expected, err)
		}
		if !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("Append(expected=%d) error = %v, want class ErrConflict", expected, err)
		}
		if len(got) != 0 {
			t.Errorf("Append(expected=%d) returned %d events with an error", expected, len(got))
		}
	}
	// A new stream is at version 0; expecting anything else conflicts.
	if _, err := s.Append(ctx, "new", 1, ev("t.bad", `{}`)); !errors.Is(err, eventstore.ErrVersionConflict) {
		t.Errorf("Append(new stream, expected=1) error = %v, want ErrVersionConflict", err)
	}

	all := MustReadAll(t, s, 0)
	if len(all) != 2 {
		t.Fatalf("after conflicts the store has %d events, want 2", len(all))
	}
	for _, e := range all {
		if e.Type == "t.bad" {
			t.Errorf("a conflicting append was stored: %+v", e)
		}
	}
	// The right version still works, and no position was used up.
	got := MustAppend(t, s, "s", 2, ev("t.ok", `{}`))
	if got[0].StreamVersion != 3 || got[0].Position != 3 {
		t.Errorf("append after conflicts: version %d position %d, want 3 and 3", got[0].StreamVersion, got[0].Position)
	}
}

func testAnyVersion(t *testing.T, s eventstore.Store) {
	got := MustAppend(t, s, "s", eventstore.AnyVersion, ev("t", `{}`))
	if got[0].StreamVersion != 1 {
		t.Errorf("AnyVersion on a new stream: version %d, want 1", got[0].StreamVersion)
	}
	MustAppend(t, s, "s", 1, ev("t", `{}`))
	got = MustAppend(t, s, "s", eventstore.AnyVersion, ev("t", `{}`), ev("t", `{}`))
	if diff := cmp.Diff([]int64{3, 4}, versions(got)); diff != "" {
		t.Errorf("AnyVersion on an existing stream, versions (-want +got):\n%s", diff)
	}
}

func testEmptyAppend(t *testing.T, s eventstore.Store) {
	got, err := s.Append(context.Background(), "s", 0)
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Append with no events: error = %v, want ErrInvalidArgument", err)
	}
	if len(got) != 0 {
		t.Errorf("Append with no events returned %d events", len(got))
	}
	if all := MustReadAll(t, s, 0); len(all) != 0 {
		t.Errorf("store has %d events after an empty append, want 0", len(all))
	}
}

func testMultiEventAtomic(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	MustAppend(t, s, "other", 0, ev("t", `{}`))
	got := MustAppend(t, s, "s", 0, ev("t", `{"i":1}`), ev("t", `{"i":2}`), ev("t", `{"i":3}`))
	if diff := cmp.Diff([]int64{1, 2, 3}, versions(got)); diff != "" {
		t.Errorf("versions (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{2, 3, 4}, positions(got)); diff != "" {
		t.Errorf("positions are not contiguous (-want +got):\n%s", diff)
	}
	// A batch whose second event reuses an existing id fails whole.
	dup := eventstore.Proposed{ID: got[0].ID, Type: "t", SchemaVersion: 1}
	if _, err := s.Append(ctx, "s", 3, ev("t.bad", `{}`), dup); err == nil {
		t.Errorf("Append with a duplicate event id succeeded")
	}
	if _, err := s.Append(ctx, "s", 1, ev("t.bad", `{}`), ev("t.bad", `{}`)); !errors.Is(err, eventstore.ErrVersionConflict) {
		t.Errorf("stale multi-event Append: error = %v, want ErrVersionConflict", err)
	}
	if n := len(MustReadAll(t, s, 0)); n != 4 {
		t.Errorf("store has %d events after failed batches, want 4", n)
	}
	got = MustAppend(t, s, "s", 3, ev("t", `{}`))
	if got[0].Position != 5 || got[0].StreamVersion != 4 {
		t.Errorf("append after failed batches: position %d version %d, want 5 and 4", got[0].Position, got[0].StreamVersion)
	}
}

func testReadStreamAfter(t *testing.T, s eventstore.Store) {
	for i := range 5 {
		MustAppend(t, s, "s", int64(i), ev("t", fmt.Sprintf(`{"i":%d}`, i)))
		MustAppend(t, s, "noise", int64(i), ev("t", `{}`))
	}
	for _, tc := range []struct {
		after int64
		want  []int64
	}{
		{0, seq(1, 5)},
		{2, seq(3, 5)},
		{4, []int64{5}},
		{5, nil},
		{99, nil},
	} {
		got := mustReadStream(t, s, "s", tc.after)
		if diff := cmp.Diff(tc.want, versions(got)); diff != "" {
			t.Errorf("ReadStream(after=%d) versions (-want +got):\n%s", tc.after, diff)
		}
	}
}

func testReadAllCursor(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	streams := []string{"x", "y", "z"}
	var appended []eventstore.Event
	for i := range 10 {
		st := streams[i%3]
		appended = append(appended, MustAppend(t, s, st, eventstore.AnyVersion, ev("t", fmt.Sprintf(`{"i":%d}`, i)))...)
	}
	page, err := s.ReadAll(ctx, 0, 4)
	if err != nil {
		t.Fatalf("ReadAll(0, 4): %v", err)
	}
	if diff := cmp.Diff(seq(1, 4), positions(page)); diff != "" {
		t.Errorf("first page positions (-want +got):\n%s", diff)
	}
	page, err = s.ReadAll(ctx, 4, 4)
	if err != nil {
		t.Fatalf("ReadAll(4, 4): %v", err)
	}
	if diff := cmp.Diff(seq(5, 8), positions(page)); diff != "" {
		t.Errorf("second page positions (-want +got):\n%s", diff)
	}
	page, err = s.ReadAll(ctx, 8, 4)
	if err != nil {
		t.Fatalf("ReadAll(8, 4): %v", err)
	}
	if diff := cmp.Diff(seq(9, 10), positions(page)); diff != "" {
		t.Errorf("last page positions (-want +got):\n%s", diff)
	}
	page, err = s.ReadAll(ctx, 10, 4)
	if err != nil || len(page) != 0 {
		t.Errorf("ReadAll past the end = %d events, %v; want none, nil", len(page), err)
	}
	all := MustReadAll(t, s, 0)
	if diff := cmp.Diff(appended, all, cmp.Comparer(jsonEqual)); diff != "" {
		t.Errorf("ReadAll differs from what was appended (-append +read):\n%s", diff)
	}
}

func testPosition(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	MustAppend(t, s, "a", 0, ev("t", `{}`))
	got := MustAppend(t, s, "b", 0, ev("t", `{}`), eventstore.Proposed{ID: "evt_known", Type: "t", SchemaVersion: 1})
	for _, e := range got {
		pos, err := s.Position(ctx, e.ID)
		if err != nil {
			t.Errorf("Position(%q): %v", e.ID, err)
		}
		if pos != e.Position {
			t.Errorf("Position(%q) = %d, want %d", e.ID, pos, e.Position)
		}
	}
	if _, err := s.Position(ctx, "evt_unknown"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Position(unknown) error = %v, want ErrNotFound", err)
	}
}

// testConcurrentSameStream races 8 writers on one stream, each appending 50
// events with the version it last saw. Exactly one append may win each
// version.
func testConcurrentSameStream(t *testing.T, s eventstore.Store) {
	const writers, each = 8, 50
	ctx, cancel := context.WithTimeout(context.Background(), 4*waitLimit)
	defer cancel()

	var (
		mu   sync.Mutex
		won  = map[int64]string{} // version -> "writer/i"
		wg   sync.WaitGroup
		errs = make(chan error, writers)
	)
	for w := range writers {
		wg.Go(func() {
			var seen int64
			for i := 0; i < each; {
				tag := fmt.Sprintf("%d/%d", w, i)
				got, err := s.Append(ctx, "hot", seen, ev("t", fmt.Sprintf(`{"tag":%q}`, tag)))
				if errors.Is(err, eventstore.ErrVersionConflict) {
					tail, err := s.ReadStream(ctx, "hot", seen)
					if err != nil {
						errs <- fmt.Errorf("writer %d: ReadStream: %w", w, err)
						return
					}
					if len(tail) == 0 {
						errs <- fmt.Errorf("writer %d: conflict at version %d but no newer events", w, seen)
						return
					}
					seen = tail[len(tail)-1].StreamVersion
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("writer %d: Append: %w", w, err)
					return
				}
				v := got[0].StreamVersion
				if v != seen+1 {
					errs <- fmt.Errorf("writer %d: appended at version %d, expected %d", w, v, seen+1)
					return
				}
				mu.Lock()
				if prev, ok := won[v]; ok {
					errs <- fmt.Errorf("version %d won twice: by %s and %s", v, prev, tag)
				}
				won[v] = tag
				mu.Unlock()
				seen = v
				i++
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	const n = writers * each
	evs := mustReadStream(t, s, "hot", 0)
	if diff := cmp.Diff(seq(1, n), versions(evs)); diff != "" {
		t.Errorf("stream versions (-want +got):\n%s", diff)
	}
	tags := map[string]bool{}
	for _, e := range evs {
		var d struct{ Tag string }
		if err := json.Unmarshal(e.Data, &d); err != nil {
			t.Fatalf("event %s data: %v", e.ID, err)
		}
		if d.Tag != won[e.StreamVersion] {
			t.Errorf("version %d holds %q, but %q won it", e.StreamVersion, d.Tag, won[e.StreamVersion])
		}
		tags[d.Tag] = true
	}
	if len(tags) != n {
		t.Errorf("%d distinct appends stored, want %d", len(tags), n)
	}
	if diff := cmp.Diff(seq(1, n), positions(MustReadAll(t, s, 0))); diff != "" {
		t.Errorf("positions (-want +got):\n%s", diff)
	}
}

// testConcurrentStreams has 8 writers append 50 events each to their own
// streams: all succeed, and positions are unique and without gaps.
func testConcurrentStreams(t *testing.T, s eventstore.Store) {
	const writers, each = 8, 50
	ctx, cancel := context.WithTimeout(context.Background(), 4*waitLimit)
	defer cancel()

	var wg sync.WaitGroup
	errs := make(chan error, writers)
	results := make([][]eventstore.Event, writers)
	for w := range writers {
		wg.Go(func() {
			stream := fmt.Sprintf("s%d", w)
			for i := range each {
				got, err := s.Append(ctx, stream, int64(i), ev("t", fmt.Sprintf(`{"i":%d}`, i)))
				if err != nil {
					errs <- fmt.Errorf("writer %d, append %d: %w", w, i, err)
					return
				}
				results[w] = append(results[w], got...)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	const n = writers * each
	all := MustReadAll(t, s, 0)
	if diff := cmp.Diff(seq(1, n), positions(all)); diff != "" {
		t.Errorf("positions (-want +got):\n%s", diff)
	}
	byPos := map[int64]eventstore.Event{}
	for _, e := range all {
		byPos[e.Position] = e
	}
	for w, evs := range results {
		if diff := cmp.Diff(seq(1, each), versions(evs)); diff != "" {
			t.Errorf("writer %d versions (-want +got):\n%s", w, diff)
		}
		for i, e := range evs {
			if i > 0 && e.Position <= evs[i-1].Position {
				t.Errorf("writer %d: position %d after %d", w, e.Position, evs[i-1].Position)
			}
			if r, ok := byPos[e.Position]; !ok || r.ID != e.ID {
				t.Errorf("writer %d: event %s at position %d not found there in ReadAll", w, e.ID, e.Position)
			}
		}
	}
}

func testSubscribe(t *testing.T, s eventstore.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	old := MustAppend(t, s, "a", 0, ev("t", `{"i":1}`), ev("t", `{"i":2}`), ev("t", `{"i":3}`))

	const live = 20
	sub := eventstore.Subscribe(s, old[0].Position) // skip the first one
	got := make(chan eventstore.Event)
	errc := make(chan error, 2) // one per goroutine below
	go func() {
		defer close(got)
		for range 2 + live {
			e, err := sub.Next(ctx)
			if err != nil {
				errc <- err
				return
			}
			select {
			case got <- e:
			case <-ctx.Done():
				return
			}
		}
	}()

	next := func() eventstore.Event {
		t.Helper()
		select {
		case e, ok := <-got:
			if !ok {
				t.Fatalf("subscription ended: %v", <-errc)
			}
			return e
		case <-ctx.Done():
			t.Fatalf("no event from the subscription: %v", ctx.Err())
		}
		return eventstore.Event{}
	}
	for _, want := range old[1:] {
		if e := next(); e.ID != want.ID || e.Position != want.Position {
			t.Fatalf("caught-up event = %s@%d, want %s@%d", e.ID, e.Position, want.ID, want.Position)
		}
	}

	// Live events from another goroutine, on two streams.
	appended := make(chan []eventstore.Event, 1)
	go func() {
		var all []eventstore.Event
		for i := range live {
			stream := []string{"a", "b"}[i%2]
			got, err := s.Append(ctx, stream, eventstore.AnyVersion, ev("t.live", fmt.Sprintf(`{"i":%d}`, i)))
			if err != nil {
				errc <- err
				close(appended)
				return
			}
			all = append(all, got...)
			time.Sleep(time.Millisecond) // let some arrive while the subscriber waits
		}
		appended <- all
	}()
	var received []eventstore.Event
	for range live {
		received = append(received, next())
	}
	want, ok := <-appended
	if !ok {
		t.Fatalf("live append failed: %v", <-errc)
	}
	if diff := cmp.Diff(want, received, cmp.Comparer(jsonEqual)); diff != "" {
		t.Errorf("live events (-appended +received):\n%s", diff)
	}
	if c := sub.Cursor(); c != want[len(want)-1].Position {
		t.Errorf("Cursor() = %d, want %d", c, want[len(want)-1].Position)
	}
}

func testWaitFor(t *testing.T, s eventstore.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	first := MustAppend(t, s, "a", 0, ev("t", `{}`))
	head := first[0].Position

	// Already satisfied: returns at once.
	if err := s.WaitFor(ctx, head-1); err != nil {
		t.Fatalf("WaitFor(head-1): %v", err)
	}

	// Blocks until another goroutine appends.
	done := make(chan error, 1)
	go func() { done <- s.WaitFor(ctx, head) }()
	select {
	case err := <-done:
		t.Fatalf("WaitFor(head) returned %v before any append", err)
	case <-time.After(50 * time.Millisecond):
	}
	MustAppend(t, s, "b", 0, ev("t", `{}`))
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WaitFor(head) after append: %v", err)
		}
	case <-ctx.Done():
		t.Fatalf("WaitFor(head) did not return after an append")
	}
	if n := len(MustReadAll(t, s, head)); n != 1 {
		t.Errorf("after WaitFor, %d events past the old head, want 1", n)
	}

	// Returns ctx.Err() when ctx is cancelled while it waits.
	wctx, wcancel := context.WithCancel(ctx)
	go func() { done <- s.WaitFor(wctx, head+1) }()
	time.Sleep(20 * time.Millisecond)
	wcancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("WaitFor after cancel = %v, want context.Canceled", err)
		}
	case <-ctx.Done():
		t.Fatalf("WaitFor did not return after its ctx was cancelled")
	}

	// And with a deadline.
	dctx, dcancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer dcancel()
	if err := s.WaitFor(dctx, head+1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitFor past its deadline = %v, want context.DeadlineExceeded", err)
	}
}
