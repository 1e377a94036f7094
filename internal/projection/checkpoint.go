package projection

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/task"
)

// A checkpoint is the projection's state at a position P, kept in the
// event store (eventstore.Checkpoints), so that a start reads it and
// applies only the events after P instead of folding the whole log: 5.7 s
// for 100,000 ended tasks on SQLite, 4.0 s on PostgreSQL, on the machine
// of docs/benchmarks.md (BenchmarkStart), and a server keeps every task
// it has run.
//
// It is two rows, because what a start needs before it serves does not
// grow with the tasks a server has run, and the rest does:
//
//   - the head (headName): the tasks held whole (the keepEnded that ended
//     last, and those not ended), the counts, what ended tasks reported
//     (Ended), the pending save_to_shared copies, P, and which archive
//     goes with it (position, size, checksum). Rebuild reads it and
//     returns once the events after P are applied: a few milliseconds,
//     whether the server has run a thousand tasks or a million.
//   - the archive (archiveName): the ended tasks held in part and the
//     idempotency keys, as sorted tables (archive.go) that the projection
//     keeps as they are read, without decoding them. It is read in the
//     background after Rebuild returns; what needs it meanwhile waits
//     (Archived). For 100,000 ended tasks it is some 6 MB, read in tens of
//     milliseconds.
//
// A server saves one now and then (KeepCheckpoints): after
// checkpointEvents events, no sooner than checkpointSpacing after the
// last, and when it stops. A save writes the archive, then the head: a
// head is only ever read with the archive it names, and one that names
// another (a save that failed between the two, two servers saving at
// once) makes the projection fold the whole log again, in the
// background.
//
// Each row starts with checkpointMagic, checkpointVersion, the shape of
// task.Task (taskShape) and its kind, and ends with a CRC-32C of the rest.
// A row of another version or shape, or that does not check or decode,
// is passed over: the log is the truth, a checkpoint only a shortcut.

const (
	headName    = "projection.tasks"
	archiveName = "projection.tasks.archive"
)

// checkpointVersion is the version of the fold and of the checkpoint's
// encoding. Bump it whenever either changes: what task.Task.Apply, apply
// or index make of the same events, or what this file and archive.go
// write. A checkpoint of another version is passed over and the whole
// log folded once. (A change of task.Task's fields retires checkpoints by
// itself, through taskShape.) TestFoldVersion fails when the fold
// of a fixed log changes and this does not.
const checkpointVersion = 2

const checkpointMagic = "corral checkpoint\n"

// The kinds of row.
const (
	kindHead    = 'h'
	kindArchive = 'a'
)

// checkpointEvents and checkpointSpacing are when KeepCheckpoints saves:
// after that many events (some 2,000 tasks), no more than once a minute.
// A start after a crash folds at most that many events and a minute's
// more (some 0.1 to 0.3 s); a save of 100,000 ended tasks writes some 6 MB
// and holds appends back for its write, tens of milliseconds.
const (
	checkpointEvents  = 10_000
	checkpointSpacing = time.Minute
)

// shutdownSave bounds the save of a server that stops.
const shutdownSave = 30 * time.Second

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// head is what the head row holds.
type head struct {
	pos     int64
	archive archiveRef
	recent  []task.Task // the ended tasks held whole, in the order they ended
	live    []task.Task // the tasks not ended, by id
	counts  map[task.Status]int
	ended   Ended
	saves   map[string]time.Time
}

// archiveRef names the archive row a head goes with.
type archiveRef struct {
	pos  int64
	size int
	crc  uint32 // the row's own checksum
}

// startRow writes a row's header.
func startRow(kind byte, pos int64) *enc {
	w := &enc{b: []byte(checkpointMagic)}
	w.uvarint(checkpointVersion)
	w.b = binary.LittleEndian.AppendUint64(w.b, taskShape)
	w.b = append(w.b, kind)
	w.varint(pos)
	return w
}

// endRow appends the checksum and returns the row, and the checksum.
func endRow(w *enc) ([]byte, uint32) {
	sum := crc32.Checksum(w.b, castagnoli)
	w.u32(sum)
	return w.b, sum
}

// openRow checks a row of kind that the store says is at pos, and returns
// a reader of what follows its header.
func openRow(data []byte, kind byte, pos int64) (*dec, error) {
	if len(data) < len(checkpointMagic)+4 || !strings.HasPrefix(string(data[:len(checkpointMagic)]), checkpointMagic) {
		return nil, errors.New("not a checkpoint of this projection")
	}
	body := data[:len(data)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(data[len(data)-4:]) {
		return nil, errors.New("checksum mismatch")
	}
	r := &dec{s: string(body[len(checkpointMagic):])}
	if v := r.uvarint(); v != checkpointVersion {
		return nil, fmt.Errorf("version %d, this binary reads %d", v, checkpointVersion)
	}
	if s := r.take(8); len(s) == 8 && binary.LittleEndian.Uint64([]byte(s)) != taskShape {
		return nil, errors.New("written for another shape of task.Task")
	}
	if k := r.take(1); k != string(rune(kind)) {
		return nil, fmt.Errorf("a row of kind %q where %q belongs", k, string(rune(kind)))
	}
	if p := r.varint(); p != pos {
		return nil, fmt.Errorf("written at position %d, kept at %d", p, pos)
	}
	return r, r.err
}

func encodeHead(h *head) []byte {
	w := startRow(kindHead, h.pos)
	w.varint(h.archive.pos)
	w.uvarint(uint64(h.archive.size))
	w.u32(h.archive.crc)
	for _, ts := range [][]task.Task{h.recent, h.live} {
		w.uvarint(uint64(len(ts)))
		for i := range ts {
			w.task(&ts[i])
		}
	}
	w.uvarint(uint64(len(h.counts)))
	for _, st := range slices.Sorted(maps.Keys(h.counts)) {
		w.str(string(st))
		w.varint(int64(h.counts[st]))
	}
	e := h.ended
	w.uvarint(uint64(len(e.Within)))
	for _, n := range e.Within {
		w.uvarint(n)
	}
	w.uvarint(e.Timed)
	w.f64(e.Seconds)
	w.uvarint(uint64(len(e.Agents)))
	for _, name := range slices.Sorted(maps.Keys(e.Agents)) {
		u := e.Agents[name]
		w.str(name)
		w.varint(u.InputTokens)
		w.varint(u.OutputTokens)
		w.f64(u.CostUSD)
	}
	w.uvarint(uint64(len(h.saves)))
	for _, id := range slices.Sorted(maps.Keys(h.saves)) {
		w.str(id)
		w.time(h.saves[id])
	}
	b, _ := endRow(w)
	return b
}

func decodeHead(data []byte, pos int64) (*head, error) {
	r, err := openRow(data, kindHead, pos)
	if err != nil {
		return nil, err
	}
	h := &head{pos: pos, counts: map[task.Status]int{}, ended: newEnded(), saves: map[string]time.Time{}}
	h.archive = archiveRef{pos: r.varint(), size: int(r.uvarint()), crc: r.u32()}
	for _, ts := range []*[]task.Task{&h.recent, &h.live} {
		*ts = make([]task.Task, r.n())
		for i := range *ts {
			(*ts)[i] = r.task()
		}
	}
	for range r.n() {
		st := task.Status(r.str())
		h.counts[st] = int(r.varint())
	}
	if n := r.n(); r.err == nil && n != len(DurationBuckets) {
		return nil, fmt.Errorf("%d duration buckets, this binary has %d", n, len(DurationBuckets))
	}
	for i := range h.ended.Within {
		h.ended.Within[i] = r.uvarint()
	}
	h.ended.Timed = r.uvarint()
	h.ended.Seconds = r.f64()
	for range r.n() {
		name := r.str()
		h.ended.Agents[name] = Usage{InputTokens: r.varint(), OutputTokens: r.varint(), CostUSD: r.f64()}
	}
	for range r.n() {
		id := r.str()
		h.saves[id] = r.time()
	}
	if r.err == nil && r.s != "" {
		r.fail("bytes after the end")
	}
	return h, r.err
}

// SaveCheckpoint saves the projection's state at its position to the
// store, if the store keeps checkpoints (eventstore.Checkpoints); else it
// does nothing. It holds the projection's lock only to copy the tasks
// held whole (some thousand structs) and to seal the archive's maps
// (layered.seal); what grows with every task is written from outside it.
// The archive written becomes the projection's own, so that an ended task
// held in part takes its ~65 bytes there from then on, not a map entry.
// Saves go one at a time; one made before the archive is read waits for
// it (Archived).
func (p *Tasks) SaveCheckpoint(ctx context.Context) error {
	cp, ok := p.store.(eventstore.Checkpoints)
	if !ok {
		return nil
	}
	p.saving.Lock()
	defer p.saving.Unlock()
	select {
	case <-p.Archived():
	case <-ctx.Done():
		return fmt.Errorf("save checkpoint: wait for the archive: %w", ctx.Err())
	}
	start := time.Now()
	p.mu.Lock()
	h := &head{pos: p.pos, counts: maps.Clone(p.counts), ended: p.ended.clone(), saves: maps.Clone(p.saves),
		recent: make([]task.Task, len(p.recent)), live: make([]task.Task, 0, len(p.live))}
	for i, id := range p.recent {
		h.recent[i] = *p.tasks[id]
	}
	for _, t := range p.live {
		h.live = append(h.live, *t)
	}
	p.old.seal()
	p.byKey.seal()
	p.mu.Unlock()
	copied := time.Since(start)

	// Only this goroutine changes the tables and the sealed layers, and
	// only under p.mu: they can be read here without it.
	w := startRow(kindArchive, h.pos)
	var olds, keys tableBuilder
	p.old.merge(&olds)
	p.byKey.merge(&keys)
	olds.writeTo(w)
	keys.writeTo(w)
	archive, sum := endRow(w)
	oldT, keysT, err := readArchive(archive, h.pos)
	if err != nil {
		return fmt.Errorf("save checkpoint: read back the archive: %w", err) // a bug: the seal stays, the next save merges it again
	}
	slices.SortFunc(h.live, func(a, b task.Task) int { return strings.Compare(a.ID, b.ID) })
	h.archive = archiveRef{pos: h.pos, size: len(archive), crc: sum}
	headRow := encodeHead(h)

	p.mu.Lock()
	moved := p.old.sealed
	p.order = slices.DeleteFunc(p.order, func(id string) bool { _, ok := moved[id]; return ok }) // in the table now
	p.old.install(oldT)
	p.byKey.install(keysT)
	p.mu.Unlock()

	written := time.Now()
	if err := cp.SaveCheckpoint(ctx, archiveName, h.pos, archive); err != nil {
		return err
	}
	if err := cp.SaveCheckpoint(ctx, headName, h.pos, headRow); err != nil {
		return err
	}
	p.mu.Lock()
	p.saved = max(p.saved, h.pos)
	p.mu.Unlock()
	p.log.Debug("checkpoint saved", "position", h.pos, "bytes", len(headRow)+len(archive), "tasks_held_whole", len(h.recent)+len(h.live),
		"ended_in_part", oldT.n, "locked", copied.Round(time.Microsecond), "write", time.Since(written).Round(time.Microsecond),
		"took", time.Since(start).Round(time.Microsecond))
	return nil
}

// readArchive reads the tables of an archive row at pos.
func readArchive(data []byte, pos int64) (old, keys table, err error) {
	r, err := openRow(data, kindArchive, pos)
	if err != nil {
		return table{}, table{}, err
	}
	old, keys = r.table(), r.table()
	if r.err == nil && r.s != "" {
		r.fail("bytes after the end")
	}
	return old, keys, r.err
}

// loadCheckpoint puts the head of the store's checkpoint in place in a new
// projection and returns it; the caller starts reading its archive
// (loadArchive), which what needs it waits for. It returns nil when there
// is none it can use, with the reason logged.
func (p *Tasks) loadCheckpoint(ctx context.Context) *head {
	cp, ok := p.store.(eventstore.Checkpoints)
	if !ok {
		return nil
	}
	pos, data, ok, err := cp.LoadCheckpoint(ctx, headName)
	if err != nil {
		p.log.Warn("cannot read the checkpoint: folding the whole log", logkey.Error, err)
		return nil
	}
	if !ok {
		p.log.Info("no checkpoint: folding the whole log")
		return nil
	}
	h, err := decodeHead(data, pos)
	if err != nil {
		p.log.Warn("checkpoint not usable: folding the whole log", "position", pos, "reason", err)
		return nil
	}
	p.mu.Lock()
	for i := range h.recent { // pointers into h's slices: a thousand tasks copied and allocated fewer
		t := &h.recent[i]
		p.tasks[t.ID] = t
		p.recent = append(p.recent, t.ID)
	}
	for i := range h.live {
		t := &h.live[i]
		p.tasks[t.ID] = t
		p.live[t.ID] = t
	}
	p.order = slices.Sorted(maps.Keys(p.tasks))
	p.counts, p.ended, p.saves = h.counts, h.ended, h.saves
	p.pos, p.saved = h.pos, h.pos
	p.trimRecent() // a checkpoint of a server that kept more
	p.archived = make(chan struct{})
	p.mu.Unlock()
	return h
}

// loadArchive reads the archive ref names and puts its tables in place.
// An archive it cannot use leaves the projection without the ended tasks
// of before the checkpoint: it folds the whole log again (replace). It
// closes p.archived either way.
func (p *Tasks) loadArchive(ctx context.Context, ref archiveRef) {
	start := time.Now()
	old, keys, err := func() (table, table, error) {
		pos, data, ok, err := p.store.(eventstore.Checkpoints).LoadCheckpoint(ctx, archiveName)
		switch {
		case err != nil:
			return table{}, table{}, err
		case !ok:
			return table{}, table{}, errors.New("no archive")
		case pos != ref.pos || len(data) != ref.size || len(data) < 4 || binary.LittleEndian.Uint32(data[len(data)-4:]) != ref.crc:
			return table{}, table{}, fmt.Errorf("the archive at position %d is not the one the checkpoint names (at %d)", pos, ref.pos)
		}
		return readArchive(data, pos)
	}()
	if err != nil {
		p.log.Warn("checkpoint archive not usable: folding the whole log", "position", ref.pos, "reason", err)
		if err := p.replace(ctx); err != nil {
			p.log.Error("cannot fold the log: ended tasks are missing until the next start", logkey.Error, err)
			p.mu.Lock()
			close(p.archived)
			p.mu.Unlock()
		}
		return
	}
	p.mu.Lock()
	p.old.table, p.byKey.table = old, keys
	close(p.archived)
	p.mu.Unlock()
	p.log.Info("checkpoint archive read", "ended_in_part", old.n, "idempotency_keys", keys.n, "took", time.Since(start).Round(time.Microsecond))
}

// replace folds the whole log into a new projection and puts its state in
// p's place, all at once: what p applied meanwhile is in it too. It
// closes p.archived.
func (p *Tasks) replace(ctx context.Context) error {
	q := New(p.store, p.log)
	q.keep = p.keep
	if err := q.fold(ctx); err != nil {
		return err
	}
	if err := q.CatchUp(ctx, p.Position()); err != nil { // most of the way, without p's lock
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := q.CatchUp(ctx, p.pos); err != nil { // the rest
		return err
	}
	p.tasks, p.old, p.recent, p.live, p.counts, p.ended = q.tasks, q.old, q.recent, q.live, q.counts, q.ended
	p.order, p.byKey, p.saves, p.pos = q.order, q.byKey, q.saves, q.pos
	// Whatever anyone waits for may have moved: they look again.
	for id, ch := range p.waits {
		close(ch)
		delete(p.waits, id)
	}
	close(p.changed)
	p.changed = make(chan struct{})
	close(p.archived)
	return nil
}

// KeepCheckpoints saves checkpoints until ctx is done: once p.every
// events have been applied since the last (at once after a start that
// folded a longer log without one), no sooner than p.spacing after it,
// and, when ctx is done, a last one if anything was applied since. A save that fails is
// logged, not returned: the log is still the truth, and the next start
// folds more of it. Without a store that keeps checkpoints it returns at
// once.
func (p *Tasks) KeepCheckpoints(ctx context.Context) error {
	if _, ok := p.store.(eventstore.Checkpoints); !ok {
		return nil
	}
	saved := func() int64 {
		p.mu.RLock()
		defer p.mu.RUnlock()
		return p.saved
	}
	for ctx.Err() == nil {
		if p.WaitPosition(ctx, saved()+p.every) != nil {
			break
		}
		if err := p.SaveCheckpoint(ctx); err != nil && ctx.Err() == nil {
			p.log.Warn("cannot save a checkpoint", logkey.Error, err)
		}
		select {
		case <-time.After(p.spacing):
		case <-ctx.Done():
		}
	}
	if p.Position() > saved() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownSave)
		defer cancel()
		if err := p.SaveCheckpoint(sctx); err != nil {
			p.log.Warn("cannot save a checkpoint", logkey.Error, err)
		}
	}
	return nil
}
