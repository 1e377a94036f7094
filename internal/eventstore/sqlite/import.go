package sqlite

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"

	sqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

var _ eventstore.Importer = (*Store)(nil)

// importReq is one Import call waiting for the writer goroutine, which
// commits it alone, between two batches of appends: like them it must be
// the only writer, so that the head and the stream versions it checks
// stay as they are until it commits.
type importReq struct {
	ctx    context.Context
	events []eventstore.Event // as Fit returned them
	res    chan error         // buffered 1; the writer sends exactly once
}

// Head implements eventstore.Importer: the writer's last committed
// position, which no other process can move (the lock file).
func (s *Store) Head(ctx context.Context) (int64, error) {
	if s.isClosed() {
		return 0, fmt.Errorf("read the head: %w", ErrClosed)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.head, nil
}

// Fit implements eventstore.Importer. SQLite keeps every field of an event
// as it is: text as Go holds it (NUL bytes and invalid UTF-8 included),
// recorded_at to the nanosecond in UTC. The one limit is recorded_at's
// year, 1 to 9999, which the fixed-width text form (timeFormat) needs to
// sort as time does.
func (s *Store) Fit(e eventstore.Event) (eventstore.Event, error) {
	if err := eventstore.CheckEvent(e); err != nil {
		return eventstore.Event{}, err
	}
	e.RecordedAt = e.RecordedAt.UTC()
	if y := e.RecordedAt.Year(); y < 1 || y > 9999 {
		return eventstore.Event{}, fmt.Errorf("event at position %d (id %q): recorded_at %s is not in the years 1 to 9999: %w",
			e.Position, e.ID, e.RecordedAt.Format(time.RFC3339Nano), errdefs.ErrInvalidArgument)
	}
	if len(e.Data) == 0 {
		e.Data = nil // stored as NULL, as Append stores it
	}
	return e, nil
}

// Import implements eventstore.Importer, in one transaction of the writer
// goroutine (one fsync however many events). A ctx done before the
// writer takes the request, or during its transaction, fails the import
// and writes nothing.
func (s *Store) Import(ctx context.Context, events []eventstore.Event) error {
	fitted, err := eventstore.FitAll(s.Fit, events)
	if err != nil {
		return err
	}
	r := &importReq{ctx: ctx, events: fitted, res: make(chan error, 1)}
	select {
	case <-s.quit:
		return fmt.Errorf("import: %w", ErrClosed)
	default:
	}
	select {
	case s.imports <- r:
	case <-s.quit:
		return fmt.Errorf("import: %w", ErrClosed)
	case <-ctx.Done():
		return fmt.Errorf("import: %w", ctx.Err())
	}
	return <-r.res
}

// commitImport is the writer goroutine's part of Import: it commits r and
// publishes its events as it publishes an append's.
func (s *Store) commitImport(r *importReq) {
	start := time.Now()
	err := s.writeImport(r.ctx, r.events)
	took := time.Since(start)
	if err != nil {
		err = classify(err)
		s.releaseReserve(err)
		r.res <- fmt.Errorf("import events %d to %d: %w", r.events[0].Position, r.events[len(r.events)-1].Position, err)
		return
	}
	head := r.events[len(r.events)-1].Position
	s.w.head = head
	s.published(head, r.events, took)
	s.retryReserve()
	r.res <- nil
}

// writeImport checks evs against the head and the stream versions and
// inserts them, in one transaction under ctx.
func (s *Store) writeImport(ctx context.Context, evs []eventstore.Event) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	tx, err := s.wdb.BeginTx(ctx, nil) // BEGIN IMMEDIATE, as for appends
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback() // the error that made us roll back is the one to report
		}
	}()
	versionStmt := tx.StmtContext(ctx, s.w.version)
	versions := make(map[string]int64)
	for _, stream := range eventstore.Streams(evs) {
		var v int64
		if err := versionStmt.QueryRowContext(ctx, stream).Scan(&v); err != nil {
			return fmt.Errorf("read version of stream %s: %w", stream, err)
		}
		versions[stream] = v
	}
	if err := eventstore.CheckImport(s.w.head, versions, evs); err != nil {
		return err
	}
	insertStmt := tx.StmtContext(ctx, s.w.insert)
	for _, e := range evs {
		var data any // NULL for no data
		if len(e.Data) > 0 {
			data = string(e.Data)
		}
		if _, err := insertStmt.ExecContext(ctx, e.Position, e.ID, e.StreamID, e.StreamVersion, e.Type, e.SchemaVersion,
			data, e.Actor, e.CorrelationID, e.CausationID, e.RecordedAt.Format(timeFormat)); err != nil {
			var se *sqlite.Error
			if errors.As(err, &se) && se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE {
				// Positions and versions were checked above: the event id.
				return fmt.Errorf("event at position %d: event id %s is in the store already: %w", e.Position, e.ID, errdefs.ErrAlreadyExists)
			}
			return fmt.Errorf("insert event at position %d: %w", e.Position, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}
