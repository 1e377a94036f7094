package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
)

// The unique constraints of migrations/0001_events.sql, by name.
const (
	streamVersionKey = "events_stream_version_key"
	eventIDKey       = "events_event_id_key"
)

const insertEvent = `INSERT INTO events (position, event_id, stream_id, stream_version, type,
	schema_version, data, actor, correlation_id, causation_id, recorded_at)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`

// Append implements eventstore.Store, in one transaction that holds the
// head's row lock from its version check to its commit (the package doc
// says why). A ctx done before the commit fails the append and writes
// nothing; the commit itself runs to its end whatever ctx does, so that a
// nil error always means durable and an error of the store's own means
// nothing written (a connection lost during the commit leaves it unknown,
// as with any database). A duplicate caller-supplied event id is
// errdefs.ErrAlreadyExists.
func (s *Store) Append(ctx context.Context, stream string, expected int64, events ...eventstore.Proposed) ([]eventstore.Event, error) {
	if err := eventstore.CheckAppend(stream, expected, events); err != nil {
		return nil, fmt.Errorf("append to stream %s: %w", stream, err)
	}
	if s.isClosed() {
		return nil, fmt.Errorf("append to stream %s: %w", stream, ErrClosed)
	}
	evs, err := s.append(ctx, stream, expected, events)
	if err != nil {
		if s.isClosed() { // the pool closed under it
			err = fmt.Errorf("%w: %w", ErrClosed, err)
		}
		return nil, fmt.Errorf("append to stream %s: %w", stream, err)
	}
	s.advance(evs[len(evs)-1].Position)
	return evs, nil
}

func (s *Store) append(ctx context.Context, stream string, expected int64, proposed []eventstore.Proposed) (evs []eventstore.Event, err error) {
	// Read committed, whatever the database's default: each statement then
	// sees what committed before it started, so the version read after
	// the lock is the stream's latest. (Under repeatable read the UPDATE
	// would fail on a head another append moved.)
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("begin: %w", classifyRead(err))
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx)) // the error that made us roll back is the one to report
		}
	}()

	// Until the commit nothing is committed: a cut connection on the way
	// is Unavailable, to be tried again, as a read's is (classifyRead);
	// one at the commit may have committed, and says so only by its error.

	// One round trip: take the lock and the positions, then read the
	// version, in that order (each statement of a batch starts after the
	// one before it has finished).
	var (
		head, cur int64
		now       time.Time
		n         = int64(len(proposed))
	)
	b := &pgx.Batch{}
	b.Queue("UPDATE event_head SET position = position + $1 RETURNING position, clock_timestamp()", n).
		QueryRow(func(r pgx.Row) error { return r.Scan(&head, &now) })
	b.Queue("SELECT COALESCE(MAX(stream_version), 0) FROM events WHERE stream_id = $1", stream).
		QueryRow(func(r pgx.Row) error { return r.Scan(&cur) })
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("take positions and read the version of stream %s: %w", stream, classifyRead(err))
	}
	if expected != eventstore.AnyVersion && expected != cur {
		return nil, fmt.Errorf("expected version %d, stream is at %d: %w", expected, cur, eventstore.ErrVersionConflict)
	}

	// Ids made here, under the lock, so generated ids sort like positions
	// (across servers as far as their clocks agree).
	now = now.UTC()
	evs = eventstore.Committed(ctx, stream, cur, head-n, now, proposed)
	b = &pgx.Batch{}
	for _, e := range evs {
		var data any // NULL for no data
		if len(e.Data) > 0 {
			data = string(e.Data)
		}
		b.Queue(insertEvent, e.Position, e.ID, e.StreamID, e.StreamVersion, e.Type, e.SchemaVersion,
			data, e.Actor, e.CorrelationID, e.CausationID, now)
	}
	b.Queue("SELECT pg_notify($1, $2)", s.channel, strconv.FormatInt(head, 10))
	br := tx.SendBatch(ctx, b)
	for _, e := range evs {
		if _, err := br.Exec(); err != nil {
			_ = br.Close() // err says what went wrong
			return nil, insertError(e, err)
		}
	}
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("notify: %w", classifyRead(err))
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("insert events: %w", classifyRead(err))
	}

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), queryTimeout)
	defer cancel()
	if err := tx.Commit(cctx); err != nil {
		return nil, fmt.Errorf("commit: %w", classify(err))
	}
	return evs, nil
}

// insertError says which of the unique constraints e's insert broke, if one
// did.
func insertError(e eventstore.Event, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" { // unique_violation
		switch pe.ConstraintName {
		case streamVersionKey:
			// Every append reads its version under the head's lock, so
			// only a write that skipped the lock gets here; the
			// constraint has the last word on a version all the same.
			return fmt.Errorf("stream version %d is taken: %w", e.StreamVersion, eventstore.ErrVersionConflict)
		case eventIDKey:
			return fmt.Errorf("event id %s: %w", e.ID, errdefs.ErrAlreadyExists)
		}
	}
	return fmt.Errorf("insert event %s: %w", e.ID, classify(err))
}

// classify gives PostgreSQL's errors the classes a caller acts on: a server
// out of reach or shutting down is errdefs.ErrUnavailable, a full disk
// errdefs.ErrNoSpace, and text the database cannot hold (a NUL byte, bytes
// not in its encoding) errdefs.ErrInvalidArgument. A done context is left
// as it is.
func classify(err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "53100": // disk_full
			return fmt.Errorf("%w: %w", errdefs.ErrNoSpace, err)
		case strings.HasPrefix(pe.Code, "22"): // data_exception
			return fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
		case strings.HasPrefix(pe.Code, "08"), // connection_exception
			strings.HasPrefix(pe.Code, "57P"), // admin_shutdown, crash_shutdown, cannot_connect_now, ...
			pe.Code == "53300":                // too_many_connections
			return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
		}
		return err
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) || pgconn.SafeToRetry(err) {
		return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	}
	return err
}
