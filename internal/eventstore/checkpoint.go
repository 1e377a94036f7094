package eventstore

import (
	"context"
	"fmt"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Checkpoints is implemented by stores that keep checkpoints beside the
// log: a reader's state (a projection's) as it was at a position, saved so
// that the next start reads it and folds only the events after that
// position instead of the whole log. A checkpoint is never the truth, only
// a shortcut to it: the reader that wrote it must be able to do without it
// (a store that does not implement Checkpoints, a checkpoint lost or of
// another version), so a store may drop one and lose nothing but time.
//
// The store keeps one checkpoint per name, the one at the highest position
// saved. Its data is opaque to the store: the reader versions it.
type Checkpoints interface {
	// SaveCheckpoint keeps data as checkpoint name, at position, unless
	// the store keeps one at a higher position already: then it changes
	// nothing and returns nil, so that of several servers folding one log
	// the one that is behind never takes a checkpoint back. One at the
	// same position is replaced: a new binary that cannot read the
	// checkpoint an old one left must be able to replace it before the
	// log moves on. An empty name or a negative position is
	// errdefs.ErrInvalidArgument. The checkpoint is durable when
	// SaveCheckpoint returns nil. A save never holds back appends for
	// longer than its own write takes.
	SaveCheckpoint(ctx context.Context, name string, position int64, data []byte) error

	// LoadCheckpoint returns checkpoint name: the position it was saved
	// at and its data, or ok false when the store keeps none of that
	// name. The data is the caller's to keep.
	LoadCheckpoint(ctx context.Context, name string) (position int64, data []byte, ok bool, err error)
}

// CheckCheckpoint refuses a checkpoint every store refuses: an empty name
// or a negative position, as errdefs.ErrInvalidArgument. Stores'
// SaveCheckpoint calls it first.
func CheckCheckpoint(name string, position int64) error {
	if name == "" {
		return fmt.Errorf("save checkpoint: empty name: %w", errdefs.ErrInvalidArgument)
	}
	if position < 0 {
		return fmt.Errorf("save checkpoint %s: position %d is negative: %w", name, position, errdefs.ErrInvalidArgument)
	}
	return nil
}
