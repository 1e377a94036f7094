package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"

	sqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// maxBatch bounds how many appends share one transaction. A batch costs one
// fsync however large it is; the bound only keeps one slow batch from
// holding many callers (256 small appends commit in a few milliseconds).
const maxBatch = 256

// appendReq is one Append call waiting for the writer.
type appendReq struct {
	ctx      context.Context
	stream   string
	expected int64
	events   []eventstore.Proposed
	res      chan appendRes // buffered 1; the writer sends exactly once
}

type appendRes struct {
	events []eventstore.Event
	err    error
}

// writer is the state the writer goroutine owns: its prepared statements and
// the last committed position.
type writer struct {
	version *sql.Stmt // current version of a stream
	insert  *sql.Stmt
	head    int64
}

func (w *writer) prepare(ctx context.Context, db *sql.DB) error {
	var err error
	w.version, err = db.PrepareContext(ctx,
		"SELECT COALESCE(MAX(stream_version), 0) FROM events WHERE stream_id = ?")
	if err != nil {
		return fmt.Errorf("prepare version query: %w", err)
	}
	w.insert, err = db.PrepareContext(ctx, `INSERT INTO events (position, event_id, stream_id, stream_version,
		type, schema_version, data, actor, correlation_id, causation_id, recorded_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	if err != nil {
		return fmt.Errorf("prepare insert: %w", err)
	}
	return nil
}

func (w *writer) close() error {
	var errs []error
	for _, st := range []*sql.Stmt{w.version, w.insert} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}

// Append implements eventstore.Store. The request is handed to the writer
// goroutine, which commits it together with every other pending append in
// one transaction. A ctx done before the writer takes the request fails the
// append; once taken, Append waits for the (short) commit so its answer is
// always definite. A duplicate caller-supplied event id is
// errdefs.ErrAlreadyExists.
func (s *Store) Append(ctx context.Context, stream string, expected int64, events ...eventstore.Proposed) ([]eventstore.Event, error) {
	if err := eventstore.CheckAppend(stream, expected, events); err != nil {
		return nil, fmt.Errorf("append to stream %s: %w", stream, err)
	}
	r := &appendReq{ctx: ctx, stream: stream, expected: expected, events: events, res: make(chan appendRes, 1)}
	select {
	case <-s.quit:
		return nil, fmt.Errorf("append to stream %s: %w", stream, ErrClosed)
	default:
	}
	select {
	case s.reqs <- r:
	case <-s.quit:
		return nil, fmt.Errorf("append to stream %s: %w", stream, ErrClosed)
	case <-ctx.Done():
		return nil, fmt.Errorf("append to stream %s: %w", stream, ctx.Err())
	}
	res := <-r.res
	return res.events, res.err
}

// classify gives SQLite's "database or disk is full" its class, so that a
// caller can say the disk is full instead of failing with no reason. The
// store takes appends again once there is space: the failed transaction
// was rolled back whole.
func classify(err error) error {
	var se *sqlite.Error
	if errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_FULL {
		return fmt.Errorf("%w: %w", errdefs.ErrNoSpace, err)
	}
	return err
}

// runWriter is the writer goroutine: it takes one request, drains every
// other request already waiting (up to maxBatch), commits them in one
// transaction and answers each caller. It returns when the store closes.
func (s *Store) runWriter() {
	defer close(s.writerDone)
	batch := make([]*appendReq, 0, maxBatch)
	for {
		select { // a closing store takes no new batch even if requests wait
		case <-s.quit:
			return
		default:
		}
		select {
		case r := <-s.reqs:
			batch = append(batch[:0], r)
		case r := <-s.imports: // alone, between two batches (import.go)
			s.commitImport(r)
			continue
		case r := <-s.compacts: // the same (compact.go)
			s.commitCompact(r)
			continue
		case <-s.quit:
			return
		}
	drain:
		for len(batch) < maxBatch {
			select {
			case r := <-s.reqs:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		s.commitBatch(batch)
		clear(batch)
	}
}

// commitBatch writes batch in one transaction. Each request is checked
// against the stream versions as the batch has left them, so two requests
// on one stream are checked in order; a request that fails (version
// conflict, duplicate event id, cancelled caller) writes nothing and fails
// alone. If the transaction itself fails, every request in it fails.
func (s *Store) commitBatch(batch []*appendReq) {
	results := make([]appendRes, len(batch))
	start := time.Now()
	head, err := s.writeBatch(batch, results)
	took := time.Since(start)
	if err != nil {
		err = fmt.Errorf("commit %d appends: %w", len(batch), classify(err))
		s.releaseReserve(err)
		for i := range results {
			if results[i].err == nil {
				results[i] = appendRes{err: fmt.Errorf("append to stream %s: %w", batch[i].stream, err)}
			}
		}
	} else if head != s.w.head {
		s.w.head = head
		var evs []eventstore.Event // in position order: the batch's order
		for _, r := range results {
			evs = append(evs, r.events...)
		}
		s.published(head, evs, took)
		s.retryReserve()
	}
	for i, r := range batch {
		r.res <- results[i]
	}
}

// writeBatch fills results for each request and returns the new head.
func (s *Store) writeBatch(batch []*appendReq, results []appendRes) (head int64, err error) {
	// The writer's own context: a caller's cancellation must not abort a
	// transaction that carries other callers' appends.
	ctx := context.Background()
	// BEGIN IMMEDIATE (the DSN's _txlock): the write lock is taken at once,
	// so the transaction never fails to upgrade a read lock halfway.
	tx, err := s.wdb.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback() // the error that made us roll back is the one to report
		}
	}()
	versionStmt := tx.StmtContext(ctx, s.w.version)
	insertStmt := tx.StmtContext(ctx, s.w.insert)

	now := time.Now().UTC()
	at := now.Format(timeFormat)
	head = s.w.head
	versions := make(map[string]int64) // stream -> version as this batch has left it
	written := 0
	for i, r := range batch {
		if err := r.ctx.Err(); err != nil {
			results[i].err = fmt.Errorf("append to stream %s: %w", r.stream, err)
			continue
		}
		cur, ok := versions[r.stream]
		if !ok {
			if err := versionStmt.QueryRowContext(ctx, r.stream).Scan(&cur); err != nil {
				return 0, fmt.Errorf("read version of stream %s: %w", r.stream, err)
			}
			versions[r.stream] = cur
		}
		if r.expected != eventstore.AnyVersion && r.expected != cur {
			results[i].err = fmt.Errorf("append to stream %s: expected version %d, stream is at %d: %w",
				r.stream, r.expected, cur, eventstore.ErrVersionConflict)
			continue
		}
		evs, err := insertRequest(ctx, tx, insertStmt, r, cur, head, now, at)
		if errors.Is(err, errdefs.ErrAlreadyExists) {
			results[i].err = err
			continue
		}
		if err != nil {
			// Not a constraint of this request alone (I/O, disk full): the
			// transaction cannot be trusted to commit the rest.
			return 0, err
		}
		versions[r.stream] = cur + int64(len(evs))
		head += int64(len(evs))
		results[i].events = evs
		written++
	}
	if written == 0 {
		if err := tx.Rollback(); err != nil {
			return 0, fmt.Errorf("roll back: %w", err)
		}
		return s.w.head, nil
	}
	if err := tx.Commit(); err != nil {
		// After a failed COMMIT, SQLite has rolled back (or will on the
		// next open); nothing in this batch is durable.
		return 0, fmt.Errorf("commit: %w", err)
	}
	return head, nil
}

// insertRequest inserts r's events. Only a caller-chosen event id can
// violate a constraint (versions and positions come from the single writer,
// generated ids are new), so only such a request pays for a savepoint, which
// lets it fail alone with ErrAlreadyExists; about 2 statements fewer per
// append otherwise.
func insertRequest(ctx context.Context, tx *sql.Tx, st *sql.Stmt, r *appendReq, cur, head int64, now time.Time, at string) ([]eventstore.Event, error) {
	chosen := false
	for _, p := range r.events {
		chosen = chosen || p.ID != ""
	}
	if !chosen {
		return insertEvents(ctx, st, r, cur, head, now, at)
	}
	if _, err := tx.ExecContext(ctx, "SAVEPOINT req"); err != nil {
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	evs, ierr := insertEvents(ctx, st, r, cur, head, now, at)
	if ierr != nil {
		if _, err := tx.ExecContext(ctx, "ROLLBACK TO req"); err != nil {
			return nil, fmt.Errorf("roll back append to stream %s: %w", r.stream, errors.Join(ierr, err))
		}
	}
	if _, err := tx.ExecContext(ctx, "RELEASE req"); err != nil {
		// Not ierr's class: the transaction is broken, not just this request.
		return nil, fmt.Errorf("release savepoint after %v: %w", ierr, err)
	}
	return evs, ierr
}

// insertEvents inserts r's events after stream version cur and global
// position head.
func insertEvents(ctx context.Context, st *sql.Stmt, r *appendReq, cur, head int64, now time.Time, at string) ([]eventstore.Event, error) {
	// Ids made here, in commit order, so generated ids sort like positions.
	evs := eventstore.Committed(r.ctx, r.stream, cur, head, now, r.events)
	for _, e := range evs {
		var data any // NULL for no data
		if len(e.Data) > 0 {
			data = string(e.Data)
		}
		if _, err := st.ExecContext(ctx, e.Position, e.ID, e.StreamID, e.StreamVersion, e.Type, e.SchemaVersion,
			data, e.Actor, e.CorrelationID, e.CausationID, at); err != nil {
			var se *sqlite.Error
			if errors.As(err, &se) && se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE {
				// (stream_id, stream_version) and position cannot collide
				// under the single writer, so this is the event id.
				return nil, fmt.Errorf("append to stream %s: event id %s: %w", r.stream, e.ID, errdefs.ErrAlreadyExists)
			}
			return nil, fmt.Errorf("insert event %s into stream %s: %w", e.ID, r.stream, err)
		}
	}
	return evs, nil
}
