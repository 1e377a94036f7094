package postgres

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
)

var _ eventstore.Importer = (*Store)(nil)

// Target names the store's database for messages: its name, host and
// port, never the connection string (which may hold a password).
func (s *Store) Target() string { return s.target }

// Head implements eventstore.Importer: event_head's committed value.
func (s *Store) Head(ctx context.Context) (int64, error) {
	var head int64
	if err := s.pool.QueryRow(ctx, "SELECT position FROM event_head").Scan(&head); err != nil {
		return 0, fmt.Errorf("read the head: %w", classify(err))
	}
	return head, nil
}

// PostgreSQL's timestamptz holds the years 4713 BC to 294276 AD; Go
// counts 4713 BC as year -4712.
const minYear, maxYear = -4712, 294276

// Fit implements eventstore.Importer. What PostgreSQL keeps differs from
// an Event in two ways:
//
//   - recorded_at is kept to the microsecond: Fit truncates it (as pgx's
//     binary encoding would). Events this store appended have microseconds
//     only; SQLite's have nanoseconds, so a copy from SQLite loses their
//     last three digits, and nothing else.
//   - text (every string field, and data, which is json) must be UTF-8
//     without a NUL byte: PostgreSQL refuses anything else, so Fit does,
//     naming the field. SQLite keeps both, and json.Valid (Append's check)
//     lets invalid UTF-8 inside a JSON string through; JSON's escape
//     \u0000 is text and fits (json, unlike jsonb, keeps it as written).
//
// data is json, not jsonb, so its text is kept byte for byte. PostgreSQL's
// json input checks the grammar json.Valid checks (the deepest nesting
// json.Valid takes, 10,000 levels, passes at the default max_stack_depth);
// should it refuse an event's data all the same, Import's error names the
// event's position (copyError).
func (s *Store) Fit(e eventstore.Event) (eventstore.Event, error) {
	if err := eventstore.CheckEvent(e); err != nil {
		return eventstore.Event{}, err
	}
	for _, f := range []struct{ name, text string }{
		{"id", e.ID}, {"stream id", e.StreamID}, {"type", e.Type}, {"actor", e.Actor},
		{"correlation id", e.CorrelationID}, {"causation id", e.CausationID}, {"data", string(e.Data)},
	} {
		var why string
		switch {
		case !utf8.ValidString(f.text):
			why = "is not valid UTF-8"
		case strings.IndexByte(f.text, 0) >= 0:
			why = "holds a NUL byte"
		default:
			continue
		}
		return eventstore.Event{}, fmt.Errorf("event at position %d (id %q): its %s %s, which PostgreSQL cannot store: %w",
			e.Position, e.ID, f.name, why, errdefs.ErrInvalidArgument)
	}
	e.RecordedAt = e.RecordedAt.UTC().Truncate(time.Microsecond)
	if y := e.RecordedAt.Year(); y < minYear || y > maxYear {
		return eventstore.Event{}, fmt.Errorf("event at position %d (id %q): recorded_at %s is outside PostgreSQL's years: %w",
			e.Position, e.ID, e.RecordedAt.Format(time.RFC3339Nano), errdefs.ErrInvalidArgument)
	}
	if len(e.Data) == 0 {
		e.Data = nil // stored as NULL, as Append stores it
	}
	return e, nil
}

// importColumns are the events table's columns in the order Import sends
// them.
var importColumns = []string{"position", "event_id", "stream_id", "stream_version", "type",
	"schema_version", "data", "actor", "correlation_id", "causation_id", "recorded_at"}

// Import implements eventstore.Importer, in one transaction that holds the
// head's row lock, as an append does (the package doc says why), from its
// checks to its commit: the events go in with COPY, event_head moves to
// the last of them, and the other servers are notified, at commit. As for
// Append, the commit runs to its end whatever ctx does.
func (s *Store) Import(ctx context.Context, events []eventstore.Event) error {
	fitted, err := eventstore.FitAll(s.Fit, events)
	if err != nil {
		return err
	}
	if s.isClosed() {
		return fmt.Errorf("import: %w", ErrClosed)
	}
	if err := s.importEvents(ctx, fitted); err != nil {
		if s.isClosed() { // the pool closed under it
			err = fmt.Errorf("%w: %w", ErrClosed, err)
		}
		return fmt.Errorf("import events %d to %d: %w", fitted[0].Position, fitted[len(fitted)-1].Position, err)
	}
	s.advance(fitted[len(fitted)-1].Position)
	return nil
}

func (s *Store) importEvents(ctx context.Context, evs []eventstore.Event) (err error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return fmt.Errorf("begin: %w", classify(err))
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx)) // the error that made us roll back is the one to report
		}
	}()
	// The lock first, so that the versions read next are the latest.
	var head int64
	if err := tx.QueryRow(ctx, "SELECT position FROM event_head FOR UPDATE").Scan(&head); err != nil {
		return fmt.Errorf("lock the head: %w", classify(err))
	}
	versions := make(map[string]int64)
	rows, err := tx.Query(ctx, `SELECT stream_id, MAX(stream_version) FROM events
		WHERE stream_id = ANY($1) GROUP BY stream_id`, eventstore.Streams(evs))
	if err != nil {
		return fmt.Errorf("read stream versions: %w", classify(err))
	}
	for rows.Next() {
		var stream string
		var v int64
		if err := rows.Scan(&stream, &v); err != nil {
			rows.Close()
			return fmt.Errorf("read stream versions: %w", classify(err))
		}
		versions[stream] = v
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read stream versions: %w", classify(err))
	}
	if err := eventstore.CheckImport(head, versions, evs); err != nil {
		return err
	}

	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"events"}, importColumns, pgx.CopyFromSlice(len(evs), func(i int) ([]any, error) {
		e := evs[i]
		var data any // NULL for no data
		if len(e.Data) > 0 {
			data = string(e.Data)
		}
		return []any{e.Position, e.ID, e.StreamID, e.StreamVersion, e.Type, e.SchemaVersion,
			data, e.Actor, e.CorrelationID, e.CausationID, e.RecordedAt}, nil
	})); err != nil {
		return copyError(evs, err)
	}
	last := evs[len(evs)-1].Position
	b := &pgx.Batch{}
	b.Queue("UPDATE event_head SET position = $1", last)
	b.Queue("SELECT pg_notify($1, $2)", s.channel, strconv.FormatInt(last, 10))
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("move the head to %d: %w", last, classify(err))
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), queryTimeout)
	defer cancel()
	if err := tx.Commit(cctx); err != nil {
		return fmt.Errorf("commit: %w", classify(err))
	}
	return nil
}

// copyLine finds the row a COPY error is about in its context ("COPY
// events, line 3, column data"): rows count from 1.
var copyLine = regexp.MustCompile(`^COPY [^,]+, line (\d+)`)

// copyError names the event a failed COPY stopped at, when PostgreSQL
// says which row it was, and gives a unique violation its class.
func copyError(evs []eventstore.Event, err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return fmt.Errorf("copy events: %w", classify(err))
	}
	what := "copy events"
	if m := copyLine.FindStringSubmatch(pe.Where); m != nil {
		if n, aerr := strconv.Atoi(m[1]); aerr == nil && n >= 1 && n <= len(evs) {
			what = fmt.Sprintf("copy the event at position %d (id %q)", evs[n-1].Position, evs[n-1].ID)
		}
	}
	if pe.Code == "23505" { // unique_violation
		switch pe.ConstraintName {
		case eventIDKey: // pe.Detail: "Key (event_id)=(...) already exists."
			return fmt.Errorf("%s: the event id is in the store already (%s): %w", what, pe.Detail, errdefs.ErrAlreadyExists)
		case streamVersionKey:
			return fmt.Errorf("%s: the stream version is taken (%s): %w", what, pe.Detail, errdefs.ErrConflict)
		}
	}
	return fmt.Errorf("%s: %w", what, classify(err))
}
