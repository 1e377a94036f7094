package sqlite

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/storetest"
)

// TestCommitsCount: each transaction that wrote events counts once, with
// the events it held; a batch that wrote nothing does not count.
func TestCommitsCount(t *testing.T) {
	s := MustOpenTemp(t)
	if c := s.Commits(); c.Commits != 0 || c.Events != 0 || len(c.Within) != len(CommitBuckets) {
		t.Fatalf("Commits() of a new store = %+v, want none, with a count per bucket", c)
	}
	p := eventstore.Proposed{Type: "t", SchemaVersion: 1}
	storetest.MustAppend(t, s, "a", 0, p, p)

	req := func(stream string, expected int64) *appendReq {
		return &appendReq{ctx: context.Background(), stream: stream, expected: expected, events: []eventstore.Proposed{p}, res: make(chan appendRes, 1)}
	}
	// The writer goroutine is idle (no Append in flight), so calling its
	// method here does not race with it. One transaction: two appends
	// written, one refused.
	batch := []*appendReq{req("a", 2), req("b", 0), req("a", 0)}
	s.commitBatch(batch)
	if res := <-batch[2].res; !errors.Is(res.err, eventstore.ErrVersionConflict) {
		t.Fatalf("the stale append: %v, want a version conflict", res.err)
	}
	// A batch of refusals only: rolled back, no commit.
	s.commitBatch([]*appendReq{req("a", 0)})

	c := s.Commits()
	if c.Commits != 2 || c.Events != 4 {
		t.Errorf("Commits() = %d commits of %d events, want 2 of 4", c.Commits, c.Events)
	}
	if c.Seconds <= 0 {
		t.Errorf("Commits().Seconds = %v, want the commits' time", c.Seconds)
	}
	for i := range c.Within {
		if c.Within[i] > c.Commits || i > 0 && c.Within[i] < c.Within[i-1] {
			t.Errorf("Commits().Within = %v: not cumulative counts of %d commits", c.Within, c.Commits)
			break
		}
	}
}

// TestCommitBuckets: a commit counts in every bucket its time fits.
func TestCommitBuckets(t *testing.T) {
	c := CommitStats{Within: make([]uint64, len(CommitBuckets))}
	c.add(300*time.Microsecond, 1) // every bucket
	c.add(3*time.Millisecond, 2)   // from 5 ms on
	c.add(2*time.Second, 1)        // none
	want := []uint64{1, 1, 1, 2, 2, 2, 2, 2, 2, 2}
	if diff := cmp.Diff(want, c.Within); diff != "" {
		t.Errorf("Within (-want +got):\n%s", diff)
	}
	if c.Commits != 3 || c.Events != 4 || c.Seconds < 2.003 || c.Seconds > 2.0034 {
		t.Errorf("CommitStats = %+v, want 3 commits, 4 events, 2.0033 s", c)
	}
}
