// Package postgres is Corral's event store on PostgreSQL, for several
// servers sharing one log: each opens the same database, appends to it and
// follows what the others append.
//
// Positions: every append takes its positions from a one-row counter,
// event_head, with UPDATE ... SET position = position + n RETURNING
// position inside its own transaction. The row lock that UPDATE takes is
// held until the transaction ends, so appends, from whatever process,
// commit one at a time in position order, and a rolled-back append gives
// its positions back: positions are in commit order without gaps (but
// those a compaction leaves: compact.go), and a reader that has seen
// position N never later finds another event at or below N. A sequence
// (bigserial) would not do: it hands out numbers before commit, so N+1
// can commit, and be read, before N, and a follower whose cursor passed
// N+1 would never see N; its numbers are not given back either, which
// leaves gaps. The price is that appends do not overlap:
// each holds the lock over its version check, its inserts and its commit
// (one WAL flush), whatever process it comes from. An append's stream
// version is read under that lock, so AnyVersion never conflicts, and the
// unique (stream_id, stream_version) constraint stays as the last word:
// anything that reaches a taken version anyway fails with
// eventstore.ErrVersionConflict. Generated event ids and recorded_at are
// made under the lock too (recorded_at from the database's clock), so they
// sort like positions.
//
// Waking: each append sends NOTIFY with the new head in its transaction,
// which PostgreSQL delivers at commit; every Store listens on a connection
// of its own and wakes its WaitFor callers, so an append on one server
// wakes the followers on all of them within milliseconds. The channel is
// named after the events table's oid, so two stores in two schemas of one
// database never wake each other with the wrong head. A notification is
// lost if the listening connection is (a restart, a network cut): the
// listener reconnects and re-reads the head, and while anyone waits the
// head is also read once a second, so a waiter is late by a second at
// worst, never stuck.
//
// Schema: versioned migrations embedded from migrations/, all applied at
// Open in one transaction under an advisory lock, so that servers starting
// at once apply each migration once; a database whose schema is newer than
// the binary is refused. The store wants a database (or a schema first on
// the search_path) of its own: it makes tables named events, event_head,
// checkpoints (eventstore.Checkpoints) and schema_version.
//
// The connection string is a secret (it may hold a password): no error or
// log line of this package repeats it, only its host, port and database.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/logkey"
)

// ErrClosed is returned by Append and WaitFor once the store is closed. It is
// of class errdefs.ErrFailedPrecondition.
var ErrClosed = fmt.Errorf("event store is closed: %w", errdefs.ErrFailedPrecondition)

// recheckEvery is how often the head is read from the database while
// anyone waits in WaitFor, notification or not: the safety net for a
// notification lost with the listening connection, at one primary-key
// read a second per server.
const recheckEvery = time.Second

// queryTimeout bounds the store's own background queries (the head's
// re-read) and an append's commit, which runs on even if the caller gives
// up so that its answer is definite.
const queryTimeout = 30 * time.Second

var _ eventstore.Store = (*Store)(nil)

// Store is the PostgreSQL event store.
//
// Lifecycle: Open returns a running store (schema migrated, listening for
// other servers' appends); Close stops it for good. All methods are safe
// for concurrent use. After Close, Append and WaitFor return ErrClosed and
// reads fail; Close is idempotent.
type Store struct {
	log     *slog.Logger
	target  string // host, port and database, for messages: never the DSN
	pool    *pgxpool.Pool
	connCfg *pgx.ConnConfig // the listener's, a copy of the pool's
	channel string          // what appends NOTIFY and the listener LISTENs on

	quit    chan struct{}      // closed by Close
	stop    context.CancelFunc // ends the background goroutines' context
	bg      sync.WaitGroup     // the listener, the re-reader and the lease (Join)
	waiting atomic.Int64       // WaitFor calls blocked now

	mu   sync.Mutex
	head int64         // highest committed position this store knows of
	wake chan struct{} // closed and replaced when head moves

	closeOnce sync.Once
}

// options are what the tests change.
type options struct {
	recheck time.Duration // 0: never (a test that must see a notification do the work)
	channel string        // "" for the events table's; a test gives one nobody listens on
}

// Open connects to the database dsn names, applies pending schema
// migrations and starts listening for appends. A dsn that does not parse
// is errdefs.ErrInvalidArgument, a server that cannot be reached
// errdefs.ErrUnavailable, a schema newer than this binary
// errdefs.ErrFailedPrecondition. dsn takes either form pgx reads
// ("host=... dbname=..." or a postgres:// URL); what it leaves out comes
// from libpq's PG* environment variables and defaults.
func Open(ctx context.Context, dsn string, log *slog.Logger) (*Store, error) {
	return open(ctx, dsn, log, options{recheck: recheckEvery})
}

func open(ctx context.Context, dsn string, log *slog.Logger, opts options) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if dsn == "" {
		return nil, fmt.Errorf("open event store: empty PostgreSQL connection string: %w", errdefs.ErrInvalidArgument)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's message quotes the string with the password masked, as
		// far as it can tell where the password is; say nothing of it.
		return nil, fmt.Errorf("open event store: the PostgreSQL connection string does not parse (it is not repeated here, as it may hold a password): %w",
			errdefs.ErrInvalidArgument)
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "corral"
	}
	cc := cfg.ConnConfig
	target := fmt.Sprintf("database %q on %s port %d", cc.Database, cc.Host, cc.Port)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open event store (%s): %w", target, classify(err))
	}
	s := &Store{
		log:     log,
		target:  target,
		pool:    pool,
		connCfg: cfg.ConnConfig.Copy(),
		channel: opts.channel,
		quit:    make(chan struct{}),
		wake:    make(chan struct{}),
	}
	version, listener, err := s.start(ctx)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("open event store (%s): %w", target, err)
	}
	bgctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.bg.Add(1)
	go s.listen(bgctx, listener)
	if opts.recheck > 0 {
		s.bg.Add(1)
		go s.recheck(bgctx, opts.recheck)
	}
	log.Info("event store opened", "host", cc.Host, "port", cc.Port, "database", cc.Database,
		"schema_version", version, "position", s.head)
	return s, nil
}

// start migrates the schema, starts listening and reads the head, in that
// order: an append that commits between the last two is in the head read,
// one after is notified. It returns the schema version and the listening
// connection.
func (s *Store) start(ctx context.Context) (int, *pgx.Conn, error) {
	version, err := migrate(ctx, s.pool)
	if err != nil {
		return 0, nil, err
	}
	if s.channel == "" {
		var oid uint32
		if err := s.pool.QueryRow(ctx, "SELECT 'events'::regclass::oid").Scan(&oid); err != nil {
			return 0, nil, fmt.Errorf("find the events table: %w", classify(err))
		}
		s.channel = "corral_events_" + strconv.FormatUint(uint64(oid), 10)
	}
	listener, err := s.connectListener(ctx)
	if err != nil {
		return 0, nil, err
	}
	if err := s.pool.QueryRow(ctx, "SELECT position FROM event_head").Scan(&s.head); err != nil {
		closeConn(listener)
		return 0, nil, fmt.Errorf("read head position: %w", classify(err))
	}
	return version, listener, nil
}

// Close stops listening and closes every connection. It waits for appends
// already under way (their answer is definite: committed or not); an
// append that has not reached the database yet fails with ErrClosed.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.quit)
		s.stop()
		s.bg.Wait()
		s.pool.Close()
		s.log.Info("event store closed", "target", s.target)
	})
	return nil
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

const selectEvent = `SELECT position, event_id, stream_id, stream_version, type, schema_version,
	data, actor, correlation_id, causation_id, recorded_at FROM events `

// ReadStream implements eventstore.Store.
func (s *Store) ReadStream(ctx context.Context, stream string, after int64) ([]eventstore.Event, error) {
	rows, err := s.pool.Query(ctx, selectEvent+
		"WHERE stream_id = $1 AND stream_version > $2 ORDER BY stream_version", stream, after)
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", stream, classify(err))
	}
	evs, err := scanEvents(rows)
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", stream, classify(err))
	}
	return evs, nil
}

// ReadAll implements eventstore.Store. A limit below 1 is ErrInvalidArgument.
func (s *Store) ReadAll(ctx context.Context, after int64, limit int) ([]eventstore.Event, error) {
	if limit < 1 {
		return nil, fmt.Errorf("read events after %d: limit %d: %w", after, limit, errdefs.ErrInvalidArgument)
	}
	rows, err := s.pool.Query(ctx, selectEvent+
		"WHERE position > $1 ORDER BY position LIMIT $2", after, limit)
	if err != nil {
		return nil, fmt.Errorf("read events after %d: %w", after, classifyRead(err))
	}
	evs, err := scanEvents(rows)
	if err != nil {
		return nil, fmt.Errorf("read events after %d: %w", after, classifyRead(err))
	}
	return evs, nil
}

// classifyRead is classify for a read, or a write before its commit, which
// may be tried again whatever became of it: one whose connection was cut
// midway (the server stopped, the network failed) is unavailable too, so
// that followers wait the outage out (eventstore.Subscription) and
// writers try again.
func classifyRead(err error) error {
	err = classify(err)
	var ne net.Error
	if !errors.Is(err, errdefs.ErrUnavailable) && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.As(err, &ne) && !errors.Is(err, context.DeadlineExceeded)) {
		return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	}
	return err
}

// Position implements eventstore.Store.
func (s *Store) Position(ctx context.Context, eventID string) (int64, error) {
	var pos int64
	err := s.pool.QueryRow(ctx, "SELECT position FROM events WHERE event_id = $1", eventID).Scan(&pos)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("find event %s: %w", eventID, errdefs.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("find event %s: %w", eventID, classify(err))
	}
	return pos, nil
}

// WaitFor implements eventstore.Store. It is woken by this store's own
// appends at once, by other servers' through their notifications, and, if
// one is lost, by the head's re-read within recheckEvery. After Close it
// returns ErrClosed.
func (s *Store) WaitFor(ctx context.Context, after int64) error {
	counted := false
	defer func() {
		if counted {
			s.waiting.Add(-1)
		}
	}()
	for {
		s.mu.Lock()
		head, wake := s.head, s.wake
		s.mu.Unlock()
		if head > after {
			return nil
		}
		if !counted {
			s.waiting.Add(1)
			counted = true
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

// advance records that every position up to head is committed, and wakes
// every WaitFor if that moves the head.
func (s *Store) advance(head int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if head <= s.head {
		return
	}
	s.head = head
	close(s.wake)
	s.wake = make(chan struct{})
}

func scanEvents(rows pgx.Rows) ([]eventstore.Event, error) {
	defer rows.Close()
	var evs []eventstore.Event
	for rows.Next() {
		var (
			e    eventstore.Event
			data []byte // nil for NULL
			at   time.Time
		)
		if err := rows.Scan(&e.Position, &e.ID, &e.StreamID, &e.StreamVersion, &e.Type, &e.SchemaVersion,
			&data, &e.Actor, &e.CorrelationID, &e.CausationID, &at); err != nil {
			return nil, fmt.Errorf("scan event: %w", err)
		}
		e.Data = data
		e.RecordedAt = at.UTC()
		evs = append(evs, e)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return evs, nil
}

// logError is for the background goroutines, which have no caller to
// return an error to.
func (s *Store) logError(level slog.Level, msg string, err error) {
	s.log.Log(context.Background(), level, msg, "target", s.target, logkey.Error, err)
}
