package report

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/corral-dev/corral/internal/eventstore/sqlite"
)

// A server shutting down while Run reads the log it has not caught up
// with is not an error (TestBearerToken's server ended with "read events
// to report: context canceled").
func TestRunEndsQuietlyWhenCancelled(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	store, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "events.db"), log)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Run(ctx, store, log); err != nil {
		t.Errorf("Run with its context cancelled: %v, want nil", err)
	}
}
