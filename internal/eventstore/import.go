package eventstore

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Importer is implemented by stores that take events committed in another
// store as they are: ids, stream versions, positions, causes and
// recorded_at kept, not made anew as Append makes them. It is how a log
// moves from one store to another (package storecopy). A store that
// cannot do it simply does not implement it.
//
// Import only ever extends the log at its end, so a copy can go in
// batches and, after an interruption, go on from the target's head; a
// batch that does not go on from where the log is is refused whole. The
// log may have gaps, where retention compacted streams (Compactor): the
// copy keeps them.
type Importer interface {
	Store

	// Head returns the highest committed position: 0 for an empty store.
	Head(ctx context.Context) (int64, error)

	// Fit returns e as the store would keep it, or an error of class
	// errdefs.ErrInvalidArgument that names e's position and says why the
	// store cannot hold it at all. A store whose columns keep less than an
	// Event holds (PostgreSQL keeps recorded_at to the microsecond) says
	// so here, and nowhere else: what Import stores of e is what Fit
	// returns, and what a read returns afterwards. It changes nothing and
	// does no I/O, so a copy can check a whole log before it writes.
	Fit(e Event) (Event, error)

	// Import commits events at the end of the log, atomically: all of them
	// or none. Their positions must rise from past head, Head's answer
	// when the batch commits, and each stream's versions must rise from
	// past the stream's version in the store (0 for a stream it does not
	// have): one after the other, but where the source's log has a gap
	// (Compactor). A batch that starts at or below head, or whose first
	// event of a stream is at or below the stream's last version, is
	// errdefs.ErrConflict (the store is not where the caller thinks:
	// another writer appended, or it holds another log); a batch whose
	// positions or versions do not rise in itself, empty or holding an
	// event Fit refuses is errdefs.ErrInvalidArgument; an event id the
	// store holds already is errdefs.ErrAlreadyExists. Import serializes
	// with Append, wakes WaitFor as an append does, and is durable when it
	// returns nil. Safe for concurrent use, but meant for a store nothing
	// else writes to.
	Import(ctx context.Context, events []Event) error
}

// FitAll is the first step of every store's Import: each of events as
// fit keeps it, or the first refusal; no events at all is
// errdefs.ErrInvalidArgument.
func FitAll(fit func(Event) (Event, error), events []Event) ([]Event, error) {
	if len(events) == 0 {
		return nil, fmt.Errorf("import: no events: %w", errdefs.ErrInvalidArgument)
	}
	fitted := make([]Event, len(events))
	for i, e := range events {
		f, err := fit(e)
		if err != nil {
			return nil, fmt.Errorf("import: %w", err)
		}
		fitted[i] = f
	}
	return fitted, nil
}

// CheckEvent refuses a committed event no store can keep: one without an
// id, a stream, a type, a position or version of at least 1, or a time, or
// whose data is not JSON. Errors are errdefs.ErrInvalidArgument and name
// the event's position. Stores' Fit calls it first.
func CheckEvent(e Event) error {
	var why string
	switch {
	case e.Position < 1:
		why = "its position is below 1"
	case e.ID == "":
		why = "it has no id"
	case e.StreamID == "":
		why = "it has no stream id"
	case e.StreamVersion < 1:
		why = fmt.Sprintf("its stream version %d is below 1", e.StreamVersion)
	case e.Type == "":
		why = "it has no type"
	case e.RecordedAt.IsZero():
		why = "it has no recorded_at"
	case len(e.Data) > 0 && !json.Valid(e.Data):
		why = "its data is not valid JSON"
	default:
		return nil
	}
	return fmt.Errorf("event at position %d (id %q): %s: %w", e.Position, e.ID, why, errdefs.ErrInvalidArgument)
}

// CheckImport checks that events go on from a log whose head is head and
// whose streams are at versions (a stream missing from it has none yet),
// with the classes Importer.Import documents. Stores call it under the
// lock that keeps their head and versions still until they commit.
func CheckImport(head int64, versions map[string]int64, events []Event) error {
	if len(events) == 0 {
		return fmt.Errorf("import: no events: %w", errdefs.ErrInvalidArgument)
	}
	if p := events[0].Position; p <= head {
		return fmt.Errorf("import events from position %d: the store's head is %d, so the next event must be past it: %w",
			p, head, errdefs.ErrConflict)
	}
	last := make(map[string]int64) // stream -> the version of its last event in the batch
	for i, e := range events {
		if i > 0 && e.Position <= events[i-1].Position {
			return fmt.Errorf("import: event %s is at position %d after %d: positions must rise: %w",
				e.ID, e.Position, events[i-1].Position, errdefs.ErrInvalidArgument)
		}
		prev, seen := last[e.StreamID]
		if !seen {
			prev = versions[e.StreamID]
		}
		if e.StreamVersion <= prev {
			class := errdefs.ErrInvalidArgument // versions going back within the batch
			if !seen {
				class = errdefs.ErrConflict // the store's stream is past it
			}
			return fmt.Errorf("import: event at position %d is version %d of stream %s, which must go on past version %d: %w",
				e.Position, e.StreamVersion, e.StreamID, prev, class)
		}
		last[e.StreamID] = e.StreamVersion
	}
	return nil
}

// Streams returns the stream ids of events, each once, in the order they
// first appear: the streams whose versions a store reads for CheckImport.
func Streams(events []Event) []string {
	seen := make(map[string]bool)
	var out []string
	for _, e := range events {
		if !seen[e.StreamID] {
			seen[e.StreamID] = true
			out = append(out, e.StreamID)
		}
	}
	return out
}
