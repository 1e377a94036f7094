package sqlite

import (
	"bytes"
	"sort"

	"github.com/corral-dev/corral/internal/eventstore"
)

// recentEvents is how many of the last committed events the store keeps in
// memory. Every follower of the log (the task projection, the notifier,
// the document index, each event stream a client follows) reads after
// each commit what that commit added: with the events in memory, that is a
// copy, not a query per follower per commit. A follower further behind
// (a new stream from the start, a server catching up at start) reads from
// SQLite.
const recentEvents = 1024

// recent is the tail of the log: every event from its first's position
// on, in position order, ending at the committed head. Positions may have
// gaps, where an import brought the gaps of its source's log. Guarded by
// Store.mu, and changed only with the head, so that a reader never sees
// one without the other; a compaction empties it (commitCompact).
type recent struct {
	evs []eventstore.Event
}

// add appends a commit's events, which follow the tail's last, and drops
// the oldest beyond recentEvents.
func (r *recent) add(evs []eventstore.Event) {
	for _, e := range evs {
		e.Data = bytes.Clone(e.Data) // the appender holds the originals
		if len(e.Data) == 0 {
			e.Data = nil // as a read from SQLite has it
		}
		r.evs = append(r.evs, e)
	}
	if n := len(r.evs); n > 2*recentEvents {
		r.evs = append([]eventstore.Event(nil), r.evs[n-recentEvents:]...)
	}
}

// after returns up to limit events after position after, and whether the
// tail holds every event after it (else the caller reads SQLite). The
// events are copies.
func (r *recent) after(after int64, limit int) ([]eventstore.Event, bool) {
	if len(r.evs) == 0 || after < r.evs[0].Position-1 {
		return nil, false
	}
	i := sort.Search(len(r.evs), func(i int) bool { return r.evs[i].Position > after })
	if i == len(r.evs) {
		return nil, true
	}
	out := append([]eventstore.Event(nil), r.evs[i:min(len(r.evs), i+limit)]...)
	for j := range out {
		out[j].Data = bytes.Clone(out[j].Data)
	}
	return out, true
}
