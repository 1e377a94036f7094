package postgres

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/corral-dev/corral/internal/eventstore"
)

var _ eventstore.Compactor = (*Store)(nil)

// Compact implements eventstore.Compactor, in one transaction. The
// removal goes first, before the transaction takes the head's row lock,
// so that appends, which need that lock, wait for the marker's insert and
// the commit only, not for the removal of a long stream's events; an
// append to the stream meanwhile, whether the removal took its event or
// not, undoes it all (ErrVersionConflict). As for Append, the commit runs to its end
// whatever ctx does.
func (s *Store) Compact(ctx context.Context, stream string, expected int64, types []string, marker eventstore.Proposed) (eventstore.Event, int, error) {
	if err := eventstore.CheckCompact(stream, expected, types, marker); err != nil {
		return eventstore.Event{}, 0, fmt.Errorf("compact stream %s: %w", stream, err)
	}
	if s.isClosed() {
		return eventstore.Event{}, 0, fmt.Errorf("compact stream %s: %w", stream, ErrClosed)
	}
	e, removed, err := s.compact(ctx, stream, expected, types, marker)
	if err != nil {
		if s.isClosed() { // the pool closed under it
			err = fmt.Errorf("%w: %w", ErrClosed, err)
		}
		return eventstore.Event{}, 0, fmt.Errorf("compact stream %s: %w", stream, err)
	}
	s.advance(e.Position)
	return e, removed, nil
}

func (s *Store) compact(ctx context.Context, stream string, expected int64, types []string, marker eventstore.Proposed) (e eventstore.Event, removed int, err error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return e, 0, fmt.Errorf("begin: %w", classifyRead(err))
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx)) // the error that made us roll back is the one to report
		}
	}()
	const version = "SELECT COALESCE(MAX(stream_version), 0) FROM events WHERE stream_id = $1"
	var cur int64
	if err := tx.QueryRow(ctx, version, stream).Scan(&cur); err != nil {
		return e, 0, fmt.Errorf("read the version: %w", classifyRead(err))
	}
	if cur != expected {
		return e, 0, fmt.Errorf("expected version %d, stream is at %d: %w", expected, cur, eventstore.ErrVersionConflict)
	}
	// An append that committed since the version was read may be among
	// what the removal takes: its version, past expected, says so.
	var newest int64
	if err := tx.QueryRow(ctx, `WITH removed AS (DELETE FROM events WHERE stream_id = $1 AND type = ANY($2) RETURNING stream_version)
		SELECT count(*), COALESCE(MAX(stream_version), 0) FROM removed`, stream, types).Scan(&removed, &newest); err != nil {
		return e, 0, fmt.Errorf("remove events: %w", classifyRead(err))
	}
	if newest > expected {
		return e, 0, fmt.Errorf("expected version %d, an append took the stream to %d meanwhile: %w", expected, newest, eventstore.ErrVersionConflict)
	}

	// Under the lock: the positions, and whether anything the removal did
	// not take was appended to the stream since its version was read (what
	// the removal left of it is at or below that version).
	var (
		head, last int64
		now        time.Time
	)
	b := &pgx.Batch{}
	b.Queue("UPDATE event_head SET position = position + 1 RETURNING position, clock_timestamp()").
		QueryRow(func(r pgx.Row) error { return r.Scan(&head, &now) })
	b.Queue(version, stream).QueryRow(func(r pgx.Row) error { return r.Scan(&last) })
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return e, 0, fmt.Errorf("take a position and read the version again: %w", classifyRead(err))
	}
	if last > expected {
		return e, 0, fmt.Errorf("expected version %d, an append took the stream to %d meanwhile: %w", expected, last, eventstore.ErrVersionConflict)
	}

	now = now.UTC()
	e = eventstore.Committed(ctx, stream, expected, head-1, now, []eventstore.Proposed{marker})[0]
	var data any // NULL for no data
	if len(e.Data) > 0 {
		data = string(e.Data)
	}
	b = &pgx.Batch{}
	b.Queue(insertEvent, e.Position, e.ID, e.StreamID, e.StreamVersion, e.Type, e.SchemaVersion,
		data, e.Actor, e.CorrelationID, e.CausationID, now)
	b.Queue("SELECT pg_notify($1, $2)", s.channel, strconv.FormatInt(head, 10))
	br := tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close() // err says what went wrong
		return e, 0, insertError(e, err)
	}
	if err := br.Close(); err != nil {
		return e, 0, fmt.Errorf("insert the marker: %w", classifyRead(err))
	}

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), queryTimeout)
	defer cancel()
	if err := tx.Commit(cctx); err != nil {
		return e, 0, fmt.Errorf("commit: %w", classify(err))
	}
	return e, removed, nil
}
