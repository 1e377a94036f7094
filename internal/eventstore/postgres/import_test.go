package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/postgres"
	"github.com/corral-dev/corral/internal/eventstore/postgres/postgrestest"
	"github.com/corral-dev/corral/internal/eventstore/storetest"
	"github.com/corral-dev/corral/internal/testenv"
)

// openImporter opens a store on a database of tb's own.
func openImporter(tb testing.TB) *postgres.Store {
	tb.Helper()
	s, err := postgres.Open(context.Background(), postgrestest.New(tb).DSN, slog.New(slog.DiscardHandler))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

func TestImportConformance(t *testing.T) {
	testenv.PostgresDSN(t)
	storetest.RunImport(t, func(t *testing.T) eventstore.Importer { return openImporter(t) })
}

// What PostgreSQL cannot keep: Fit truncates recorded_at to the
// microsecond, and refuses NUL bytes and invalid UTF-8 in any text with
// the event's position; the JSON escape \u0000 and a lone surrogate's
// escape are text, and kept as written.
func TestImportFit(t *testing.T) {
	s := openImporter(t)
	base := eventstore.Event{
		ID: "evt_1", StreamID: "task/1", StreamVersion: 1, Type: "t.x", SchemaVersion: 1,
		RecordedAt: time.Date(2025, 1, 2, 3, 4, 5, 123456789, time.FixedZone("x", 3600)), Position: 7,
	}
	for _, tc := range []struct {
		name  string
		edit  func(e *eventstore.Event)
		field string // "" when Fit takes it
	}{
		{"NUL in actor", func(e *eventstore.Event) { e.Actor = "a\x00b" }, "actor holds a NUL byte"},
		{"NUL in id", func(e *eventstore.Event) { e.ID = "evt\x00" }, "id holds a NUL byte"},
		{"invalid UTF-8 in data", func(e *eventstore.Event) { e.Data = json.RawMessage("\"\xff\"") }, "data is not valid UTF-8"},
		{"invalid UTF-8 in stream", func(e *eventstore.Event) { e.StreamID = "task/\xc3" }, "stream id is not valid UTF-8"},
		{"invalid UTF-8 in causation", func(e *eventstore.Event) { e.CausationID = "\xed\xa0\x80" }, "causation id is not valid UTF-8"},
		{"escaped NUL", func(e *eventstore.Event) { e.Data = json.RawMessage(`{"a":"\u0000"}`) }, ""},
		{"escaped lone surrogate", func(e *eventstore.Event) { e.Data = json.RawMessage(`["\ud800"]`) }, ""},
	} {
		e := base
		tc.edit(&e)
		_, err := s.Fit(e)
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: Fit: %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "position 7") || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: Fit: %v; want invalid argument naming position 7 and %q", tc.name, err, tc.field)
		}
	}
	f, err := s.Fit(base)
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2025, 1, 2, 2, 4, 5, 123456000, time.UTC); !f.RecordedAt.Equal(want) || f.RecordedAt.Location() != time.UTC {
		t.Errorf("Fit's recorded_at: %v, want %v", f.RecordedAt, want)
	}

	// What Fit takes, PostgreSQL keeps as Fit says.
	odd := base
	odd.Position = 1
	odd.Data = json.RawMessage(`{"a": "\u0000", "b":["\ud800"],  "c": "✓"}`)
	if err := s.Import(context.Background(), []eventstore.Event{odd}); err != nil {
		t.Fatal(err)
	}
	want, _ := s.Fit(odd)
	if diff := cmp.Diff([]eventstore.Event{want}, storetest.MustReadAll(t, s, 0)); diff != "" {
		t.Errorf("read back (-want +got):\n%s", diff)
	}
}

// A COPY that PostgreSQL refuses part-way names the event it stopped at:
// here an id taken by an event of the same batch, which the checks before
// the COPY do not look for.
func TestImportNamesTheEventCOPYStoppedAt(t *testing.T) {
	s := openImporter(t)
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	var batch []eventstore.Event
	for i := int64(1); i <= 5; i++ {
		batch = append(batch, eventstore.Event{ID: "evt_" + string(rune('a'+i)), StreamID: "s", StreamVersion: i,
			Type: "t", RecordedAt: at, Position: i})
	}
	batch[3].ID = batch[1].ID
	err := s.Import(context.Background(), batch)
	if !errors.Is(err, errdefs.ErrAlreadyExists) || !strings.Contains(err.Error(), "position 4") {
		t.Errorf("Import: %v; want already exists, naming position 4", err)
	}
	if h, err := s.Head(context.Background()); err != nil || h != 0 {
		t.Errorf("Head after a refused COPY: %d, %v; want 0", h, err)
	}
}
