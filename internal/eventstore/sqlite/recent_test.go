package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/eventstore"
)

// TestRecentReadsAsSQLite: ReadAll from the in-memory tail returns what
// SQLite returns, field for field, at every position the tail covers, at
// its edge, and beyond it (where SQLite answers), across a reopen (an empty
// tail) and after the tail has dropped its oldest events.
func TestRecentReadsAsSQLite(t *testing.T) {
	ctx := context.Background()
	path := t.TempDir() + "/corral.db"
	s, err := Open(ctx, path, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	appendSome := func(s *Store, n int) {
		t.Helper()
		for i := range n {
			evs := []eventstore.Proposed{{Type: "t", SchemaVersion: 1, Actor: "a", Data: []byte(fmt.Sprintf(`{"i":%d}`, i))}}
			if i%3 == 0 {
				evs = append(evs, eventstore.Proposed{Type: "empty", SchemaVersion: 2, Actor: "b", CorrelationID: "c", CausationID: "d", Data: []byte{}})
			}
			if _, err := s.Append(ctx, fmt.Sprintf("s-%d", i%5), eventstore.AnyVersion, evs...); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(s *Store, limit int) {
		t.Helper()
		s.mu.Lock()
		head, first := s.head, int64(1)
		if len(s.recent.evs) > 0 {
			first = s.recent.evs[0].Position
		}
		s.mu.Unlock()
		// Both edges of the tail and of the log, and a sample between.
		positions := []int64{0, 1, first - 2, first - 1, first, first + 1, head - 2, head - 1, head, head + 1}
		for p := int64(0); p < head; p += 37 {
			positions = append(positions, p)
		}
		for _, after := range positions {
			if after < 0 {
				continue
			}
			got, err := s.ReadAll(ctx, after, limit)
			if err != nil {
				t.Fatal(err)
			}
			want, err := s.readAll(ctx, after, limit)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("ReadAll(%d, %d) (-SQLite +store):\n%s", after, limit, diff)
			}
			// As the API and the event streams encode them, too.
			if w, g := mustJSON(t, want), mustJSON(t, got); w != g {
				t.Fatalf("ReadAll(%d, %d) encodes as\n%s\nfrom SQLite as\n%s", after, limit, g, w)
			}
		}
	}
	appendSome(s, 30)
	s.mu.Lock()
	if len(s.recent.evs) == 0 {
		t.Fatal("nothing in the tail after 30 appends")
	}
	s.mu.Unlock()
	check(s, 7)
	check(s, 256)

	// A read the tail serves does not share its data with the next.
	got, err := s.ReadAll(ctx, 0, 1)
	if err != nil || len(got) != 1 {
		t.Fatal(got, err)
	}
	got[0].Data[0] = 'X'
	if again, _ := s.ReadAll(ctx, 0, 1); again[0].Data[0] == 'X' {
		t.Error("a caller's change to an event's data reached the next reader")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopened: the tail starts empty, older events come from SQLite,
	// and it fills past recentEvents, then drops the oldest.
	s = MustOpen(t, path)
	check(s, 256)
	appendSome(s, 2*recentEvents+10)
	s.mu.Lock()
	n, first := len(s.recent.evs), s.recent.evs[0].Position
	s.mu.Unlock()
	if n > 2*recentEvents || first <= 1 {
		t.Fatalf("the tail holds %d events from position %d: not bounded", n, first)
	}
	check(s, 256)
}

// TestRecentWithGaps: the tail answers as SQLite does where the log has
// gaps: those an import brings from its source, and those a compaction
// leaves (it empties the tail, which still holds what it removed).
func TestRecentWithGaps(t *testing.T) {
	ctx := context.Background()
	s := MustOpenTemp(t)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var imported []eventstore.Event
	for i, p := range []int64{1, 2, 5, 6, 9} {
		imported = append(imported, eventstore.Event{ID: fmt.Sprintf("evt_%d", p), StreamID: "s", StreamVersion: int64(i + 1),
			Type: "t", SchemaVersion: 1, RecordedAt: at, Position: p})
	}
	if err := s.Import(ctx, imported); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if _, err := s.Append(ctx, "o", eventstore.AnyVersion, eventstore.Proposed{Type: "drop", SchemaVersion: 1}, eventstore.Proposed{Type: "keep", SchemaVersion: 1}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(what string) {
		t.Helper()
		for after := int64(0); after <= s.head+1; after++ {
			got, err := s.ReadAll(ctx, after, 3)
			if err != nil {
				t.Fatal(err)
			}
			want, err := s.readAll(ctx, after, 3)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("%s: ReadAll(%d, 3) (-SQLite +store):\n%s", what, after, diff)
			}
		}
	}
	check("after an import with gaps")
	if _, _, err := s.Compact(ctx, "o", 8, []string{"drop"}, eventstore.Proposed{Type: "marker", SchemaVersion: 1}); err != nil {
		t.Fatal(err)
	}
	check("after a compaction")
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// BenchmarkFollowerRead is what each follower of the log does after a
// commit: read the events after the position it had. From the in-memory
// tail, beside the same read from SQLite.
//
//	go test -run '^$' -bench FollowerRead ./internal/eventstore/sqlite
func BenchmarkFollowerRead(b *testing.B) {
	ctx := context.Background()
	s := MustOpenTemp(b)
	for range 100 {
		if _, err := s.Append(ctx, "bench", eventstore.AnyVersion, benchEvent, benchEvent); err != nil {
			b.Fatal(err)
		}
	}
	after := s.head - 2 // a commit of two events to read
	for _, read := range []struct {
		name string
		fn   func(context.Context, int64, int) ([]eventstore.Event, error)
	}{{"tail", s.ReadAll}, {"sqlite", s.readAll}} {
		b.Run(read.name, func(b *testing.B) {
			for b.Loop() {
				if evs, err := read.fn(ctx, after, 256); err != nil || len(evs) != 2 {
					b.Fatal(evs, err)
				}
			}
		})
	}
}
