package eventstore

import (
	"context"
	"fmt"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Compactor is implemented by stores that can compact a stream: remove
// the events of it nobody needs any more (retention's, of a task that
// ended long ago) and say so with a marker event after the stream's last.
// It is the one way events leave a log. A removed event's position and
// stream version are never given again: the log, and the stream, have a
// gap where it was, ReadAll and ReadStream pass over it, and Position of
// its id is errdefs.ErrNotFound.
type Compactor interface {
	// Compact removes from stream every event whose type is one of
	// types and appends marker, at version expected+1 and the next
	// position, atomically: both or neither. It does so only if stream
	// is at version expected, which the caller read with the events it
	// decided on; else it returns an error wrapping ErrVersionConflict
	// and changes nothing. It returns the marker as committed (Append's
	// ids, causes, time) and how many events it removed. An empty stream
	// id or list of types, an expected version below 1 or a marker that
	// Append would refuse is errdefs.ErrInvalidArgument. When Compact
	// returns nil the change is durable, and WaitFor is woken as by an
	// append.
	Compact(ctx context.Context, stream string, expected int64, types []string, marker Proposed) (Event, int, error)
}

// CheckCompact refuses a compaction every store refuses before it looks
// at the log, as Compactor.Compact says. Stores' Compact calls it first.
func CheckCompact(stream string, expected int64, types []string, marker Proposed) error {
	if err := CheckAppend(stream, expected, []Proposed{marker}); err != nil {
		return err
	}
	if expected < 1 {
		return fmt.Errorf("expected version %d: a compaction is of a stream at a known version: %w", expected, errdefs.ErrInvalidArgument)
	}
	if len(types) == 0 {
		return fmt.Errorf("no event types to remove: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}
