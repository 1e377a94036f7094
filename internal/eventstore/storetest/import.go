package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
)

// RunImport runs the conformance suite of eventstore.Importer against
// stores made by newStore, which must return an empty store for each
// call and close it in t.Cleanup.
func RunImport(t *testing.T, newStore func(t *testing.T) eventstore.Importer) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s eventstore.Importer)
	}{
		{"KeepsEverything", testImportKeepsEverything},
		{"InBatches", testImportInBatches},
		{"AfterAppends", testImportAfterAppends},
		{"AppendsFollow", testImportAppendsFollow},
		{"RefusesWhole", testImportRefusesWhole},
		{"WakesWaitFor", testImportWakesWaitFor},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, newStore(t))
		})
	}
}

// committed is a committed event as another store made it, at position
// pos, version v of stream, recorded at a microsecond (which every store
// keeps).
func committed(pos int64, stream string, v int64, data string) eventstore.Event {
	e := eventstore.Event{
		ID:            fmt.Sprintf("evt_imported_%03d", pos),
		StreamID:      stream,
		StreamVersion: v,
		Type:          "t.imported",
		SchemaVersion: 2,
		Actor:         "alice",
		CorrelationID: "corr_1",
		CausationID:   fmt.Sprintf("evt_imported_%03d", pos-1),
		RecordedAt:    time.Date(2025, 3, 1, 12, 0, 0, int(pos)*1000, time.UTC),
		Position:      pos,
	}
	if data != "" {
		e.Data = json.RawMessage(data)
	}
	return e
}

// mustImport imports and fails the test on error.
func mustImport(tb testing.TB, s eventstore.Importer, evs ...eventstore.Event) {
	tb.Helper()
	if err := s.Import(context.Background(), evs); err != nil {
		tb.Fatalf("Import(%d events from %d): %v", len(evs), evs[0].Position, err)
	}
}

func mustHead(tb testing.TB, s eventstore.Importer) int64 {
	tb.Helper()
	h, err := s.Head(context.Background())
	if err != nil {
		tb.Fatalf("Head: %v", err)
	}
	return h
}

// testImportKeepsEverything: what Import takes, the reads give back as
// Fit says, field for field: ids, versions, positions, causes, times,
// data (none, or its text as it was).
func testImportKeepsEverything(t *testing.T, s eventstore.Importer) {
	if h := mustHead(t, s); h != 0 {
		t.Fatalf("Head of an empty store: %d", h)
	}
	in := []eventstore.Event{
		committed(1, "task/a", 1, `{"prompt": "héllo ✓",  "n":1}`),
		committed(2, "task/b", 1, ``),
		committed(3, "task/a", 2, `{"s":"nul \u0000 escaped"}`),
		committed(4, "task/a", 3, `[1, 2.50, "x"]`),
	}
	in[1].Actor, in[1].CorrelationID, in[1].CausationID = "", "", ""
	mustImport(t, s, in...)
	var want []eventstore.Event
	for _, e := range in {
		f, err := s.Fit(e)
		if err != nil {
			t.Fatalf("Fit(%d): %v", e.Position, err)
		}
		if !f.RecordedAt.Equal(e.RecordedAt) {
			t.Errorf("Fit changed a time in whole microseconds: %v to %v", e.RecordedAt, f.RecordedAt)
		}
		want = append(want, f)
	}
	if diff := cmp.Diff(want, MustReadAll(t, s, 0)); diff != "" {
		t.Errorf("ReadAll after Import (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]eventstore.Event{want[0], want[2], want[3]}, mustReadStream(t, s, "task/a", 0)); diff != "" {
		t.Errorf("ReadStream after Import (-want +got):\n%s", diff)
	}
	if p, err := s.Position(context.Background(), in[2].ID); err != nil || p != 3 {
		t.Errorf("Position(%s) = %d, %v; want 3", in[2].ID, p, err)
	}
	if h := mustHead(t, s); h != 4 {
		t.Errorf("Head after importing 4: %d", h)
	}
}

// testImportInBatches: a log goes in batch after batch, each going on
// past the head and past each stream's version, over the gaps a
// compaction left in the source's log (Compactor); one that starts at or
// below either is a conflict and changes nothing.
func testImportInBatches(t *testing.T, s eventstore.Importer) {
	mustImport(t, s, committed(1, "a", 1, `{}`), committed(2, "b", 1, `{}`))
	mustImport(t, s, committed(3, "a", 2, `{}`), committed(4, "c", 1, `{}`))
	for _, batch := range [][]eventstore.Event{
		{committed(4, "d", 1, `{}`)}, // behind the head
		{committed(1, "a", 1, `{}`)}, // the start again
		{committed(5, "a", 2, `{}`)}, // taken
		{committed(5, "b", 1, `{}`)}, // b is at 1
		{committed(5, "b", 2, `{}`), committed(6, "a", 3, `{}`), committed(7, "c", 1, `{}`)}, // c is at 1
	} {
		err := s.Import(context.Background(), batch)
		if !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("Import from %d (stream %s version %d): %v, want a conflict", batch[0].Position, batch[0].StreamID, batch[0].StreamVersion, err)
		}
	}
	if h := mustHead(t, s); h != 4 {
		t.Errorf("Head after refused batches: %d, want 4", h)
	}
	if got := positions(MustReadAll(t, s, 0)); !cmp.Equal(got, seq(1, 4)) {
		t.Errorf("positions after refused batches: %v", got)
	}
	mustImport(t, s, committed(5, "a", 3, `{}`))
	if got := versions(mustReadStream(t, s, "a", 0)); !cmp.Equal(got, []int64{1, 2, 3}) {
		t.Errorf("stream a versions: %v", got)
	}
	// Gaps: positions 6 and 7, a's version 4, e's 1 (none of them in the
	// source's log any more).
	mustImport(t, s, committed(8, "a", 5, `{}`), committed(9, "e", 2, `{}`))
	if got := positions(MustReadAll(t, s, 0)); !cmp.Equal(got, []int64{1, 2, 3, 4, 5, 8, 9}) {
		t.Errorf("positions after a batch with gaps: %v", got)
	}
	if got := versions(mustReadStream(t, s, "a", 0)); !cmp.Equal(got, []int64{1, 2, 3, 5}) {
		t.Errorf("stream a versions after a batch with gaps: %v", got)
	}
	if h := mustHead(t, s); h != 9 {
		t.Errorf("Head after a batch with gaps: %d, want 9", h)
	}
	if got := MustAppend(t, s, "a", 5, ev("t.next", `{}`)); got[0].Position != 10 || got[0].StreamVersion != 6 {
		t.Errorf("append after a batch with gaps: position %d version %d, want 10 and 6", got[0].Position, got[0].StreamVersion)
	}
}

// testImportAfterAppends: Import goes on from a head and versions that
// appends made.
func testImportAfterAppends(t *testing.T, s eventstore.Importer) {
	MustAppend(t, s, "a", 0, ev("t.one", `{}`), ev("t.two", `{}`))
	mustImport(t, s, committed(3, "a", 3, `{}`), committed(4, "b", 1, `{}`))
	if got := versions(mustReadStream(t, s, "a", 0)); !cmp.Equal(got, []int64{1, 2, 3}) {
		t.Errorf("stream a versions: %v", got)
	}
	if h := mustHead(t, s); h != 4 {
		t.Errorf("Head: %d, want 4", h)
	}
}

// testImportAppendsFollow: appends after an import go on from its head
// and its streams' versions, and expected versions are checked against
// them.
func testImportAppendsFollow(t *testing.T, s eventstore.Importer) {
	mustImport(t, s, committed(1, "a", 1, `{}`), committed(2, "a", 2, `{}`), committed(3, "b", 1, `{}`))
	got := MustAppend(t, s, "a", 2, ev("t.next", `{}`))
	if got[0].Position != 4 || got[0].StreamVersion != 3 {
		t.Errorf("append after import: position %d version %d, want 4 and 3", got[0].Position, got[0].StreamVersion)
	}
	if _, err := s.Append(context.Background(), "b", 0, ev("t.stale", `{}`)); !errors.Is(err, eventstore.ErrVersionConflict) {
		t.Errorf("append to an imported stream at version 0: %v, want a version conflict", err)
	}
	got = MustAppend(t, s, "c", eventstore.AnyVersion, ev("t.new", `{}`))
	if got[0].Position != 5 {
		t.Errorf("second append: position %d, want 5", got[0].Position)
	}
	if h := mustHead(t, s); h != 5 {
		t.Errorf("Head: %d, want 5", h)
	}
}

// testImportRefusesWhole: a batch with one bad event writes none of them,
// with the bad event's class: positions or versions that do not rise
// within the batch or an event no store keeps is an invalid argument, an
// id the store has is already there.
func testImportRefusesWhole(t *testing.T, s eventstore.Importer) {
	mustImport(t, s, committed(1, "a", 1, `{}`))
	noType := committed(3, "b", 1, `{}`)
	noType.Type = ""
	dupID := committed(3, "b", 1, `{}`)
	dupID.ID = committed(1, "a", 1, "").ID
	for _, tc := range []struct {
		name  string
		batch []eventstore.Event
		class error
	}{
		{"empty", nil, errdefs.ErrInvalidArgument},
		{"positions back", []eventstore.Event{committed(3, "a", 2, `{}`), committed(2, "a", 3, `{}`)}, errdefs.ErrInvalidArgument},
		{"versions back", []eventstore.Event{committed(2, "a", 3, `{}`), committed(3, "a", 2, `{}`)}, errdefs.ErrInvalidArgument},
		{"no type", []eventstore.Event{committed(2, "a", 2, `{}`), noType}, errdefs.ErrInvalidArgument},
		{"data not JSON", []eventstore.Event{committed(2, "a", 2, `{"a":`)}, errdefs.ErrInvalidArgument},
		{"id taken", []eventstore.Event{committed(2, "a", 2, `{}`), dupID}, errdefs.ErrAlreadyExists},
	} {
		if err := s.Import(context.Background(), tc.batch); !errors.Is(err, tc.class) {
			t.Errorf("%s: Import: %v, want %v", tc.name, err, tc.class)
		}
	}
	if got := positions(MustReadAll(t, s, 0)); !cmp.Equal(got, []int64{1}) {
		t.Errorf("positions after refused batches: %v, want [1]", got)
	}
	if h := mustHead(t, s); h != 1 {
		t.Errorf("Head: %d, want 1", h)
	}
	// The store takes the right batch after all that.
	mustImport(t, s, committed(2, "a", 2, `{}`))
}

// testImportWakesWaitFor: a follower waiting for the next event sees an
// imported one, as it would an appended one.
func testImportWakesWaitFor(t *testing.T, s eventstore.Importer) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.WaitFor(ctx, 0) }()
	mustImport(t, s, committed(1, "a", 1, `{}`))
	if err := <-done; err != nil {
		t.Fatalf("WaitFor after Import: %v", err)
	}
	sub := eventstore.Subscribe(s, 0)
	e, err := sub.Next(ctx)
	if err != nil || e.ID != committed(1, "a", 1, "").ID {
		t.Errorf("Subscription.Next after Import: %v, %v", e.ID, err)
	}
}
