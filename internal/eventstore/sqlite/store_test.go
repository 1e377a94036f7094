package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/storetest"
	"github.com/corral-dev/corral/internal/lockfile"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		os.Exit(crashChild())
	}
	goleak.VerifyTestMain(m)
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// MustOpen opens a store on path and closes it when the test ends.
func MustOpen(tb testing.TB, path string) *Store {
	tb.Helper()
	s, err := Open(context.Background(), path, discardLogger())
	if err != nil {
		tb.Fatalf("Open(%s): %v", path, err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return s
}

// MustOpenTemp opens a store on a new file in a temporary directory.
func MustOpenTemp(tb testing.TB) *Store {
	tb.Helper()
	return MustOpen(tb, filepath.Join(tb.TempDir(), "corral.db"))
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) eventstore.Store { return MustOpenTemp(t) })
}

func TestLockExcludesSecondOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db")
	s, err := Open(context.Background(), path, discardLogger())
	if err != nil {
		t.Fatalf("first Open: %v", err)
	}
	s2, err := Open(context.Background(), path, discardLogger())
	if err == nil {
		s2.Close()
		s.Close()
		t.Fatalf("second Open of %s succeeded while the first is open", path)
	}
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("second Open error = %v, want class ErrFailedPrecondition", err)
	}
	if !strings.Contains(err.Error(), "data root is in use") {
		t.Errorf("second Open error = %q, want it to say the data root is in use", err)
	}
	// The failed Open must not have harmed the first store.
	storetest.MustAppend(t, s, "a", 0, eventstore.Proposed{Type: "t", SchemaVersion: 1})

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s3 := MustOpen(t, path)
	if got := storetest.MustReadAll(t, s3, 0); len(got) != 1 {
		t.Errorf("reopened store has %d events, want 1", len(got))
	}
}

func TestReopenKeepsEventsAndHead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db")
	s, err := Open(context.Background(), path, discardLogger())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	want := storetest.MustAppend(t, s, "a", 0,
		eventstore.Proposed{Type: "t", SchemaVersion: 1, Data: []byte(`{"x":1}`)},
		eventstore.Proposed{Type: "t", SchemaVersion: 2})
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	s = MustOpen(t, path)
	got := storetest.MustReadAll(t, s, 0)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events after reopen (-want +got):\n%s", diff)
	}
	// WaitFor knows the head without any new commit.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.WaitFor(ctx, 1); err != nil {
		t.Errorf("WaitFor(1) after reopen with 2 events = %v, want nil", err)
	}
	next := storetest.MustAppend(t, s, "b", 0, eventstore.Proposed{Type: "t", SchemaVersion: 1})
	if next[0].Position != 3 {
		t.Errorf("first append after reopen at position %d, want 3", next[0].Position)
	}
	var version int
	if err := s.rdb.QueryRow("SELECT MAX(version) FROM schema_version").Scan(&version); err != nil {
		t.Fatalf("read schema version: %v", err)
	}
	ms, err := loadMigrations()
	if err != nil {
		t.Fatal(err)
	}
	if version != len(ms) {
		t.Errorf("schema version = %d, want %d", version, len(ms))
	}
}

func TestClosed(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "corral.db"), discardLogger())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- s.WaitFor(context.Background(), 0) }()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-waited; !errors.Is(err, ErrClosed) {
		t.Errorf("WaitFor across Close = %v, want ErrClosed", err)
	}
	_, err = s.Append(context.Background(), "a", 0, eventstore.Proposed{Type: "t"})
	if !errors.Is(err, ErrClosed) || !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Append after Close = %v, want ErrClosed (ErrFailedPrecondition)", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
}

func TestDBIsReadOnly(t *testing.T) {
	s := MustOpenTemp(t)
	if _, err := s.rdb.Exec("INSERT INTO events (event_id, stream_id, stream_version, type, schema_version, recorded_at) VALUES ('x','s',1,'t',1,'now')"); err == nil {
		t.Errorf("write through DB() succeeded, want it refused")
	}
}

func TestAppendValidation(t *testing.T) {
	s := MustOpenTemp(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		stream   string
		expected int64
		events   []eventstore.Proposed
	}{
		{"empty stream", "", 0, []eventstore.Proposed{{Type: "t"}}},
		{"bad expected", "s", -2, []eventstore.Proposed{{Type: "t"}}},
		{"no type", "s", 0, []eventstore.Proposed{{}}},
		{"bad json", "s", 0, []eventstore.Proposed{{Type: "t", Data: []byte("{")}}},
	} {
		if _, err := s.Append(ctx, tc.stream, tc.expected, tc.events...); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: Append error = %v, want ErrInvalidArgument", tc.name, err)
		}
	}
	if _, err := s.ReadAll(ctx, 0, 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("ReadAll(limit 0) error = %v, want ErrInvalidArgument", err)
	}
}

// TestBatchFailsRequestsAlone drives one batch through the writer directly,
// so the requests are known to share a transaction.
func TestBatchFailsRequestsAlone(t *testing.T) {
	s := MustOpenTemp(t)
	storetest.MustAppend(t, s, "dup", 0, eventstore.Proposed{ID: "evt_taken", Type: "t", SchemaVersion: 1})

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	bg := context.Background()
	req := func(ctx context.Context, stream string, expected int64, evs ...eventstore.Proposed) *appendReq {
		return &appendReq{ctx: ctx, stream: stream, expected: expected, events: evs, res: make(chan appendRes, 1)}
	}
	p := func(id string) eventstore.Proposed { return eventstore.Proposed{ID: id, Type: "t", SchemaVersion: 1} }
	batch := []*appendReq{
		req(bg, "s", 0, p("a1"), p("a2")),        // ok: s at 2
		req(bg, "s", 0, p("b")),                  // conflict: s is at 2 now
		req(bg, "s", 2, p("c")),                  // ok: sees the first request
		req(bg, "t", 0, p("d1"), p("evt_taken")), // duplicate id: fails whole
		req(cancelled, "u", 0, p("e")),           // caller gone
		req(bg, "t", 0, p("f")),                  // ok: the failed request left t at 0
	}
	// The writer goroutine is idle (no Append in flight), so calling its
	// method here does not race with it.
	s.commitBatch(batch)

	wantErr := []error{nil, eventstore.ErrVersionConflict, nil, errdefs.ErrAlreadyExists, context.Canceled, nil}
	var ids []string
	for i, r := range batch {
		res := <-r.res
		if !errors.Is(res.err, wantErr[i]) { // errors.Is(err, nil) is err == nil
			t.Errorf("request %d: error = %v, want %v", i, res.err, wantErr[i])
		}
		for _, e := range res.events {
			ids = append(ids, e.ID)
		}
	}
	if diff := cmp.Diff([]string{"a1", "a2", "c", "f"}, ids); diff != "" {
		t.Errorf("appended ids (-want +got):\n%s", diff)
	}
	all := storetest.MustReadAll(t, s, 0)
	var stored []string
	var pos []int64
	for _, e := range all {
		stored = append(stored, e.ID)
		pos = append(pos, e.Position)
	}
	if diff := cmp.Diff([]string{"evt_taken", "a1", "a2", "c", "f"}, stored); diff != "" {
		t.Errorf("stored ids (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{1, 2, 3, 4, 5}, pos); diff != "" {
		t.Errorf("positions (-want +got):\n%s", diff)
	}
	// The store's head moved with the batch.
	ctx, cancelWait := context.WithCancel(context.Background())
	cancelWait()
	if err := s.WaitFor(ctx, 4); err != nil {
		t.Errorf("WaitFor(4) after the batch = %v, want nil", err)
	}
}

func TestDuplicateEventID(t *testing.T) {
	s := MustOpenTemp(t)
	storetest.MustAppend(t, s, "a", 0, eventstore.Proposed{ID: "evt_1", Type: "t", SchemaVersion: 1})
	_, err := s.Append(context.Background(), "b", 0, eventstore.Proposed{ID: "evt_1", Type: "t", SchemaVersion: 1})
	if !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Append with a used event id = %v, want ErrAlreadyExists", err)
	}
}

func TestFileIsOwnerOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db")
	s := MustOpen(t, path)
	storetest.MustAppend(t, s, "a", 0, eventstore.Proposed{Type: "t", SchemaVersion: 1})
	for _, p := range []string{path, path + "-wal", path + ".lock"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatalf("stat: %v", err)
		}
		if perm := fi.Mode().Perm(); perm&0o077 != 0 {
			t.Errorf("%s has mode %v, want no group or other access", filepath.Base(p), perm)
		}
	}
}

func TestRefusesNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db")
	s, err := Open(context.Background(), path, discardLogger())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatalf("open raw: %v", err)
	}
	_, err = db.Exec("INSERT INTO schema_version (version, name, applied_at) VALUES (99, '0099_future.sql', 'x')")
	if cerr := db.Close(); err != nil || cerr != nil {
		t.Fatalf("insert future version: %v, %v", err, cerr)
	}
	s, err = Open(context.Background(), path, discardLogger())
	if err == nil {
		s.Close()
		t.Fatalf("Open of a database with schema version 99 succeeded")
	}
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Open error = %v, want class ErrFailedPrecondition", err)
	}
	// The failed Open released its lock.
	l, err := lockfile.Acquire(path + ".lock")
	if err != nil {
		t.Fatalf("lock after a failed Open: %v", err)
	}
	if err := l.Release(); err != nil {
		t.Errorf("release: %v", err)
	}
}

// A store from before the document index moved out (schema version 1,
// with the index's tables in it) loses those tables at the next Open.
func TestMigrationDropsTheOldDocumentIndex(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db")
	s, err := Open(context.Background(), path, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE docindex_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT`,
		`CREATE VIRTUAL TABLE docindex_fts USING fts5(title, body)`,
		`DROP TABLE checkpoints`, // of a later version
		`DELETE FROM schema_version WHERE version >= 2`,
	} {
		if _, err := s.wdb.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	if s, err = Open(context.Background(), path, discardLogger()); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var n int
	if err := s.rdb.QueryRow(`SELECT count(*) FROM sqlite_master WHERE name LIKE 'docindex%'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d docindex tables left (%v), want none", n, err)
	}
}
