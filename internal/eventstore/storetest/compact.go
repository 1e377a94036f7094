package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
)

// CompactStore is a store that can compact streams.
type CompactStore interface {
	eventstore.Store
	eventstore.Compactor
}

// RunCompact runs the conformance suite of eventstore.Compactor against
// stores made by newStore, which must return an empty store for each
// call and close it in t.Cleanup.
func RunCompact(t *testing.T, newStore func(t *testing.T) CompactStore) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s CompactStore)
	}{
		{"RemovesAndMarks", testCompactRemovesAndMarks},
		{"Conflict", testCompactConflict},
		{"Again", testCompactAgain},
		{"Invalid", testCompactInvalid},
		{"WakesWaitFor", testCompactWakesWaitFor},
		{"RacesAppends", testCompactRacesAppends},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, newStore(t))
		})
	}
}

// mustCompact compacts and fails the test on error.
func mustCompact(tb testing.TB, s CompactStore, stream string, expected int64, types []string, marker eventstore.Proposed) (eventstore.Event, int) {
	tb.Helper()
	e, n, err := s.Compact(context.Background(), stream, expected, types, marker)
	if err != nil {
		tb.Fatalf("Compact(%q, %d, %v): %v", stream, expected, types, err)
	}
	return e, n
}

// without is evs but those of stream with a type in types.
func without(evs []eventstore.Event, stream string, types ...string) []eventstore.Event {
	return slices.DeleteFunc(slices.Clone(evs), func(e eventstore.Event) bool {
		return e.StreamID == stream && slices.Contains(types, e.Type)
	})
}

// testCompactRemovesAndMarks: the stream's events of the types go, its
// others and every other stream's stay as they were, the marker follows
// at the next version and position (after the stream's last event, one
// it removed too), with the Cause of its context; reads pass over the
// gaps, a removed event's id is not found, and appends go on after the
// marker.
func testCompactRemovesAndMarks(t *testing.T, s CompactStore) {
	MustAppend(t, s, "s", 0, ev("keep", `{"n":1}`), ev("drop", `{"n":2}`))
	MustAppend(t, s, "o", 0, ev("drop", `{"n":3}`))
	MustAppend(t, s, "s", 2, ev("keep", `{"n":4}`), ev("drop", `{"n":5}`), ev("drop", `{"n":6}`))
	before := MustReadAll(t, s, 0)
	ctx := eventstore.WithCause(context.Background(), eventstore.Cause{CorrelationID: "corr_r", CausationID: "retention"})

	marker, n, err := s.Compact(ctx, "s", 5, []string{"drop", "absent"}, ev("marker", `{"removed":3}`))
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Errorf("Compact removed %d events, want 3", n)
	}
	if marker.StreamID != "s" || marker.StreamVersion != 6 || marker.Position != 7 || marker.Type != "marker" || marker.ID == "" ||
		marker.CorrelationID != "corr_r" || marker.CausationID != "retention" || marker.RecordedAt.IsZero() {
		t.Errorf("marker %+v, want version 6 of s at position 7, with the context's cause", marker)
	}
	want := append(without(before, "s", "drop"), marker)
	if diff := cmp.Diff(want, MustReadAll(t, s, 0), cmp.Comparer(jsonEqual)); diff != "" {
		t.Errorf("ReadAll after Compact (-want +got):\n%s", diff)
	}
	if got := versions(mustReadStream(t, s, "s", 0)); !cmp.Equal(got, []int64{1, 3, 6}) {
		t.Errorf("versions of s: %v, want [1 3 6]", got)
	}
	if got := versions(mustReadStream(t, s, "s", 1)); !cmp.Equal(got, []int64{3, 6}) {
		t.Errorf("versions of s after 1: %v, want [3 6]", got)
	}
	if got := versions(mustReadStream(t, s, "s", 4)); !cmp.Equal(got, []int64{6}) {
		t.Errorf("versions of s after 4, a removed one: %v, want [6]", got)
	}
	if got := positions(MustReadAll(t, s, 1)); !cmp.Equal(got, []int64{3, 4, 7}) {
		t.Errorf("positions after 1: %v, want [3 4 7]", got)
	}
	if _, err := s.Position(context.Background(), before[1].ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Position of a removed event: %v, want not found", err)
	}
	if p, err := s.Position(context.Background(), marker.ID); err != nil || p != 7 {
		t.Errorf("Position of the marker: %d, %v", p, err)
	}
	if _, err := s.Append(context.Background(), "s", 5, ev("stale", `{}`)); !errors.Is(err, eventstore.ErrVersionConflict) {
		t.Errorf("append at the version before the marker: %v, want a version conflict", err)
	}
	next := MustAppend(t, s, "s", 6, ev("keep", `{}`))
	if next[0].StreamVersion != 7 || next[0].Position != 8 {
		t.Errorf("append after the marker: version %d position %d, want 7 and 8", next[0].StreamVersion, next[0].Position)
	}
}

// testCompactConflict: a stream that is not at the expected version is
// left as it is, and so is the log.
func testCompactConflict(t *testing.T, s CompactStore) {
	MustAppend(t, s, "s", 0, ev("keep", `{}`), ev("drop", `{}`), ev("drop", `{}`))
	before := MustReadAll(t, s, 0)
	for _, expected := range []int64{2, 4} {
		if _, _, err := s.Compact(context.Background(), "s", expected, []string{"drop"}, ev("marker", `{}`)); !errors.Is(err, eventstore.ErrVersionConflict) {
			t.Errorf("Compact at version %d of a stream at 3: %v, want a version conflict", expected, err)
		}
	}
	if _, _, err := s.Compact(context.Background(), "none", 1, []string{"drop"}, ev("marker", `{}`)); !errors.Is(err, eventstore.ErrVersionConflict) {
		t.Errorf("Compact of a stream that does not exist: %v, want a version conflict", err)
	}
	if diff := cmp.Diff(before, MustReadAll(t, s, 0), cmp.Comparer(jsonEqual)); diff != "" {
		t.Errorf("log after refused compactions (-before +after):\n%s", diff)
	}
	if got := MustAppend(t, s, "o", 0, ev("t", `{}`)); got[0].Position != 4 {
		t.Errorf("append after refused compactions: position %d, want 4", got[0].Position)
	}
}

// testCompactAgain: a stream compacted once is compacted again, its
// first marker with what it marked, and a compaction that finds nothing
// of the types only adds its marker.
func testCompactAgain(t *testing.T, s CompactStore) {
	MustAppend(t, s, "s", 0, ev("keep", `{}`), ev("drop", `{}`))
	mustCompact(t, s, "s", 2, []string{"drop"}, ev("marker", `{"removed":1}`))
	MustAppend(t, s, "s", 3, ev("drop", `{}`))
	second, n := mustCompact(t, s, "s", 4, []string{"drop", "marker"}, ev("marker", `{"removed":2}`))
	if n != 2 || second.StreamVersion != 5 {
		t.Errorf("second compaction: removed %d, marker at version %d; want 2 and 5", n, second.StreamVersion)
	}
	if got := versions(mustReadStream(t, s, "s", 0)); !cmp.Equal(got, []int64{1, 5}) {
		t.Errorf("versions of s: %v, want [1 5]", got)
	}
	third, n := mustCompact(t, s, "s", 5, []string{"drop"}, ev("marker", `{}`))
	if n != 0 || third.StreamVersion != 6 {
		t.Errorf("compaction with nothing to remove: removed %d, marker at version %d; want 0 and 6", n, third.StreamVersion)
	}
}

// testCompactInvalid: what every store refuses before it looks at the
// log, with the log left as it is.
func testCompactInvalid(t *testing.T, s CompactStore) {
	MustAppend(t, s, "s", 0, ev("keep", `{}`), ev("drop", `{}`))
	before := MustReadAll(t, s, 0)
	for _, tc := range []struct {
		name     string
		stream   string
		expected int64
		types    []string
		marker   eventstore.Proposed
	}{
		{"empty stream id", "", 2, []string{"drop"}, ev("marker", `{}`)},
		{"any version", "s", eventstore.AnyVersion, []string{"drop"}, ev("marker", `{}`)},
		{"version 0", "s", 0, []string{"drop"}, ev("marker", `{}`)},
		{"no types", "s", 2, nil, ev("marker", `{}`)},
		{"marker without a type", "s", 2, []string{"drop"}, ev("", `{}`)},
		{"marker data not JSON", "s", 2, []string{"drop"}, ev("marker", `{`)},
	} {
		if _, _, err := s.Compact(context.Background(), tc.stream, tc.expected, tc.types, tc.marker); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: Compact: %v, want an invalid argument", tc.name, err)
		}
	}
	if diff := cmp.Diff(before, MustReadAll(t, s, 0), cmp.Comparer(jsonEqual)); diff != "" {
		t.Errorf("log after refused compactions (-before +after):\n%s", diff)
	}
}

// testCompactWakesWaitFor: a follower at the head sees the marker, as it
// would an appended event.
func testCompactWakesWaitFor(t *testing.T, s CompactStore) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	evs := MustAppend(t, s, "s", 0, ev("keep", `{}`), ev("drop", `{}`))
	sub := eventstore.Subscribe(s, evs[1].Position)
	got := make(chan eventstore.Event, 1)
	errc := make(chan error, 1)
	go func() {
		e, err := sub.Next(ctx)
		if err != nil {
			errc <- err
			return
		}
		got <- e
	}()
	time.Sleep(10 * time.Millisecond) // let it wait
	marker, _ := mustCompact(t, s, "s", 2, []string{"drop"}, ev("marker", `{}`))
	select {
	case e := <-got:
		if e.ID != marker.ID {
			t.Errorf("the follower got %s@%d, want the marker %s@%d", e.ID, e.Position, marker.ID, marker.Position)
		}
	case err := <-errc:
		t.Fatalf("Next: %v", err)
	}
}

// testCompactRacesAppends: compactions of a stream while events of the
// types they remove are appended to it. An append that succeeded is in
// the log, or a compaction that succeeded at or past its version
// removed it; no version is ever given twice, to the marker or anyone.
func testCompactRacesAppends(t *testing.T, s CompactStore) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	MustAppend(t, s, "s", 0, ev("keep", `{}`))
	var (
		mu       sync.Mutex
		appended []eventstore.Event
		wg       sync.WaitGroup
	)
	for w := range 3 {
		wg.Go(func() {
			for i := range 40 {
				got, err := s.Append(ctx, "s", eventstore.AnyVersion, ev("drop", fmt.Sprintf(`{"w":%d,"i":%d}`, w, i)))
				if err != nil {
					t.Errorf("Append: %v", err)
					return
				}
				mu.Lock()
				appended = append(appended, got...)
				mu.Unlock()
			}
		})
	}
	var compacted, conflicts int
	var through int64 // the highest version a successful compaction was at
	markers := map[int64]string{}
	for range 60 {
		evs := mustReadStream(t, s, "s", 0)
		v := evs[len(evs)-1].StreamVersion
		marker, _, err := s.Compact(ctx, "s", v, []string{"drop", "marker"}, ev("marker", `{}`))
		switch {
		case errors.Is(err, eventstore.ErrVersionConflict):
			conflicts++
		case err != nil:
			t.Fatalf("Compact: %v", err)
		default:
			compacted++
			through = max(through, v)
			markers[marker.StreamVersion] = marker.ID
		}
	}
	wg.Wait()
	final := mustReadStream(t, s, "s", 0)
	at := map[int64]string{}
	for _, e := range final {
		at[e.StreamVersion] = e.ID
	}
	for _, e := range appended {
		id, kept := at[e.StreamVersion]
		switch {
		case kept && id != e.ID:
			t.Errorf("version %d of s is %s, but an append of %s got it", e.StreamVersion, id, e.ID)
		case !kept && e.StreamVersion > through:
			t.Errorf("%s (version %d) is gone, but no compaction was at or past its version (the last at %d)", e.ID, e.StreamVersion, through)
		}
		if id, ok := markers[e.StreamVersion]; ok {
			t.Errorf("version %d of s went both to the marker %s and to the append of %s", e.StreamVersion, id, e.ID)
		}
	}
	if compacted == 0 {
		t.Errorf("no compaction succeeded (%d conflicts)", conflicts)
	}
}
