package sqlite

import (
	"path/filepath"
	"testing"

	"github.com/corral-dev/corral/internal/eventstore/storetest"
)

func TestCheckpoints(t *testing.T) {
	storetest.RunCheckpoints(t, func(t *testing.T) storetest.CheckpointStore { return MustOpenTemp(t) })
}

// TestCheckpointSurvivesReopen: a checkpoint is in the database file, as
// the events are.
func TestCheckpointSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db")
	s := MustOpen(t, path)
	storetest.MustSaveCheckpoint(t, s, "p", 4, []byte("state"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = MustOpen(t, path)
	pos, data, ok, err := s.LoadCheckpoint(t.Context(), "p")
	if err != nil || !ok || pos != 4 || string(data) != "state" {
		t.Fatalf("after reopening, LoadCheckpoint = %d, %q, ok %v, %v; want 4, state", pos, data, ok, err)
	}
}
