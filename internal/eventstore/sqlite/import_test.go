package sqlite_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
	"github.com/corral-dev/corral/internal/eventstore/storetest"
)

func TestImportConformance(t *testing.T) {
	storetest.RunImport(t, func(t *testing.T) eventstore.Importer { return sqlitetest.Open(t) })
}

// SQLite keeps what PostgreSQL cannot: nanoseconds, NUL bytes, bytes that
// are not UTF-8. Only a year its fixed-width time text cannot write is
// refused.
func TestImportKeepsWhatSQLiteHolds(t *testing.T) {
	s := sqlitetest.Open(t)
	e := eventstore.Event{
		ID: "evt_\x00odd", StreamID: "task/\xff", StreamVersion: 1, Type: "t.odd", SchemaVersion: 1,
		Data: json.RawMessage("\"\xfe\""), Actor: "a\x00b",
		RecordedAt: time.Date(2025, 1, 2, 3, 4, 5, 123456789, time.FixedZone("x", 3600)), Position: 1,
	}
	if err := s.Import(context.Background(), []eventstore.Event{e}); err != nil {
		t.Fatal(err)
	}
	got := storetest.MustReadAll(t, s, 0)
	want := e
	want.RecordedAt = e.RecordedAt.UTC()
	if diff := cmp.Diff([]eventstore.Event{want}, got); diff != "" {
		t.Errorf("read back (-want +got):\n%s", diff)
	}
	if got[0].RecordedAt.Nanosecond() != 123456789 {
		t.Errorf("nanoseconds: %d", got[0].RecordedAt.Nanosecond())
	}
	far := e
	far.RecordedAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := s.Fit(far); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Fit of the year 10000: %v, want invalid argument", err)
	}
}
