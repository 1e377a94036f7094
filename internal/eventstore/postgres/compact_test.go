package postgres

import (
	"testing"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/storetest"
	"github.com/corral-dev/corral/internal/testenv"
)

func TestCompactConformance(t *testing.T) {
	testenv.PostgresDSN(t) // skip (or fail) once, not in each case
	storetest.RunCompact(t, func(t *testing.T) storetest.CompactStore { return mustOpen(t, mustDB(t)) })
}

// Another server, or this one restarted, goes on after the marker: the
// head is event_head's, which the removal does not take back.
func TestCompactReopen(t *testing.T) {
	db := mustDB(t)
	s := mustOpen(t, db)
	storetest.MustAppend(t, s, "s", 0, eventstore.Proposed{Type: "keep", SchemaVersion: 1}, eventstore.Proposed{Type: "drop", SchemaVersion: 1})
	marker, _, err := s.Compact(t.Context(), "s", 2, []string{"drop"}, eventstore.Proposed{Type: "marker", SchemaVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	other := mustOpen(t, db)
	next := storetest.MustAppend(t, other, "s", marker.StreamVersion, eventstore.Proposed{Type: "t", SchemaVersion: 1})
	if next[0].Position != marker.Position+1 || next[0].StreamVersion != marker.StreamVersion+1 {
		t.Errorf("append on another store: position %d version %d, want %d and %d", next[0].Position, next[0].StreamVersion, marker.Position+1, marker.StreamVersion+1)
	}
}
