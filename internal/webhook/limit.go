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

// charge is what admitting one message took from its task's budget: the
// Verifier keeps it until the message's id expires, and gives it back if
// the message is forgotten (the server could not record it, and the
// worker's retry will be charged anew).
type charge struct {
	tokens        float64
	events, bytes int64
	exhausted     bool // it set progressBudget.exhausted
	// A note it carried reported these drops, and replaced this lastNote.
	noted          bool
	reports, items int64
	lastNote       time.Time
}

// admit decides whether a report of items and size bytes fits, and returns
// the items to record (the report's, with a progress_dropped note appended
// when reports were dropped and the last note is NoteEvery old) and what
// it charged. When the task's totals are reached, the first report over
// them is replaced by a note saying so; that one and every later one is
// refused with ErrResourceExhausted, as is a report over the rate.
func (b *progressBudget) admit(l progressLimits, now time.Time, items []ProgressItem, size int) ([]ProgressItem, charge, error) {
	b.refill(l, now)
	n := int64(len(items))
	if b.exhausted {
		b.drop(n)
		return nil, charge{}, fmt.Errorf("progress limit of the task reached (%d items, %d bytes): report dropped: %w", l.MaxEvents, l.MaxBytes, errdefs.ErrResourceExhausted)
	}
	if b.events+n > l.MaxEvents || b.bytes+int64(size) > l.MaxBytes {
		b.drop(n)
		b.exhausted = true
		ch := charge{events: 1, exhausted: true}
		note := b.note(now, &ch, fmt.Sprintf("progress limit of the task reached (%d items, %d bytes); later reports are dropped", l.MaxEvents, l.MaxBytes))
		b.events++
		return []ProgressItem{note}, ch, nil
	}
	cost := float64(max(n, 1))
	if b.tokens < cost {
		b.drop(n)
		return nil, charge{}, fmt.Errorf("progress over %g items a second (burst %g): report dropped: %w", l.EventsPerSecond, l.Burst, errdefs.ErrResourceExhausted)
	}
	ch := charge{tokens: cost, events: n, bytes: int64(size)}
	b.tokens -= cost
	b.events += n
	b.bytes += int64(size)
	if b.droppedReports > 0 && now.Sub(b.lastNote) >= l.NoteEvery {
		items = append(items, b.note(now, &ch, fmt.Sprintf("progress over %g items a second (burst %g)", l.EventsPerSecond, l.Burst)))
		b.events++
		ch.events++
	}
	return items, ch, nil
}

// refund gives back what admit charged for a message that was not
// recorded: its tokens (up to the burst), items and bytes, the drops a
// note of it reported (counted again for the next note), and the
// exhaustion it set, so that the retry is judged as it was.
func (b *progressBudget) refund(l progressLimits, ch charge) {
	b.tokens = min(l.Burst, b.tokens+ch.tokens)
	b.events -= ch.events
	b.bytes -= ch.bytes
	if ch.exhausted {
		b.exhausted = false
	}
	if ch.noted {
		b.droppedReports += ch.reports
		b.droppedItems += ch.items
		b.lastNote = ch.lastNote
	}
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
// last one, and starts counting again; ch, the charge of the message that
// carries it, records what it reported.
func (b *progressBudget) note(now time.Time, ch *charge, why string) ProgressItem {
	it := ProgressItem{
		Kind:      KindProgressDropped,
		Text:      fmt.Sprintf("%d progress reports (%d items) dropped: %s", b.droppedReports, b.droppedItems, why),
		Coalesced: int(b.droppedItems),
	}
	ch.noted, ch.reports, ch.items, ch.lastNote = true, b.droppedReports, b.droppedItems, b.lastNote
	b.droppedReports, b.droppedItems, b.lastNote = 0, 0, now
	return it
}
