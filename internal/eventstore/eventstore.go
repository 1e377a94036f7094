// Package eventstore defines Corral's source of truth: an append-only log of
// events, one stream per task (and per session or workspace), with
// optimistic concurrency on each stream and one global order across all of
// them. Current state is never stored on its own; it is folded from these
// events (package projection).
//
// Events are never changed, and leave the log only when retention
// compacts the stream of a task that ended long ago (Compactor).
//
// This package holds the contract and the store-independent Subscription;
// eventstore/sqlite and eventstore/postgres implement it, and
// eventstore/storetest is the conformance suite every implementation runs.
package eventstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// AnyVersion as the expected version appends whatever the stream's version is.
const AnyVersion int64 = -1

// ErrVersionConflict is returned by Append when the stream's version is not
// the expected one. It is of class errdefs.ErrConflict.
var ErrVersionConflict = fmt.Errorf("stream version conflict: %w", errdefs.ErrConflict)

// Proposed is an event to append: what the caller decides.
type Proposed struct {
	ID            string // optional; the store makes a sortable one when empty
	Type          string
	SchemaVersion int
	Data          json.RawMessage
	Actor         string
	CorrelationID string
	CausationID   string
}

// Event is a committed event: the SPEC §3 envelope plus its global position.
type Event struct {
	ID            string          `json:"event_id"`
	StreamID      string          `json:"stream_id"`
	StreamVersion int64           `json:"stream_version"`
	Type          string          `json:"type"`
	SchemaVersion int             `json:"schema_version"`
	Data          json.RawMessage `json:"data"`
	Actor         string          `json:"actor,omitempty"`
	CorrelationID string          `json:"correlation_id,omitempty"`
	CausationID   string          `json:"causation_id,omitempty"`
	RecordedAt    time.Time       `json:"recorded_at"`
	// Position is the event's place in the global order, starting at 1,
	// in commit order, without gaps but where a compaction removed events
	// (Compactor).
	Position int64 `json:"position"`
}

// CheckAppend refuses an append every store refuses before it looks at
// the log: an empty stream id, an expected version below AnyVersion, no
// events, an event without a type or with data that is not JSON. Errors
// are errdefs.ErrInvalidArgument (a FieldError per bad event, joined).
func CheckAppend(stream string, expected int64, events []Proposed) error {
	if stream == "" {
		return fmt.Errorf("empty stream id: %w", errdefs.ErrInvalidArgument)
	}
	if expected < AnyVersion {
		return fmt.Errorf("expected version %d: %w", expected, errdefs.ErrInvalidArgument)
	}
	if len(events) == 0 {
		return fmt.Errorf("no events: %w", errdefs.ErrInvalidArgument)
	}
	var errs []error
	for i, e := range events {
		if e.Type == "" {
			errs = append(errs, errdefs.Field(fmt.Sprintf("events[%d].type", i), "is empty"))
		}
		if len(e.Data) > 0 && !json.Valid(e.Data) {
			errs = append(errs, errdefs.Field(fmt.Sprintf("events[%d].data", i), "is not valid JSON"))
		}
	}
	return errors.Join(errs...)
}

// Store is an event store. Implementations are safe for concurrent use.
type Store interface {
	// Append adds events to the end of stream atomically: all of them or
	// none. expected is the stream's current version (0 for a new stream) or
	// AnyVersion. A mismatch returns an error wrapping ErrVersionConflict and
	// appends nothing. An empty event list is ErrInvalidArgument. The
	// returned events carry their ids, versions, positions and times. An
	// event's empty CorrelationID and CausationID are filled from ctx's
	// Cause (WithCause), if it has one, with Cause.Stamp, in order, so each later event of
	// the append is caused by the one before it. When Append returns nil the
	// events are durable.
	Append(ctx context.Context, stream string, expected int64, events ...Proposed) ([]Event, error)

	// ReadStream returns the events of stream with a version greater than
	// after, in version order: versions follow one another but where a
	// compaction removed events (Compactor). An unknown stream has no
	// events; that is not an error.
	ReadStream(ctx context.Context, stream string, after int64) ([]Event, error)

	// ReadAll returns up to limit events with a position greater than after,
	// in position order, across all streams.
	ReadAll(ctx context.Context, after int64, limit int) ([]Event, error)

	// Position returns the global position of the event with the given id,
	// or an error wrapping errdefs.ErrNotFound.
	Position(ctx context.Context, eventID string) (int64, error)

	// WaitFor blocks until the store holds an event with a position greater
	// than after, or ctx is done (returning ctx.Err()).
	WaitFor(ctx context.Context, after int64) error

	// Close releases the store. Appends after Close fail.
	Close() error
}

// Subscription delivers every event after a cursor, in position order, live:
// when it has caught up it waits for new appends. It is not safe for
// concurrent use; each subscriber makes its own.
type Subscription struct {
	store Store
	after int64
	batch int
	buf   []Event
}

// Subscribe returns a subscription to every event with a position greater
// than after.
func Subscribe(s Store, after int64) *Subscription {
	return &Subscription{store: s, after: after, batch: 256}
}

// Next returns the next event, blocking until there is one or ctx is done.
// A store that cannot be reached for a while (errdefs.ErrUnavailable: a
// database restarting, a network cut) is read again, every second or
// sooner, until it answers: a follower waits out an outage instead of
// ending.
func (s *Subscription) Next(ctx context.Context) (Event, error) {
	retry := 50 * time.Millisecond
	for len(s.buf) == 0 {
		evs, err := s.store.ReadAll(ctx, s.after, s.batch)
		if errors.Is(err, errdefs.ErrUnavailable) && ctx.Err() == nil {
			select {
			case <-time.After(retry):
			case <-ctx.Done():
				return Event{}, ctx.Err()
			}
			retry = min(2*retry, time.Second)
			continue
		}
		if err != nil {
			return Event{}, err
		}
		if len(evs) > 0 {
			s.buf = evs
			break
		}
		if err := s.store.WaitFor(ctx, s.after); err != nil {
			return Event{}, err
		}
	}
	e := s.buf[0]
	s.buf = s.buf[1:]
	s.after = e.Position
	return e, nil
}

// Cursor returns the position of the last event Next returned.
func (s *Subscription) Cursor() int64 { return s.after }
