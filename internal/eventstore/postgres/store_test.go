package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/postgres/postgrestest"
	"github.com/corral-dev/corral/internal/eventstore/storetest"
	"github.com/corral-dev/corral/internal/testenv"
)

// waitLimit bounds every wait here so that a broken store fails instead
// of hanging the test binary.
const waitLimit = 10 * time.Second

// testDB is a database of a test's own.
type testDB struct {
	name  string
	dsn   string // the test's database, as the admin
	admin string // the admin's, on its own database
}

// mustDB makes a database of tb's own (postgrestest.New).
func mustDB(tb testing.TB) testDB {
	tb.Helper()
	d := postgrestest.New(tb)
	return testDB{name: d.Name, dsn: d.DSN, admin: d.Admin}
}

// connect opens a plain connection to db, closed when tb ends.
func (db testDB) connect(tb testing.TB) *pgx.Conn {
	tb.Helper()
	conn, err := pgx.Connect(context.Background(), db.dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// mustOpen opens a store on db and closes it when tb ends.
func mustOpen(tb testing.TB, db testDB) *Store {
	tb.Helper()
	return mustOpenWith(tb, db, options{recheck: recheckEvery})
}

func mustOpenWith(tb testing.TB, db testDB, opts options) *Store {
	tb.Helper()
	s, err := open(context.Background(), db.dsn, discardLogger(), opts)
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	testenv.PostgresDSN(t) // skip (or fail) once, not in each case
	storetest.Run(t, func(t *testing.T) eventstore.Store { return mustOpen(t, mustDB(t)) })
}

func ev(typ string) eventstore.Proposed {
	return eventstore.Proposed{Type: typ, SchemaVersion: 1, Data: []byte(`{}`)}
}

// Two stores on one database, as two servers are: while both append, on
// streams of their own and on one they share, a follower reading the log
// page by page must find each page starting right after its cursor. Were
// positions handed out before commit (a sequence), it would find N+1
// committed before N, skip N for good, and fail here.
func TestCommitOrderAcrossStores(t *testing.T) {
	db := mustDB(t)
	stores := []*Store{mustOpen(t, db), mustOpen(t, db)}
	follower := mustOpen(t, db)
	ctx, cancel := context.WithTimeout(context.Background(), 6*waitLimit)
	defer cancel()

	const perStore, appends = 4, 40
	var (
		mu       sync.Mutex
		appended = map[string]int64{} // event id -> position
		wg       sync.WaitGroup
		errs     = make(chan error, len(stores)*perStore+1)
	)
	for i, s := range stores {
		for w := range perStore {
			wg.Go(func() {
				own := fmt.Sprintf("s%d-w%d", i, w)
				var version int64
				for a := range appends {
					stream, expected := own, version
					if a%3 == 0 {
						stream, expected = "shared", eventstore.AnyVersion
					}
					batch := make([]eventstore.Proposed, 1+a%3)
					for k := range batch {
						batch[k] = ev("t")
					}
					got, err := s.Append(ctx, stream, expected, batch...)
					if err != nil {
						errs <- fmt.Errorf("store %d writer %d append %d: %w", i, w, a, err)
						return
					}
					if stream == own {
						version = got[len(got)-1].StreamVersion
					}
					mu.Lock()
					for _, e := range got {
						appended[e.ID] = e.Position
					}
					mu.Unlock()
				}
			})
		}
	}

	total := 0
	for a := range appends {
		total += 1 + a%3
	}
	total *= len(stores) * perStore
	seen := map[string]int64{}
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		var cursor int64
		for len(seen) < total {
			page, err := follower.ReadAll(ctx, cursor, 7)
			if err != nil {
				errs <- fmt.Errorf("follower: ReadAll(%d): %w", cursor, err)
				return
			}
			for _, e := range page {
				if e.Position != cursor+1 {
					errs <- fmt.Errorf("follower at %d read position %d next: an event appeared behind it or a gap", cursor, e.Position)
					return
				}
				seen[e.ID] = e.Position
				cursor = e.Position
			}
			if len(page) == 0 {
				if err := follower.WaitFor(ctx, cursor); err != nil {
					errs <- fmt.Errorf("follower: WaitFor(%d) with %d of %d events seen: %w", cursor, len(seen), total, err)
					return
				}
			}
		}
	}()
	wg.Wait()
	<-followed
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	if len(appended) != total || len(seen) != total {
		t.Fatalf("appended %d events, the follower saw %d, want %d both", len(appended), len(seen), total)
	}
	for id, pos := range appended {
		if seen[id] != pos {
			t.Errorf("event %s appended at %d, followed at %d", id, pos, seen[id])
		}
	}
	// The shared stream's versions have no gaps either.
	shared, err := stores[0].ReadStream(ctx, "shared", 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range shared {
		if e.StreamVersion != int64(i)+1 {
			t.Fatalf("shared stream: event %d at version %d", i, e.StreamVersion)
		}
	}
}

// Appends from two stores race on new streams, each expecting version 0:
// one wins each stream, the others conflict.
func TestNewStreamRaceAcrossStores(t *testing.T) {
	db := mustDB(t)
	stores := []*Store{mustOpen(t, db), mustOpen(t, db)}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	const streams, racers = 20, 4
	var (
		mu   sync.Mutex
		won  = map[string]int{}
		wg   sync.WaitGroup
		errs = make(chan error, streams*racers)
	)
	for st := range streams {
		for r := range racers {
			s := stores[r%len(stores)]
			wg.Go(func() {
				stream := fmt.Sprintf("new-%d", st)
				_, err := s.Append(ctx, stream, 0, ev("t.first"))
				switch {
				case err == nil:
					mu.Lock()
					won[stream]++
					mu.Unlock()
				case errors.Is(err, eventstore.ErrVersionConflict):
				default:
					errs <- err
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for st := range streams {
		stream := fmt.Sprintf("new-%d", st)
		if won[stream] != 1 {
			t.Errorf("stream %s: %d appends at version 0 won, want 1", stream, won[stream])
		}
	}
}

// The unique (stream_id, stream_version) constraint is the last word when
// something beats the version check: here a transaction that writes the
// table without the head's lock, committing while an append waits on its
// row.
func TestVersionConstraintIsAConflict(t *testing.T) {
	db := mustDB(t)
	s := mustOpen(t, db)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()

	raw := db.connect(t)
	tx, err := raw.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO events (position, event_id, stream_id, stream_version, type, schema_version, recorded_at)
		VALUES (1000, 'evt_sideways', 's', 1, 't', 1, now())`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Append(ctx, "s", 0, ev("t"))
		done <- err
	}()
	// The append reads version 0 (the insert above is not committed) and
	// then waits on the index entry for version 1.
	waitUntil(t, func() bool {
		var n int
		err := raw.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'", db.name).Scan(&n)
		return err == nil && n > 0
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, eventstore.ErrVersionConflict) || !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Append racing a committed version = %v, want ErrVersionConflict", err)
	}
}

// waitUntil polls cond until it holds or waitLimit passes.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", waitLimit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitForAppend has s wait for a position past its head, lets append run
// once s is waiting, and returns how long after append returned the wait
// did (next to nothing when the notification beat the append's own
// reply, as it may: PostgreSQL sends both at commit).
func waitForAppend(t *testing.T, s *Store, append func()) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	s.mu.Lock()
	head := s.head
	s.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- s.WaitFor(ctx, head) }()
	waitUntil(t, func() bool { return s.waiting.Load() == 1 })
	append()
	appended := time.Now()
	if err := <-done; err != nil {
		t.Fatalf("WaitFor(%d) after another store's append: %v", head, err)
	}
	return time.Since(appended)
}

// A store is woken by another's append through its notification. The
// waiting store never re-reads the head (recheck off), so only the
// notification can wake it; the time is measured too. Over a unix socket
// it is a millisecond or two; the bound is the default re-read interval,
// where the safety net would have answered, so the test fails only if
// waking took as long as not being notified at all would (hundreds of
// times the usual, even under -race on a loaded 2-core machine).
func TestWaitForWokenByAnotherStore(t *testing.T) {
	db := mustDB(t)
	a := mustOpen(t, db)
	storetest.MustAppend(t, a, "s", 0, ev("t"))
	b := mustOpenWith(t, db, options{})
	took := waitForAppend(t, b, func() { storetest.MustAppend(t, a, "s", 1, ev("t")) })
	t.Logf("woken %v after the other store's append returned", took)
	if took >= recheckEvery {
		t.Errorf("woken %v after the append, want well under %v", took, recheckEvery)
	}
}

// With every notification lost (the appending store notifies a channel
// nobody listens on), the head's re-read wakes the waiter all the same.
func TestWaitForRecheckWithoutNotification(t *testing.T) {
	db := mustDB(t)
	a := mustOpenWith(t, db, options{recheck: recheckEvery, channel: "corral_nobody_listens"})
	b := mustOpenWith(t, db, options{recheck: 50 * time.Millisecond})
	took := waitForAppend(t, b, func() { storetest.MustAppend(t, a, "s", 0, ev("t")) })
	t.Logf("woken %v after the append, by the re-read", took)
}

// A listening connection that the server drops is replaced, and what was
// appended while it was gone still wakes the waiter, with no re-read to
// fall back on.
func TestListenerReconnects(t *testing.T) {
	db := mustDB(t)
	a := mustOpen(t, db)
	b := mustOpenWith(t, db, options{})
	admin := db.connect(t)
	ctx := context.Background()
	listeners := func() []int32 {
		rows, err := admin.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND query LIKE 'LISTEN %' ORDER BY pid", db.name)
		if err != nil {
			t.Fatal(err)
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			t.Fatal(err)
		}
		return pids
	}
	old := listeners()
	if len(old) != 2 {
		t.Fatalf("%d listening connections, want 2 (one per store)", len(old))
	}
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid", old); err != nil {
		t.Fatal(err)
	}
	took := waitForAppend(t, b, func() {
		// Once both are back, so that the append is notified to the new
		// connections, not lost with the old ones.
		waitUntil(t, func() bool {
			now := listeners()
			return len(now) == 2 && !slices.ContainsFunc(now, func(p int32) bool { return slices.Contains(old, p) })
		})
		storetest.MustAppend(t, a, "s", 0, ev("t"))
	})
	t.Logf("woken %v after the append, on a new listening connection", took)
}

func TestMigrationsConcurrentAndIdempotent(t *testing.T) {
	db := mustDB(t)
	ctx := context.Background()
	// Four servers starting at once on an empty database.
	stores := make([]*Store, 4)
	errs := make([]error, len(stores))
	var wg sync.WaitGroup
	for i := range stores {
		wg.Go(func() { stores[i], errs[i] = Open(ctx, db.dsn, discardLogger()) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Open %d: %v", i, err)
		} else {
			stores[i].Close()
		}
	}
	if t.Failed() {
		return
	}
	ms, err := loadMigrations()
	if err != nil {
		t.Fatal(err)
	}
	raw := db.connect(t)
	applied := func() []int {
		rows, err := raw.Query(ctx, "SELECT version FROM schema_version ORDER BY version")
		if err != nil {
			t.Fatal(err)
		}
		vs, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			t.Fatal(err)
		}
		return vs
	}
	var want []int
	for _, m := range ms {
		want = append(want, m.Version)
	}
	if got := applied(); !slices.Equal(got, want) {
		t.Errorf("schema_version rows %v after concurrent Opens, want %v", got, want)
	}

	// A second Open finds nothing to do and keeps the events and head.
	s := mustOpen(t, db)
	first := storetest.MustAppend(t, s, "a", 0, ev("t"), ev("t"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, db)
	if got := applied(); !slices.Equal(got, want) {
		t.Errorf("schema_version rows %v after reopening, want %v", got, want)
	}
	if got := storetest.MustReadAll(t, s, 0); len(got) != 2 || got[1].ID != first[1].ID {
		t.Errorf("after reopening: %d events, want the 2 appended", len(got))
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.WaitFor(cctx, 1); err != nil {
		t.Errorf("WaitFor(1) after reopening with 2 events = %v, want nil", err)
	}
	if next := storetest.MustAppend(t, s, "b", 0, ev("t")); next[0].Position != 3 {
		t.Errorf("first append after reopening at position %d, want 3", next[0].Position)
	}
}

func TestRefusesNewerSchema(t *testing.T) {
	db := mustDB(t)
	s := mustOpen(t, db)
	s.Close()
	raw := db.connect(t)
	if _, err := raw.Exec(context.Background(), "INSERT INTO schema_version (version, name) VALUES (99, '0099_future.sql')"); err != nil {
		t.Fatal(err)
	}
	s, err := Open(context.Background(), db.dsn, discardLogger())
	if err == nil {
		s.Close()
		t.Fatalf("Open of a database with schema version 99 succeeded")
	}
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "newer than this binary") {
		t.Errorf("Open error = %v, want ErrFailedPrecondition saying the schema is newer than this binary", err)
	}
}

func TestClosed(t *testing.T) {
	db := mustDB(t)
	s, err := Open(context.Background(), db.dsn, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- s.WaitFor(context.Background(), 0) }()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-waited; !errors.Is(err, ErrClosed) {
		t.Errorf("WaitFor across Close = %v, want ErrClosed", err)
	}
	_, err = s.Append(context.Background(), "a", 0, ev("t"))
	if !errors.Is(err, ErrClosed) || !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Append after Close = %v, want ErrClosed (ErrFailedPrecondition)", err)
	}
	if _, err := s.ReadAll(context.Background(), 0, 10); err == nil {
		t.Errorf("ReadAll after Close succeeded")
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
}

func TestAppendValidation(t *testing.T) {
	s := mustOpen(t, mustDB(t))
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
		// What PostgreSQL's text cannot hold, which SQLite's can.
		{"NUL in type", "s", 0, []eventstore.Proposed{{Type: "t\x00"}}},
		{"invalid UTF-8 in stream", "s\xff", 0, []eventstore.Proposed{{Type: "t"}}},
	} {
		if _, err := s.Append(ctx, tc.stream, tc.expected, tc.events...); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: Append error = %v, want ErrInvalidArgument", tc.name, err)
		}
	}
	if _, err := s.ReadAll(ctx, 0, 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("ReadAll(limit 0) error = %v, want ErrInvalidArgument", err)
	}
	// The refused appends gave their positions back.
	if got := storetest.MustAppend(t, s, "s", 0, ev("t")); got[0].Position != 1 {
		t.Errorf("first append after refused ones at position %d, want 1", got[0].Position)
	}
}

func TestDuplicateEventID(t *testing.T) {
	s := mustOpen(t, mustDB(t))
	storetest.MustAppend(t, s, "a", 0, eventstore.Proposed{ID: "evt_1", Type: "t", SchemaVersion: 1})
	_, err := s.Append(context.Background(), "b", 0, eventstore.Proposed{ID: "evt_1", Type: "t", SchemaVersion: 1})
	if !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Append with a used event id = %v, want ErrAlreadyExists", err)
	}
}

// A cancelled append writes nothing and gives its positions back.
func TestCancelledAppend(t *testing.T) {
	s := mustOpen(t, mustDB(t))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Append(ctx, "s", 0, ev("t")); !errors.Is(err, context.Canceled) {
		t.Errorf("Append with a cancelled context = %v, want context.Canceled", err)
	}
	if got := storetest.MustAppend(t, s, "s", 0, ev("t")); got[0].Position != 1 {
		t.Errorf("append after a cancelled one at position %d, want 1", got[0].Position)
	}
}

// The connection string may hold a password: no error and no log line
// repeats it, whether it parses or not, connects or not.
func TestDSNNotRepeated(t *testing.T) {
	const secret = "hunter2-secret"
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	for _, tc := range []struct {
		dsn   string
		class error
	}{
		{"host=/nonexistent port=5432 dbname=x user=u password=" + secret, errdefs.ErrUnavailable},
		{"postgres://u:" + secret + "@localhost:1/x?connect_timeout=5", errdefs.ErrUnavailable},
		{"host=x port=notaport password=" + secret, errdefs.ErrInvalidArgument},
		{"postgres://u:" + secret + "@host:notaport/x", errdefs.ErrInvalidArgument},
		{"host=x password='" + secret + " port=1", errdefs.ErrInvalidArgument}, // unterminated quote
	} {
		s, err := Open(ctx, tc.dsn, log)
		if err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", tc.dsn)
			continue
		}
		if !errors.Is(err, tc.class) {
			t.Errorf("Open(%q) = %v, want class %v", tc.dsn, err, tc.class)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%q) error repeats the password: %v", tc.dsn, err)
		}
	}

	// A store that opens logs where it is, not how it got there. Peer
	// authentication ignores a password; a test server that wants one
	// has it in its DSN already.
	db := mustDB(t)
	dsn, password := db.dsn, secret
	if cfg, err := pgx.ParseConfig(dsn); err != nil {
		t.Fatal(err)
	} else if cfg.Password != "" {
		password = cfg.Password
	} else {
		dsn = postgrestest.WithSetting(dsn, "password", secret)
	}
	s, err := Open(ctx, dsn, log)
	if err != nil {
		t.Fatal(err)
	}
	storetest.MustAppend(t, s, "a", 0, ev("t"))
	s.Close()
	if strings.Contains(logs.String(), password) {
		t.Errorf("the log repeats the password:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), db.name) {
		t.Errorf("the log does not name the database %s:\n%s", db.name, logs.String())
	}
}

// Inspect reports the server's version, the schema's and the binary's,
// the live replicas, and a clock skew near zero (one machine), changing
// nothing.
func TestInspect(t *testing.T) {
	db := mustDB(t)
	ctx := context.Background()
	r, err := Inspect(ctx, db.dsn)
	if err != nil || r.ServerVersion == "" || r.Schema != 0 || r.Binary < 1 || len(r.Replicas) != 0 {
		t.Fatalf("a fresh database: %+v, %v; want a version, schema 0, no replica", r, err)
	}
	if r.ClockSkew > time.Second || r.ClockSkew < -time.Second {
		t.Errorf("clock skew %s on one machine", r.ClockSkew)
	}
	s := mustOpen(t, db)
	if r, err = Inspect(ctx, db.dsn); err != nil || r.Schema != r.Binary || len(r.Replicas) != 0 {
		t.Errorf("a database opened: %+v, %v; want the schema migrated, no replica yet", r, err)
	}
	self := cluster.Replica{ID: cluster.NewID(), Host: "here", Runtimes: []string{"local"}}
	if _, err := s.Join(ctx, self); err != nil {
		t.Fatal(err)
	}
	r, err = Inspect(ctx, db.dsn)
	if err != nil || len(r.Replicas) != 1 || r.Replicas[0].ID != self.ID || r.Replicas[0].Host != "here" || !slices.Equal(r.Replicas[0].Runtimes, self.Runtimes) {
		t.Errorf("a database with a replica: %+v, %v; want it listed", r, err)
	}
	s.Close()
	if r, err = Inspect(ctx, db.dsn); err != nil || len(r.Replicas) != 0 {
		t.Errorf("after the replica closed: %+v, %v; want none", r, err)
	}
}

// Replicas on one database see each other alive while they renew their
// leases, and one whose lease lapses (a kill: nothing renews it) dead; a
// replica is steady only after a TTL of renewals; one replica leads at a
// time, and when it goes another takes over.
func TestMembers(t *testing.T) {
	db := mustDB(t)
	ctx := context.Background()
	a, b := mustOpen(t, db), mustOpen(t, db)
	ma, err := a.Join(ctx, cluster.Replica{ID: "replica-a", Runtimes: []string{"local"}})
	if err != nil {
		t.Fatal(err)
	}
	mb, err := b.Join(ctx, cluster.Replica{ID: "replica-b"})
	if err != nil {
		t.Fatal(err)
	}
	if ma.Steady() || mb.Steady() {
		t.Error("steady before a TTL of renewals")
	}
	waitFor(t, "both replicas live on both", func() bool { return len(ma.Live()) == 2 && len(mb.Live()) == 2 })
	if got := ma.Live()["replica-a"].Runtimes; !slices.Equal(got, []string{"local"}) {
		t.Errorf("replica-a's runtimes: %v", got)
	}
	waitFor(t, "steady", func() bool { return ma.Steady() && mb.Steady() })

	// One that joins now is alive to the others before their next
	// renewal lists it: a replica is gone only on its lease's word.
	c := mustOpen(t, db)
	if _, err := c.Join(ctx, cluster.Replica{ID: "replica-c", URL: "http://c"}); err != nil {
		t.Fatal(err)
	}
	if r, ok := ma.Alive("replica-c"); !ok || r.URL != "http://c" {
		t.Errorf("a replica just joined: %+v, %v; want alive, with its address", r, ok)
	}
	if _, ok := ma.Alive("replica-never"); ok {
		t.Error("a replica that never joined is alive")
	}
	c.Close()

	// One leader at a time.
	var leading atomic.Int32
	var most atomic.Int32
	lead := func(m *Members, ctx context.Context) {
		m.Lead(ctx, func(ctx context.Context) {
			n := leading.Add(1)
			for cur := most.Load(); n > cur && !most.CompareAndSwap(cur, n); cur = most.Load() {
			}
			<-ctx.Done()
			leading.Add(-1)
		})
	}
	actx, acancel := context.WithCancel(ctx)
	bctx, bcancel := context.WithCancel(ctx)
	defer bcancel()
	go lead(ma, actx)
	go lead(mb, bctx)
	waitFor(t, "a leader", func() bool { return leading.Load() == 1 })
	time.Sleep(2 * cluster.Renew)
	if most.Load() != 1 {
		t.Fatalf("%d leaders at once", most.Load())
	}

	// A lapses, as if killed: a transaction holding its row's lock holds
	// back its renewals (each gives up after a TTL), and its lease ages.
	// B sees it dead.
	tx, err := db.connect(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM replicas WHERE id = 'replica-a' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "replica-a dead to replica-b", func() bool { _, ok := mb.Live()["replica-a"]; return !ok })
	if ma.Steady() {
		t.Error("replica-a steady while it cannot renew its lease")
	}
	tx.Rollback(ctx)

	// A stops leading (its context ends) and closes: B leads.
	acancel()
	a.Close()
	waitFor(t, "replica-b alone and leading", func() bool { return len(mb.Live()) == 1 && leading.Load() == 1 })
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
	}
}

// A server of the test's own stops and starts again; a store on it fails
// meanwhile, and appends again once it is back, without being reopened.
func TestStoreRidesOutARestart(t *testing.T) {
	srv := postgrestest.NewServer(t)
	ctx := context.Background()
	s, err := open(ctx, srv.DSN, discardLogger(), options{recheck: recheckEvery})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Append(ctx, "s", 0, eventstore.Proposed{Type: "a"}); err != nil {
		t.Fatal(err)
	}
	srv.Stop(t)
	if _, err := s.Append(ctx, "s", 1, eventstore.Proposed{Type: "b"}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("append while the server is down: %v, want ErrUnavailable", err)
	}
	srv.Start(t)
	evs, err := s.Append(ctx, "s", 1, eventstore.Proposed{Type: "b"})
	if err != nil || evs[0].Position != 2 {
		t.Fatalf("append after the restart: %+v, %v; want position 2", evs, err)
	}
}
