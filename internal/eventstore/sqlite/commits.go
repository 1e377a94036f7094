package sqlite

import (
	"slices"
	"time"
)

// CommitBuckets are the upper bounds, in seconds, of CommitStats.Within:
// from a fast SSD's fsync to a disk that holds every task up.
var CommitBuckets = []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}

// CommitStats are the writer's commits since Open. Each is one transaction
// of one or more appends and one fsync of the WAL, timed from its BEGIN
// until it is on disk: every task waits for several, so their time is a
// floor under a task's.
type CommitStats struct {
	Commits uint64
	Events  uint64  // the events they held
	Seconds float64 // their time in all
	// Within[i] is how many took at most CommitBuckets[i] seconds.
	Within []uint64
}

// add counts a commit of events that took d.
func (c *CommitStats) add(d time.Duration, events int) {
	sec := d.Seconds()
	c.Commits++
	c.Events += uint64(events)
	c.Seconds += sec
	for i, b := range CommitBuckets {
		if sec <= b {
			c.Within[i]++
		}
	}
}

// Commits returns the writer's commits since Open.
func (s *Store) Commits() CommitStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.commits
	c.Within = slices.Clone(c.Within)
	return c
}
