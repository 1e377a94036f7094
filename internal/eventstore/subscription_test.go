package eventstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// flakyStore fails its first reads as a store being restarted does, then
// has one event.
type flakyStore struct {
	Store
	fails int
	err   error
}

func (f *flakyStore) ReadAll(ctx context.Context, after int64, limit int) ([]Event, error) {
	if f.fails > 0 {
		f.fails--
		return nil, f.err
	}
	if after > 0 {
		return nil, nil
	}
	return []Event{{ID: "e1", Position: 1}}, nil
}

// A follower waits out a store it cannot reach, and ends on any other
// failure.
func TestSubscriptionWaitsOutAnOutage(t *testing.T) {
	unavailable := &flakyStore{fails: 3, err: fmt.Errorf("read events: %w", errdefs.ErrUnavailable)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := Subscribe(unavailable, 0).Next(ctx)
	if err != nil || e.ID != "e1" || unavailable.fails != 0 {
		t.Errorf("Next through an outage: %+v, %v (fails left %d); want the event", e, err, unavailable.fails)
	}
	broken := &flakyStore{fails: 1, err: errors.New("corrupt page")}
	if _, err := Subscribe(broken, 0).Next(ctx); err == nil || err.Error() != "corrupt page" {
		t.Errorf("Next on a broken store: %v, want its error", err)
	}
	gone := &flakyStore{fails: 1 << 30, err: errdefs.ErrUnavailable}
	short, stop := context.WithTimeout(ctx, 200*time.Millisecond)
	defer stop()
	if _, err := Subscribe(gone, 0).Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Next on a store that never comes back: %v, want the context's end", err)
	}
}
