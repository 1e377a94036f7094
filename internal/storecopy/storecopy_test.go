package storecopy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/postgres"
	"github.com/corral-dev/corral/internal/eventstore/postgres/postgrestest"
	"github.com/corral-dev/corral/internal/eventstore/sqlite"
	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
	"github.com/corral-dev/corral/internal/eventstore/storetest"
	"github.com/corral-dev/corral/internal/storecopy"
)

// odd are data that a copy must keep byte for byte: text in many
// scripts, JSON's escapes for NUL and for half a surrogate pair (which
// PostgreSQL's json keeps as text, its jsonb would refuse), white space
// and key order as written, numbers as written, no data at all.
var odd = []string{
	`{"prompt":"héllo wörld ✓ 日本語 🚀 \u00e9"}`,
	`{"s":"nul \u0000 inside"}`,
	`["\ud800", "\udfff\ud800"]`,
	`{ "b" : [ 1 , 2.50 , 1e400 ] ,  "a":null }`,
	`"just a string"`,
	`null`,
	``,
}

// fill appends a log to s: several streams, a cause on some events,
// caller-chosen ids, odd data, a large event, and n events more spread
// over seven streams, so that a copy takes several batches.
func fill(t *testing.T, s eventstore.Store, n int) {
	t.Helper()
	ctx := eventstore.WithCause(context.Background(), eventstore.Cause{CorrelationID: "corr_ü", CausationID: "request/r1"})
	var ps []eventstore.Proposed
	for i, d := range odd {
		ps = append(ps, eventstore.Proposed{Type: "t.odd", SchemaVersion: i, Data: json.RawMessage(d), Actor: "ällice"})
	}
	storetest.MustAppend(t, s, "task/odd", 0, ps...)
	storetest.MustAppend(t, s, "task/chosen", 0,
		eventstore.Proposed{ID: "evt_chosen_1", Type: "t.chosen", SchemaVersion: 1, Data: json.RawMessage(`{}`)},
		eventstore.Proposed{ID: "evt_chosen_2", Type: "t.chosen", SchemaVersion: 1, CorrelationID: "corr_own", CausationID: "evt_chosen_1"})
	if _, err := s.Append(ctx, "session/s1", 0,
		eventstore.Proposed{Type: "t.caused", SchemaVersion: 1, Data: json.RawMessage(`{"n":1}`)},
		eventstore.Proposed{Type: "t.caused", SchemaVersion: 1, Data: json.RawMessage(`{"n":2}`)}); err != nil {
		t.Fatal(err)
	}
	large, _ := json.Marshal(map[string]string{"output": strings.Repeat("é0123456789", 100_000)}) // 1.2 MB
	storetest.MustAppend(t, s, "task/large", 0, eventstore.Proposed{Type: "t.large", SchemaVersion: 1, Data: large})
	for i := range n {
		stream := fmt.Sprintf("task/%d", i%7)
		storetest.MustAppend(t, s, stream, eventstore.AnyVersion,
			eventstore.Proposed{Type: "t.step", SchemaVersion: 1, Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
	}
}

// rawEqual compares data as bytes: cmp's walk through a megabyte, byte by
// byte, takes seconds.
var rawEqual = cmp.Comparer(func(a, b json.RawMessage) bool { return bytes.Equal(a, b) })

// openPostgres opens a store on an empty database of t's own.
func openPostgres(t *testing.T) (*postgres.Store, string) {
	t.Helper()
	dsn := postgrestest.New(t).DSN
	s, err := postgres.Open(context.Background(), dsn, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dsn
}

// keptBy is evs as dst keeps them (Fit), for comparing a copy with its
// source independently of Copy's own verification.
func keptBy(t *testing.T, dst eventstore.Importer, evs []eventstore.Event) []eventstore.Event {
	t.Helper()
	var out []eventstore.Event
	for _, e := range evs {
		f, err := dst.Fit(e)
		if err != nil {
			t.Fatalf("Fit(%d): %v", e.Position, err)
		}
		out = append(out, f)
	}
	return out
}

func mustCopy(t *testing.T, src eventstore.Store, dst eventstore.Importer, opts storecopy.Options) storecopy.Report {
	t.Helper()
	r, err := storecopy.Copy(context.Background(), src, dst, opts)
	if err != nil {
		t.Fatalf("Copy: %v", err)
	}
	return r
}

// SQLite to PostgreSQL and back: every event arrives as it was, but for
// the nanoseconds of recorded_at, which PostgreSQL does not keep (and the
// report counts); the source is left as it was; both copies have the
// same checksum.
func TestCopyThereAndBack(t *testing.T) {
	first := sqlitetest.Open(t)
	fill(t, first, 300)
	before := storetest.MustReadAll(t, first, 0)
	pg, _ := openPostgres(t)

	r := mustCopy(t, first, pg, storecopy.Options{Batch: 97})
	total := int64(len(before))
	if r.Events != total || r.Copied != total || r.Resumed != 0 || r.Streams != 11 || r.Checksum == "" {
		t.Errorf("report: %+v; want %d events copied in 11 streams", r, total)
	}
	var truncated int64
	for _, e := range before {
		if e.RecordedAt.Nanosecond()%1000 != 0 {
			truncated++
		}
	}
	if r.Truncated != truncated || truncated == 0 {
		t.Errorf("report: %d times truncated, want %d (of %d)", r.Truncated, truncated, total)
	}
	want := make([]eventstore.Event, len(before))
	for i, e := range before {
		e.RecordedAt = e.RecordedAt.Truncate(time.Microsecond)
		want[i] = e
	}
	if diff := cmp.Diff(want, storetest.MustReadAll(t, pg, 0), rawEqual); diff != "" {
		t.Fatalf("PostgreSQL's copy (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, storetest.MustReadAll(t, first, 0), rawEqual); diff != "" {
		t.Errorf("the source changed (-before +after):\n%s", diff)
	}

	back := sqlitetest.Open(t)
	r2 := mustCopy(t, pg, back, storecopy.Options{})
	if r2.Truncated != 0 || r2.Events != total || r2.Checksum != r.Checksum {
		t.Errorf("report back: %+v; want no truncation, %d events and checksum %s", r2, total, r.Checksum)
	}
	if diff := cmp.Diff(want, storetest.MustReadAll(t, back, 0), rawEqual); diff != "" {
		t.Errorf("SQLite's copy of the copy (-want +got):\n%s", diff)
	}
	// The copy is a log a server goes on with: appends follow it.
	got := storetest.MustAppend(t, back, "task/1", eventstore.AnyVersion, eventstore.Proposed{Type: "t.after", SchemaVersion: 1})
	if got[0].Position != total+1 {
		t.Errorf("append after the copy: position %d, want %d", got[0].Position, total+1)
	}
}

// A copy interrupted between two batches goes on from the target's head
// when run again, after checking that what the target holds is the
// source's start event for event; run once more, it copies nothing.
func TestCopyResumes(t *testing.T) {
	src := sqlitetest.Open(t)
	fill(t, src, 200)
	dst, _ := openPostgres(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := storecopy.Copy(ctx, src, dst, storecopy.Options{Batch: 50, Progress: func(done, total int64) {
		if done >= 100 {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "the copy stopped with the log up to position 100 of ") {
		t.Fatalf("interrupted Copy: %v, want context.Canceled, saying where it stopped", err)
	}
	head, err := dst.Head(context.Background())
	if err != nil || head != 100 {
		t.Fatalf("target's head after the interruption: %d, %v; want 100", head, err)
	}
	r := mustCopy(t, src, dst, storecopy.Options{Batch: 50})
	total := int64(len(storetest.MustReadAll(t, src, 0)))
	if r.Resumed != 100 || r.Copied != total-100 || r.Events != total {
		t.Errorf("resumed copy: %+v; want 100 resumed and %d copied", r, total-100)
	}
	again := mustCopy(t, src, dst, storecopy.Options{})
	if again.Resumed != total || again.Copied != 0 || again.Checksum != r.Checksum {
		t.Errorf("a copy of a copied log: %+v; want everything resumed, nothing copied, checksum %s", again, r.Checksum)
	}
}

// A log with the gaps retention's compactions leave (removed events'
// positions and stream versions, at the end of the log too, before the
// marker) is copied with them, also when a copy interrupted at a gap's
// edge goes on: the target reads as the source does, and appends go on
// after the source's head.
func TestCopyKeepsCompactionGaps(t *testing.T) {
	src := sqlitetest.Open(t)
	fill(t, src, 60)
	for i := range 7 {
		stream := fmt.Sprintf("task/%d", i)
		evs := storetest.MustReadAll(t, src, 0)
		var v int64
		for _, e := range evs {
			if e.StreamID == stream {
				v = e.StreamVersion
			}
		}
		if i%2 == 0 {
			storetest.MustAppend(t, src, stream, v, eventstore.Proposed{Type: "t.late", SchemaVersion: 1})
			v++
		}
		if _, _, err := src.Compact(context.Background(), stream, v, []string{"t.step", "t.late"},
			eventstore.Proposed{Type: "t.compacted", SchemaVersion: 1, Data: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	before := storetest.MustReadAll(t, src, 0)
	head := before[len(before)-1].Position
	if int64(len(before)) >= head {
		t.Fatalf("the source has %d events up to position %d: no gaps", len(before), head)
	}
	gap := 0 // the index of the first event past a gap
	for before[gap].Position == int64(gap+1) {
		gap++
	}
	dst, _ := openPostgres(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stoppedAt int64
	_, err := storecopy.Copy(ctx, src, dst, storecopy.Options{Batch: 5, Progress: func(done, total int64) {
		if stoppedAt = done; done > before[gap].Position {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted Copy: %v, want context.Canceled", err)
	}
	left := 0
	for _, e := range before {
		if e.Position > stoppedAt {
			left++
		}
	}
	r := mustCopy(t, src, dst, storecopy.Options{Batch: 3})
	if r.Events != int64(len(before)) || r.Head != head || r.Resumed != stoppedAt || r.Copied != int64(left) {
		t.Errorf("report: %+v; want %d events up to position %d, resumed at %d, %d copied", r, len(before), head, stoppedAt, left)
	}
	want := keptBy(t, dst, before)
	if diff := cmp.Diff(want, storetest.MustReadAll(t, dst, 0), rawEqual); diff != "" {
		t.Fatalf("PostgreSQL's copy (-want +got):\n%s", diff)
	}
	back := sqlitetest.Open(t)
	if r2 := mustCopy(t, dst, back, storecopy.Options{Batch: 4}); r2.Checksum != r.Checksum {
		t.Errorf("the copy back: checksum %s, want %s", r2.Checksum, r.Checksum)
	}
	if diff := cmp.Diff(want, storetest.MustReadAll(t, back, 0), rawEqual); diff != "" {
		t.Errorf("SQLite's copy of the copy (-want +got):\n%s", diff)
	}
	got := storetest.MustAppend(t, back, "task/1", eventstore.AnyVersion, eventstore.Proposed{Type: "t.after", SchemaVersion: 1})
	if got[0].Position != head+1 {
		t.Errorf("append after the copy: position %d, want %d", got[0].Position, head+1)
	}
}

// A target holding anything but the start of the source's log is refused
// and left as it was: another log; the source's start with one field of
// one event changed (which names the field and the position); more events
// than the source has.
func TestCopyRefusesAnotherLog(t *testing.T) {
	src := sqlitetest.Open(t)
	fill(t, src, 20)
	evs := storetest.MustReadAll(t, src, 0)

	other, _ := openPostgres(t)
	storetest.MustAppend(t, other, "task/mine", 0, eventstore.Proposed{Type: "t.mine", SchemaVersion: 1})

	changed := sqlitetest.Open(t)
	start := append([]eventstore.Event(nil), evs[:12]...)
	start[9].CausationID += "x"
	if err := changed.Import(context.Background(), start); err != nil {
		t.Fatal(err)
	}

	longer := sqlitetest.Open(t)
	mustCopy(t, src, longer, storecopy.Options{})
	storetest.MustAppend(t, longer, "task/more", 0, eventstore.Proposed{Type: "t.more", SchemaVersion: 1})

	for _, tc := range []struct {
		name string
		dst  eventstore.Importer
		says []string
	}{
		{"another log", other, []string{"not empty (it holds a log up to position 1)", "copy into an empty store", "position 1 differs"}},
		{"one field changed", changed, []string{"position 10 differs", `causation id "` + evs[9].CausationID + `" in the source`}},
		{"longer", longer, []string{fmt.Sprintf("goes to position %d and the source's only to %d", len(evs)+1, len(evs))}},
	} {
		before := storetest.MustReadAll(t, tc.dst, 0)
		_, err := storecopy.Copy(context.Background(), src, tc.dst, storecopy.Options{})
		if !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%s: Copy: %v, want failed precondition", tc.name, err)
			continue
		}
		for _, s := range tc.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: Copy: %q does not say %q", tc.name, err, s)
			}
		}
		if diff := cmp.Diff(before, storetest.MustReadAll(t, tc.dst, 0), rawEqual); diff != "" {
			t.Errorf("%s: the target changed (-before +after):\n%s", tc.name, diff)
		}
	}
}

// SQLite holds text PostgreSQL refuses: invalid UTF-8 (which json.Valid,
// Append's check, lets through inside a JSON string) and NUL bytes. A copy
// of such a log into PostgreSQL is refused before it writes anything,
// naming the event.
func TestCopyRefusesWhatPostgresCannotHold(t *testing.T) {
	for _, bad := range []eventstore.Proposed{
		{Type: "t.bad", SchemaVersion: 1, Data: json.RawMessage("{\"s\":\"\xff\xfe\"}")},
		{Type: "t.bad", SchemaVersion: 1, Data: json.RawMessage(`{}`), Actor: "nul\x00actor"},
	} {
		src := sqlitetest.Open(t)
		fill(t, src, 5)
		storetest.MustAppend(t, src, "task/bad", 0, bad)
		storetest.MustAppend(t, src, "task/after", 0, eventstore.Proposed{Type: "t.after", SchemaVersion: 1})
		pos := int64(len(storetest.MustReadAll(t, src, 0))) - 1
		dst, _ := openPostgres(t)
		_, err := storecopy.Copy(context.Background(), src, dst, storecopy.Options{Batch: 2})
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), fmt.Sprintf("event at position %d", pos)) ||
			!strings.Contains(err.Error(), "nothing was copied") {
			t.Errorf("Copy: %v; want failed precondition naming position %d", err, pos)
		}
		if h, err := dst.Head(context.Background()); err != nil || h != 0 {
			t.Errorf("target's head after the refusal: %d, %v; want 0", h, err)
		}
	}
}

// Run opens the stores by their places, there and back, and refuses to
// copy a data root a server holds, in either direction, naming the reason
// and leaving the other store untouched.
func TestRun(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	db := filepath.Join(root, "corral.db")
	s, err := sqlite.Open(ctx, db, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	fill(t, s, 30)
	want := storetest.MustReadAll(t, s, 0)
	dsn := postgrestest.New(t).DSN

	// s is open, as a running server has it.
	_, err = storecopy.Run(ctx, storecopy.SQLite, storecopy.Stores{SQLite: db, Postgres: dsn}, storecopy.Options{})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "a Corral server is running on the data root "+root) {
		t.Errorf("Run with the source's data root held: %v", err)
	}
	if rep, err := postgres.Inspect(ctx, dsn); err != nil || rep.Schema != 0 {
		t.Errorf("the target after a refusal at the source: schema %d, %v; want it untouched", rep.Schema, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	r, err := storecopy.Run(ctx, storecopy.SQLite, storecopy.Stores{SQLite: db, Postgres: dsn}, storecopy.Options{})
	if err != nil {
		t.Fatalf("Run to PostgreSQL: %v", err)
	}
	if r.From != "SQLite "+db || !strings.HasPrefix(r.To, "PostgreSQL database ") || r.Events != int64(len(want)) {
		t.Errorf("report: %+v", r)
	}

	// The target's data root held by a server, then the database used by
	// one: refused, the other store left as it was.
	back := filepath.Join(t.TempDir(), "new-root", "corral.db")
	if err := os.Mkdir(filepath.Dir(back), 0o755); err != nil {
		t.Fatal(err)
	}
	server, err := sqlite.Open(ctx, back, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = storecopy.Run(ctx, storecopy.Postgres, storecopy.Stores{SQLite: back, Postgres: dsn}, storecopy.Options{})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "a Corral server is running on the data root "+filepath.Dir(back)) {
		t.Errorf("Run with the target's data root held: %v", err)
	}
	if h, err := server.Head(ctx); err != nil || h != 0 {
		t.Errorf("the target after the refusal: head %d, %v", h, err)
	}
	server.Close()
	replica, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := replica.Join(ctx, cluster.Replica{ID: "replica-test", Host: "host-a"}); err != nil {
		t.Fatal(err)
	}
	_, err = storecopy.Run(ctx, storecopy.Postgres, storecopy.Stores{SQLite: back, Postgres: dsn}, storecopy.Options{})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "replica-test on host-a") {
		t.Errorf("Run with a server on the database: %v", err)
	}
	replica.Close() // ends its lease

	r2, err := storecopy.Run(ctx, storecopy.Postgres, storecopy.Stores{SQLite: back, Postgres: dsn}, storecopy.Options{})
	if err != nil {
		t.Fatalf("Run back to SQLite: %v", err)
	}
	if r2.Checksum != r.Checksum || r2.To != "SQLite "+back {
		t.Errorf("report back: %+v; want checksum %s", r2, r.Checksum)
	}
	got, err := sqlite.Open(ctx, back, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	for i := range want {
		want[i].RecordedAt = want[i].RecordedAt.Truncate(time.Microsecond)
	}
	if diff := cmp.Diff(want, storetest.MustReadAll(t, got, 0), rawEqual); diff != "" {
		t.Errorf("the log after SQLite, PostgreSQL, SQLite (-want +got):\n%s", diff)
	}
}
