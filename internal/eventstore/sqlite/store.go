// Package sqlite is Corral's embedded event store: one SQLite file (the data
// root's corral.db) in WAL mode, written by a single goroutine that groups
// concurrent appends into one transaction, and read through a separate
// read-only connection pool.
//
// Durability: the writer runs with synchronous=FULL, so the WAL is fsynced on
// every commit and an Append that returned nil survives kill -9 and power
// loss. Group commit pays for that fsync once per batch instead of once per
// append.
//
// Only one process may open a database: Open takes a non-blocking flock on
// path+".lock" and fails with errdefs.ErrFailedPrecondition when another
// server holds it. Because the writer is the only one, positions are
// assigned in commit order without gaps (but those a compaction leaves:
// compact.go), and WaitFor is woken directly by the writer after each
// commit.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/lockfile"
	"github.com/corral-dev/corral/internal/logkey"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// ErrClosed is returned by Append and WaitFor once the store is closed. It is
// of class errdefs.ErrFailedPrecondition.
var ErrClosed = fmt.Errorf("event store is closed: %w", errdefs.ErrFailedPrecondition)

// busyTimeout bounds how long a connection waits for a lock held by another
// connection of this process (a reader during a checkpoint, for example).
// With one writer it is rarely reached; 5 s turns a stuck lock into an error
// rather than a hang.
const busyTimeout = 5 * time.Second

// timeFormat is fixed-width (always nine fractional digits) so that text
// order is time order; time.RFC3339Nano parses it back.
const timeFormat = "2006-01-02T15:04:05.000000000Z07:00"

var _ eventstore.Store = (*Store)(nil)

// Store is the SQLite event store.
//
// Lifecycle: Open returns a running store (file locked, schema migrated,
// writer goroutine started); Close stops it for good. All methods are safe
// for concurrent use. After Close, Append and WaitFor return ErrClosed and
// reads fail; Close is idempotent.
type Store struct {
	log  *slog.Logger
	path string
	lock *lockfile.File
	wdb  *sql.DB // one connection, used only by the writer goroutine
	rdb  *sql.DB // read-only pool

	reqs       chan *appendReq  // unbuffered: a request sent is a request answered
	imports    chan *importReq  // the same, for Import
	compacts   chan *compactReq // and for Compact
	quit       chan struct{}    // closed by Close
	writerDone chan struct{}    // closed when the writer goroutine returns
	w          writer           // state owned by the writer goroutine
	reserveAt  time.Time        // when the reserve was given back or last tried; zero when kept (writer goroutine's)

	mu      sync.Mutex
	head    int64         // highest committed position
	wake    chan struct{} // closed and replaced on each commit
	recent  recent        // the last committed events, up to head
	commits CommitStats

	closeOnce sync.Once
	closeErr  error
}

// Open opens (creating if needed) the event store at path, locks it against
// other processes, applies pending schema migrations and starts the writer.
// The directory of path must exist. If another process has the store open,
// Open returns an error of class errdefs.ErrFailedPrecondition.
func Open(ctx context.Context, path string, log *slog.Logger) (*Store, error) {
	if path == "" || strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("open event store %q: path must be a plain file path: %w", path, errdefs.ErrInvalidArgument)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	lock, err := lockfile.Acquire(path + ".lock")
	if err != nil {
		return nil, fmt.Errorf("open event store %s: %w", path, err)
	}
	// Events hold task prompts and results: create the file owner-only.
	// SQLite gives the -wal and -shm files the database file's mode.
	if f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		_ = lock.Release() // the open error is the one to report
		return nil, fmt.Errorf("open event store %s: %w", path, err)
	} else if err := f.Close(); err != nil {
		_ = lock.Release()
		return nil, fmt.Errorf("open event store %s: %w", path, err)
	}
	s := &Store{
		log:        log,
		path:       path,
		lock:       lock,
		reqs:       make(chan *appendReq),
		imports:    make(chan *importReq),
		compacts:   make(chan *compactReq),
		quit:       make(chan struct{}),
		writerDone: make(chan struct{}),
		wake:       make(chan struct{}),
		commits:    CommitStats{Within: make([]uint64, len(CommitBuckets))},
	}
	if err := s.open(ctx); err != nil {
		s.closeDBs()
		return nil, fmt.Errorf("open event store %s: %w", path, err)
	}
	if _, err := s.keepReserve(); err != nil {
		// The store works without it, as it did before the disk filled.
		log.Warn("cannot make the event store's reserve", logkey.Error, err)
	}
	go s.runWriter()
	return s, nil
}

func (s *Store) open(ctx context.Context) error {
	ms := int64(busyTimeout / time.Millisecond)
	q := url.Values{}
	q.Set("_busy_timeout", fmt.Sprint(ms))
	q.Set("_foreign_keys", "1")
	q.Set("_journal_mode", "WAL")
	q.Set("_synchronous", "FULL")
	q.Set("_txlock", "immediate") // take the write lock at BEGIN, never upgrade mid-transaction
	wdb, err := sql.Open("sqlite", s.path+"?"+q.Encode())
	if err != nil {
		return fmt.Errorf("open writer: %w", err)
	}
	s.wdb = wdb
	wdb.SetMaxOpenConns(1)
	wdb.SetMaxIdleConns(1)
	wdb.SetConnMaxLifetime(0)
	wdb.SetConnMaxIdleTime(0)

	var mode string
	if err := wdb.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return fmt.Errorf("read journal mode: %w", err)
	}
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("set WAL journal mode: got %q: %w", mode, errdefs.ErrFailedPrecondition)
	}
	version, err := migrate(ctx, wdb)
	if err != nil {
		return err
	}
	if err := s.w.prepare(ctx, wdb); err != nil {
		return err
	}

	// Readers: WAL and synchronous are properties of the file and the writer;
	// readers only need the busy timeout and must never write.
	rq := url.Values{}
	rq.Set("_busy_timeout", fmt.Sprint(ms))
	rq.Set("_foreign_keys", "1")
	rq.Set("_query_only", "1")
	rdb, err := sql.Open("sqlite", s.path+"?"+rq.Encode())
	if err != nil {
		return fmt.Errorf("open readers: %w", err)
	}
	s.rdb = rdb
	n := max(4, runtime.GOMAXPROCS(0))
	rdb.SetMaxOpenConns(n)
	rdb.SetMaxIdleConns(n)

	var head sql.NullInt64
	if err := rdb.QueryRowContext(ctx, "SELECT MAX(position) FROM events").Scan(&head); err != nil {
		return fmt.Errorf("read head position: %w", err)
	}
	s.head = head.Int64
	s.w.head = head.Int64
	s.log.Info("event store opened", "path", s.path, "schema_version", version, "position", s.head)
	return nil
}

// Close stops the writer, closes the database and releases the lock. Appends
// waiting to be written fail with ErrClosed; appends already in a batch are
// committed (or failed) and answered first.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.quit)
		<-s.writerDone
		s.closeErr = s.closeDBs()
		if s.closeErr == nil {
			s.log.Info("event store closed", "path", s.path)
		}
	})
	return s.closeErr
}

func (s *Store) closeDBs() error {
	var errs []error
	if err := s.w.close(); err != nil {
		errs = append(errs, err)
	}
	if s.rdb != nil {
		if err := s.rdb.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close readers: %w", err))
		}
	}
	if s.wdb != nil {
		if err := s.wdb.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close writer: %w", err))
		}
	}
	if err := s.lock.Release(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close event store %s: %w", s.path, err)
	}
	return nil
}

const selectEvent = `SELECT position, event_id, stream_id, stream_version, type, schema_version,
	data, actor, correlation_id, causation_id, recorded_at FROM events `

// ReadStream implements eventstore.Store.
func (s *Store) ReadStream(ctx context.Context, stream string, after int64) ([]eventstore.Event, error) {
	rows, err := s.rdb.QueryContext(ctx, selectEvent+
		"WHERE stream_id = ? AND stream_version > ? ORDER BY stream_version", stream, after)
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", stream, err)
	}
	evs, err := scanEvents(rows)
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", stream, err)
	}
	return evs, nil
}

// ReadAll implements eventstore.Store. A limit below 1 is ErrInvalidArgument.
func (s *Store) ReadAll(ctx context.Context, after int64, limit int) ([]eventstore.Event, error) {
	if limit < 1 {
		return nil, fmt.Errorf("read events after %d: limit %d: %w", after, limit, errdefs.ErrInvalidArgument)
	}
	if ctx.Err() == nil && !s.isClosed() {
		s.mu.Lock()
		evs, ok := s.recent.after(after, limit)
		s.mu.Unlock()
		if ok {
			return evs, nil
		}
	}
	return s.readAll(ctx, after, limit)
}

// readAll is ReadAll from SQLite.
func (s *Store) readAll(ctx context.Context, after int64, limit int) ([]eventstore.Event, error) {
	rows, err := s.rdb.QueryContext(ctx, selectEvent+
		"WHERE position > ? ORDER BY position LIMIT ?", after, limit)
	if err != nil {
		return nil, fmt.Errorf("read events after %d: %w", after, err)
	}
	evs, err := scanEvents(rows)
	if err != nil {
		return nil, fmt.Errorf("read events after %d: %w", after, err)
	}
	return evs, nil
}

// Position implements eventstore.Store.
func (s *Store) Position(ctx context.Context, eventID string) (int64, error) {
	var pos int64
	err := s.rdb.QueryRowContext(ctx, "SELECT position FROM events WHERE event_id = ?", eventID).Scan(&pos)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("find event %s: %w", eventID, errdefs.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("find event %s: %w", eventID, err)
	}
	return pos, nil
}

// WaitFor implements eventstore.Store. It is woken by commits of this
// process's writer, the only one the lock allows. After Close it returns
// ErrClosed.
func (s *Store) WaitFor(ctx context.Context, after int64) error {
	for {
		s.mu.Lock()
		head, wake := s.head, s.wake
		s.mu.Unlock()
		if head > after {
			return nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.quit:
			return fmt.Errorf("wait for events after %d: %w", after, ErrClosed)
		}
	}
}

// isClosed reports whether Close has begun.
func (s *Store) isClosed() bool {
	select {
	case <-s.quit:
		return true
	default:
		return false
	}
}

// published records a commit of evs, up to head, and how long it took, and
// wakes every WaitFor.
func (s *Store) published(head int64, evs []eventstore.Event, took time.Duration) {
	s.mu.Lock()
	s.head = head
	s.commits.add(took, len(evs))
	s.recent.add(evs)
	close(s.wake)
	s.wake = make(chan struct{})
	s.mu.Unlock()
}

func scanEvents(rows *sql.Rows) ([]eventstore.Event, error) {
	defer rows.Close()
	var evs []eventstore.Event
	for rows.Next() {
		var (
			e    eventstore.Event
			data sql.NullString
			at   string
		)
		if err := rows.Scan(&e.Position, &e.ID, &e.StreamID, &e.StreamVersion, &e.Type, &e.SchemaVersion,
			&data, &e.Actor, &e.CorrelationID, &e.CausationID, &at); err != nil {
			return nil, fmt.Errorf("scan event: %w", err)
		}
		if data.Valid {
			e.Data = []byte(data.String)
		}
		t, err := time.Parse(time.RFC3339Nano, at)
		if err != nil {
			return nil, fmt.Errorf("parse recorded_at of event %s: %w", e.ID, err)
		}
		e.RecordedAt = t.UTC()
		evs = append(evs, e)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return evs, nil
}
