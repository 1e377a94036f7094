package sqlite

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/storetest"
)

func TestCompactConformance(t *testing.T) {
	storetest.RunCompact(t, func(t *testing.T) storetest.CompactStore { return MustOpenTemp(t) })
}

// A reopened store goes on after the marker: it reads its head from the
// events it holds, and the marker is the last of them, whatever the
// compaction removed at the end of the log.
func TestCompactReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db")
	s, err := Open(context.Background(), path, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	storetest.MustAppend(t, s, "s", 0, eventstore.Proposed{Type: "keep", SchemaVersion: 1}, eventstore.Proposed{Type: "drop", SchemaVersion: 1})
	marker, _, err := s.Compact(context.Background(), "s", 2, []string{"drop"}, eventstore.Proposed{Type: "marker", SchemaVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	want := storetest.MustReadAll(t, s, 0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = MustOpen(t, path)
	if diff := cmp.Diff(want, storetest.MustReadAll(t, s, 0)); diff != "" {
		t.Errorf("events after reopen (-want +got):\n%s", diff)
	}
	next := storetest.MustAppend(t, s, "s", marker.StreamVersion, eventstore.Proposed{Type: "t", SchemaVersion: 1})
	if next[0].Position != marker.Position+1 || next[0].StreamVersion != marker.StreamVersion+1 {
		t.Errorf("append after reopen: position %d version %d, want %d and %d", next[0].Position, next[0].StreamVersion, marker.Position+1, marker.StreamVersion+1)
	}
}
