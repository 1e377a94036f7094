package projection

import (
	"context"
	"errors"
	"fmt"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/task"
)

// Sync applies every event the store holds when it is called: what a
// reader must have seen before it judges by absence (a sandbox no task
// has, a directory no event knows), when other servers append to the
// same store and its events may not have reached this projection yet.
func (p *Tasks) Sync(ctx context.Context) error {
	for {
		evs, err := p.store.ReadAll(ctx, p.Position(), 1024)
		if err != nil {
			return fmt.Errorf("read events up to now: %w", err)
		}
		if len(evs) == 0 {
			return nil
		}
		p.apply(evs...)
	}
}

// Lookup is Get for an id from outside (a client's): a task this
// projection does not hold is looked for again after reading the store up
// to now, so that one made a moment ago through another server on the
// store is found, not called unknown.
func (p *Tasks) Lookup(ctx context.Context, id string) (task.Task, error) {
	t, err := p.Get(id)
	if !errors.Is(err, errdefs.ErrNotFound) {
		return t, err
	}
	if err := p.Sync(ctx); err != nil {
		return t, err
	}
	return p.Get(id)
}
