package sqlite

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
)

var _ eventstore.Compactor = (*Store)(nil)

// compactReq is one Compact call waiting for the writer goroutine, which
// commits it alone, between two batches of appends, as it does an import.
type compactReq struct {
	ctx      context.Context
	stream   string
	expected int64
	types    []string
	marker   eventstore.Proposed
	res      chan compactRes // buffered 1; the writer sends exactly once
}

type compactRes struct {
	marker  eventstore.Event
	removed int
	err     error
}

// Compact implements eventstore.Compactor, in one transaction of the
// writer goroutine. A ctx done before the writer takes the request fails
// it and changes nothing.
func (s *Store) Compact(ctx context.Context, stream string, expected int64, types []string, marker eventstore.Proposed) (eventstore.Event, int, error) {
	if err := eventstore.CheckCompact(stream, expected, types, marker); err != nil {
		return eventstore.Event{}, 0, fmt.Errorf("compact stream %s: %w", stream, err)
	}
	r := &compactReq{ctx: ctx, stream: stream, expected: expected, types: types, marker: marker, res: make(chan compactRes, 1)}
	select {
	case <-s.quit:
		return eventstore.Event{}, 0, fmt.Errorf("compact stream %s: %w", stream, ErrClosed)
	default:
	}
	select {
	case s.compacts <- r:
	case <-s.quit:
		return eventstore.Event{}, 0, fmt.Errorf("compact stream %s: %w", stream, ErrClosed)
	case <-ctx.Done():
		return eventstore.Event{}, 0, fmt.Errorf("compact stream %s: %w", stream, ctx.Err())
	}
	res := <-r.res
	return res.marker, res.removed, res.err
}

// commitCompact is the writer goroutine's part of Compact. The tail of
// recent events may hold some it removed: it starts again from the
// marker, and readers further back read SQLite.
func (s *Store) commitCompact(r *compactReq) {
	start := time.Now()
	marker, removed, err := s.writeCompact(r)
	took := time.Since(start)
	if err != nil {
		err = classify(err)
		s.releaseReserve(err)
		r.res <- compactRes{err: fmt.Errorf("compact stream %s: %w", r.stream, err)}
		return
	}
	s.w.head = marker.Position
	s.mu.Lock()
	s.recent = recent{}
	s.mu.Unlock()
	s.published(marker.Position, []eventstore.Event{marker}, took)
	s.retryReserve()
	r.res <- compactRes{marker: marker, removed: removed}
}

// writeCompact checks r's stream version, removes its events of r's
// types and inserts the marker after its last, in one transaction.
func (s *Store) writeCompact(r *compactReq) (marker eventstore.Event, removed int, err error) {
	if err := r.ctx.Err(); err != nil {
		return marker, 0, err
	}
	ctx := context.Background() // as for a batch: the transaction runs to its end
	tx, err := s.wdb.BeginTx(ctx, nil)
	if err != nil {
		return marker, 0, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback() // the error that made us roll back is the one to report
		}
	}()
	// The version before the removal: the stream's last event may be one
	// it removes, and the marker goes after it all the same.
	var cur int64
	if err := tx.StmtContext(ctx, s.w.version).QueryRowContext(ctx, r.stream).Scan(&cur); err != nil {
		return marker, 0, fmt.Errorf("read version: %w", err)
	}
	if cur != r.expected {
		return marker, 0, fmt.Errorf("expected version %d, stream is at %d: %w", r.expected, cur, eventstore.ErrVersionConflict)
	}
	args := []any{r.stream}
	for _, t := range r.types {
		args = append(args, t)
	}
	res, err := tx.ExecContext(ctx, "DELETE FROM events WHERE stream_id = ? AND type IN (?"+strings.Repeat(", ?", len(r.types)-1)+")", args...)
	if err != nil {
		return marker, 0, fmt.Errorf("remove events: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return marker, 0, fmt.Errorf("remove events: %w", err)
	}
	now := time.Now().UTC()
	evs, err := insertEvents(ctx, tx.StmtContext(ctx, s.w.insert), &appendReq{ctx: r.ctx, stream: r.stream, events: []eventstore.Proposed{r.marker}},
		cur, s.w.head, now, now.Format(timeFormat))
	if err != nil {
		return marker, 0, err
	}
	if err := tx.Commit(); err != nil {
		return marker, 0, fmt.Errorf("commit: %w", err)
	}
	return evs[0], int(n), nil
}
