// Package storecopy moves Corral's event log from one store into another:
// from the data root's SQLite file (corral.db) into PostgreSQL, or back
// (corral store copy). The log is all a server records (its tasks,
// sessions and the rest are folded from it at start; files stay in the
// data root, which a server on either store uses), so a server started on
// the copy carries on where the old one stopped.
//
// A copy keeps every event as it is (its id, stream version, position,
// causes, data text and recorded_at), through eventstore.Importer, with
// one difference the target's Fit declares: PostgreSQL keeps recorded_at
// to the microsecond, SQLite's events carry nanoseconds, so copying into
// PostgreSQL drops their last three digits (the Report counts them).
// Every other field is kept byte for byte; an event the target cannot
// hold at all (text PostgreSQL refuses: a NUL byte, bytes that are not
// UTF-8) stops the copy before it writes anything, naming its position.
//
// It goes in four steps: check (read the whole source, and refuse it
// unless its positions rise and the target can hold every event), look
// at the target (empty, or holding the start of this very log
// from a copy interrupted before, compared event for event: anything else
// is refused), copy (Import in batches, each in one transaction at the
// target's head, so an interrupted copy is resumed by running it again)
// and verify (read both stores in position order and compare every field
// of every event, with a SHA-256 of the log as the target keeps it). The
// source is only read. The gaps retention's compactions left in its log
// (eventstore.Compactor) are copied as they are: a removed event's
// position and stream version stay unused in the target too.
//
// Like app, this package names the concrete stores: Run opens them, with
// the locks that keep a server off them while it copies.
package storecopy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
)

// DefaultBatch is how many events go in one Import: one transaction and
// one fsync each. 1,000 events are a few hundred kilobytes for Corral's
// events, and make a 100,000-event log 100 commits.
const DefaultBatch = 1000

// page is how many events a read for the check or the verification takes.
const page = 1000

// Options are a copy's knobs.
type Options struct {
	// Batch is the number of events per Import; 0 means DefaultBatch.
	Batch int
	// Progress, if set, is called after each batch with the position up
	// to which the target holds the log, and the source's head.
	Progress func(done, total int64)
}

// Report is what a copy found and did.
type Report struct {
	From, To string // the stores, as messages name them (never a connection string)
	// Events is how many events the log holds, and Head the position of
	// the last: the source's head, and the target's once the copy is
	// verified. Head is Events, or more where retention compacted
	// streams.
	Events, Head int64
	Streams      int
	// Resumed is the target's head when the copy began: it held the log
	// up to there already, from a copy interrupted before, compared event
	// for event first.
	Resumed int64
	// Copied is how many events this run imported.
	Copied int64
	// Truncated is how many events the target keeps with a recorded_at
	// cut to the microsecond (SQLite's nanoseconds into PostgreSQL).
	Truncated int64
	// Checksum is the SHA-256, in hex, of every event as the target keeps
	// it, in position order (the fields, each length-prefixed). Equal
	// checksums of two stores mean equal logs.
	Checksum string

	Checking, Copying, Verifying time.Duration
}

// Copy copies src's log into dst and verifies the result (the package doc
// says how). src must not change while it runs: Run holds the locks that
// keep servers off both stores. Errors are of class
// errdefs.ErrFailedPrecondition when the source or the target is not as a
// copy needs (positions that do not rise in the source, an event the target cannot hold, a
// target holding another log, a difference found by the verification),
// and otherwise the stores' own. A failure leaves src as it was and dst
// holding the events of its batches that committed, the start of src's
// log, from which another Copy goes on.
func Copy(ctx context.Context, src eventstore.Store, dst eventstore.Importer, opts Options) (Report, error) {
	var r Report
	batch := opts.Batch
	if batch <= 0 {
		batch = DefaultBatch
	}

	start := time.Now()
	if err := check(ctx, src, dst, &r); err != nil {
		return r, err
	}
	head, err := dst.Head(ctx)
	if err != nil {
		return r, fmt.Errorf("read the target's head: %w", err)
	}
	if head > r.Head {
		return r, fmt.Errorf("the target's log goes to position %d and the source's only to %d: it holds another log; copy into an empty store: %w",
			head, r.Head, errdefs.ErrFailedPrecondition)
	}
	if head > 0 {
		if _, err := compare(ctx, src, dst, head); err != nil {
			return r, fmt.Errorf("the target is not empty (it holds a log up to position %d) and, not being the start of this log, cannot be resumed; copy into an empty store: %w",
				head, err)
		}
		r.Resumed = head
	}
	r.Checking = time.Since(start)

	start = time.Now()
	for after := head; after < r.Head; {
		stopped := func(err error) error {
			held := "nothing"
			if after > 0 {
				held = fmt.Sprintf("the log up to position %d", after)
			}
			return fmt.Errorf("the copy stopped with %s of %d in the target (run it again to go on from there): %w", held, r.Head, err)
		}
		evs, err := src.ReadAll(ctx, after, int(min(int64(batch), r.Head-after)))
		if err != nil {
			return r, stopped(fmt.Errorf("read the source after position %d: %w", after, err))
		}
		if len(evs) == 0 {
			return r, stopped(fmt.Errorf("the source ends at position %d, before its head %d: it changed during the copy: %w",
				after, r.Head, errdefs.ErrFailedPrecondition))
		}
		if err := dst.Import(ctx, evs); err != nil {
			return r, stopped(fmt.Errorf("copy events %d to %d: %w", evs[0].Position, evs[len(evs)-1].Position, err))
		}
		r.Copied += int64(len(evs))
		after = evs[len(evs)-1].Position
		if opts.Progress != nil {
			opts.Progress(after, r.Head)
		}
	}
	r.Copying = time.Since(start)

	start = time.Now()
	sum, err := compare(ctx, src, dst, -1)
	if err != nil {
		return r, fmt.Errorf("verify the copy: %w", err)
	}
	r.Checksum = sum
	r.Verifying = time.Since(start)
	return r, nil
}

// check reads the whole source: its positions must rise, and the target
// must hold each event (Fit). It fills r's Events, Head, Streams and
// Truncated.
func check(ctx context.Context, src eventstore.Store, dst eventstore.Importer, r *Report) error {
	streams := make(map[string]struct{})
	var after, n int64
	for {
		evs, err := src.ReadAll(ctx, after, page)
		if err != nil {
			return fmt.Errorf("read the source after position %d: %w", after, err)
		}
		if len(evs) == 0 {
			break
		}
		for _, e := range evs {
			if e.Position <= after {
				return fmt.Errorf("the source's positions go from %d back to %d; nothing was copied: %w",
					after, e.Position, errdefs.ErrFailedPrecondition)
			}
			after = e.Position
			n++
			f, err := dst.Fit(e)
			if err != nil {
				// Not err's class: the source is no argument of the caller's.
				return fmt.Errorf("the target cannot hold the source's log (%s); nothing was copied: %w",
					errdefs.Message(err), errdefs.ErrFailedPrecondition)
			}
			if !f.RecordedAt.Equal(e.RecordedAt) {
				r.Truncated++
			}
			streams[e.StreamID] = struct{}{}
		}
	}
	r.Events, r.Head, r.Streams = n, after, len(streams)
	return nil
}

// compare reads both stores in position order up to position upto (-1:
// to their ends, which must be the same) and compares every event of dst
// with the source's as dst keeps it (Fit). It returns the SHA-256 of what
// it read of dst, and an error of class errdefs.ErrFailedPrecondition
// naming the first difference.
func compare(ctx context.Context, src eventstore.Store, dst eventstore.Importer, upto int64) (string, error) {
	h := sha256.New()
	var after int64
	for upto < 0 || after < upto {
		n := int64(page)
		if upto >= 0 {
			n = min(n, upto-after)
		}
		want, err := src.ReadAll(ctx, after, int(n))
		if err != nil {
			return "", fmt.Errorf("read the source after position %d: %w", after, err)
		}
		got, err := dst.ReadAll(ctx, after, int(n))
		if err != nil {
			return "", fmt.Errorf("read the target after position %d: %w", after, err)
		}
		if upto >= 0 { // n events may go past upto, over gaps
			want, got = through(want, upto), through(got, upto)
		}
		for i := range min(len(want), len(got)) {
			f, err := dst.Fit(want[i])
			if err != nil {
				return "", fmt.Errorf("the target cannot hold the source's event (%s): %w", errdefs.Message(err), errdefs.ErrFailedPrecondition)
			}
			if field := differs(f, got[i]); field != "" {
				return "", fmt.Errorf("the event at position %d differs between the source and the target: %s: %w",
					f.Position, field, errdefs.ErrFailedPrecondition)
			}
			sum(h, got[i])
		}
		switch {
		case len(want) > len(got):
			return "", fmt.Errorf("the source has an event at position %d, the target none: %w", want[len(got)].Position, errdefs.ErrFailedPrecondition)
		case len(got) > len(want):
			return "", fmt.Errorf("the target has an event at position %d, the source none: %w", got[len(want)].Position, errdefs.ErrFailedPrecondition)
		case len(got) == 0:
			if upto >= 0 {
				return "", fmt.Errorf("both stores end at position %d, before %d: %w", after, upto, errdefs.ErrFailedPrecondition)
			}
			return hex.EncodeToString(h.Sum(nil)), nil
		}
		after = got[len(got)-1].Position
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// through is the events of evs, in position order, up to position upto.
func through(evs []eventstore.Event, upto int64) []eventstore.Event {
	for i, e := range evs {
		if e.Position > upto {
			return evs[:i]
		}
	}
	return evs
}

// differs names the first field in which got is not want, with what each
// holds where that is short and not a task's content ("" when they are
// equal).
func differs(want, got eventstore.Event) string {
	str := func(name, w, g string) string {
		return fmt.Sprintf("%s %q in the source, %q in the target", name, w, g)
	}
	num := func(name string, w, g int64) string {
		return fmt.Sprintf("%s %d in the source, %d in the target", name, w, g)
	}
	switch {
	case want.Position != got.Position:
		return num("position", want.Position, got.Position)
	case want.ID != got.ID:
		return str("id", want.ID, got.ID)
	case want.StreamID != got.StreamID:
		return str("stream id", want.StreamID, got.StreamID)
	case want.StreamVersion != got.StreamVersion:
		return num("stream version", want.StreamVersion, got.StreamVersion)
	case want.Type != got.Type:
		return str("type", want.Type, got.Type)
	case want.SchemaVersion != got.SchemaVersion:
		return num("schema version", int64(want.SchemaVersion), int64(got.SchemaVersion))
	case !bytes.Equal(want.Data, got.Data):
		// Not the data itself: it holds prompts and results.
		return fmt.Sprintf("data (%d bytes in the source, %d in the target)", len(want.Data), len(got.Data))
	case want.Actor != got.Actor:
		return str("actor", want.Actor, got.Actor)
	case want.CorrelationID != got.CorrelationID:
		return str("correlation id", want.CorrelationID, got.CorrelationID)
	case want.CausationID != got.CausationID:
		return str("causation id", want.CausationID, got.CausationID)
	case !want.RecordedAt.Equal(got.RecordedAt):
		return fmt.Sprintf("recorded_at %s in the source, %s in the target",
			want.RecordedAt.UTC().Format(time.RFC3339Nano), got.RecordedAt.UTC().Format(time.RFC3339Nano))
	}
	return ""
}

// sum adds e to the log's checksum: each field length-prefixed, so no two
// logs write the same bytes; no data (NULL) and empty data are one.
func sum(h hash.Hash, e eventstore.Event) {
	var n [8]byte
	num := func(v int64) {
		binary.BigEndian.PutUint64(n[:], uint64(v))
		h.Write(n[:])
	}
	text := func(b []byte) {
		num(int64(len(b)))
		h.Write(b)
	}
	num(e.Position)
	text([]byte(e.ID))
	text([]byte(e.StreamID))
	num(e.StreamVersion)
	text([]byte(e.Type))
	num(int64(e.SchemaVersion))
	text(e.Data)
	text([]byte(e.Actor))
	text([]byte(e.CorrelationID))
	text([]byte(e.CausationID))
	text([]byte(e.RecordedAt.UTC().Format(time.RFC3339Nano)))
}
