package webhook

import (
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// KindProgressDropped is the kind of the item the Verifier adds to a
// task's progress when it dropped some of the task's reports.
const KindProgressDropped = "progress_dropped"

// progressLimits bound what one task's progress reports may record. A
// worker holds its task's key and can sign as many reports as it likes;
// these keep what it makes the server store small and its own.
type progressLimits struct {
	// EventsPerSecond and Burst are a token bucket of items (a report
	// without items costs one): the worker sends at most one item per kind
	// every 500 ms, under 10 a second with its five kinds.
	EventsPerSecond float64
	Burst           float64
	// MaxEvents and MaxBytes bound a task's accepted items and report
	// bytes over its whole life.
	MaxEvents int64
	MaxBytes  int64
	// NoteEvery is the least time between two progress_dropped notes of a
	// task.
	NoteEvery time.Duration
}

// defaultProgressLimits: 10 items a second with a burst of 64 (two full
// reports); 50,000 items and 16 MiB a task, as much as the transcript a
// task keeps (limits.max_log_bytes' default).
var defaultProgressLimits = progressLimits{
	EventsPerSecond: 10,
	Burst:           64,
	MaxEvents:       50_000,
	MaxBytes:        16 << 20,
	NoteEvery:       10 * time.Second,
}

// progressBudget is one task's use of its progressLimits.
type progressBudget struct {
	started bool
	tokens  float64
	last    time.Time // of the last refill
	events  int64     // items accepted
	bytes   int64     // bytes of the reports accepted
	// droppedReports and droppedItems count what was refused since the
	// last note.
	droppedReports, droppedItems int64
	lastNote                     time.Time
	// exhausted is set once a report would have taken the task over
	// MaxEvents or MaxBytes; the note saying so took its place, and
	// nothing more is accepted.
	exhausted bool
}

// admit decides whether a report of items and size bytes fits, and returns
// the items to record: the report's, with a progress_dropped note appended
// when reports were dropped and the last note is NoteEvery old. When the
// task's totals are reached, the first report over them is replaced by a
// note saying so; that one and every later one is refused with
// ErrResourceExhausted, as is a report over the rate.
func (b *progressBudget) admit(l progressLimits, now time.Time, items []ProgressItem, size int) ([]ProgressItem, error) {
	b.refill(l, now)
	n := int64(len(items))
	if b.exhausted {
		b.drop(n)
		return nil, fmt.Errorf("progress limit of the task reached (%d items, %d bytes): report dropped: %w", l.MaxEvents, l.MaxBytes, errdefs.ErrResourceExhausted)
	}
	if b.events+n > l.MaxEvents || b.bytes+int64(size) > l.MaxBytes {
		b.drop(n)
		b.exhausted = true
		note := b.note(now, fmt.Sprintf("progress limit of the task reached (%d items, %d bytes); later reports are dropped", l.MaxEvents, l.MaxBytes))
		b.events++
		return []ProgressItem{note}, nil
	}
	cost := float64(max(n, 1))
	if b.tokens < cost {
		b.drop(n)
		return nil, fmt.Errorf("progress over %g items a second (burst %g): report dropped: %w", l.EventsPerSecond, l.Burst, errdefs.ErrResourceExhausted)
	}
	b.tokens -= cost
	b.events += n
	b.bytes += int64(size)
	if b.droppedReports > 0 && now.Sub(b.lastNote) >= l.NoteEvery {
		items = append(items, b.note(now, fmt.Sprintf("progress over %g items a second (burst %g)", l.EventsPerSecond, l.Burst)))
		b.events++
	}
	return items, nil
}

// refill adds the tokens earned since the last refill; a new budget starts
// full.
func (b *progressBudget) refill(l progressLimits, now time.Time) {
	if !b.started {
		b.started, b.tokens, b.last = true, l.Burst, now
		return
	}
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(l.Burst, b.tokens+d.Seconds()*l.EventsPerSecond)
		b.last = now
	}
}

func (b *progressBudget) drop(items int64) {
	b.droppedReports++
	b.droppedItems += items
}

// note returns the progress_dropped item that reports the drops since the
// last one, and starts counting again.
func (b *progressBudget) note(now time.Time, why string) ProgressItem {
	it := ProgressItem{
		Kind:      KindProgressDropped,
		Text:      fmt.Sprintf("%d progress reports (%d items) dropped: %s", b.droppedReports, b.droppedItems, why),
		Coalesced: int(b.droppedItems),
	}
	b.droppedReports, b.droppedItems, b.lastNote = 0, 0, now
	return it
}
