// Package sqlitetest opens real SQLite event stores for tests.
package sqlitetest

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/corral-dev/corral/internal/eventstore/sqlite"
)

// Open opens an event store in a fresh temporary directory, closed when
// the test ends.
func Open(tb testing.TB) *sqlite.Store {
	tb.Helper()
	s, err := sqlite.Open(context.Background(), filepath.Join(tb.TempDir(), "events.db"), slog.New(slog.DiscardHandler))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}
