package projection

import (
	"encoding/binary"
	"iter"
	"maps"
	"slices"
	"sort"

	"github.com/corral-dev/corral/internal/task"
)

// The archive is what a server holds of the tasks that ended long ago:
// the ended tasks held in part (endedTask) and every idempotency key. A
// checkpoint keeps it apart from the rest (checkpoint.go), as sorted
// tables read where they lie, because it grows with every task the
// server has ever run and the rest does not: 100,000 ended tasks decoded
// into a map took 40 ms, where a start of a server that has run 1,000
// takes a few.

// table is a sorted map from strings to encoded values, read in place: a
// lookup is a binary search over the bytes, a value is decoded when it is
// read, and loading one is reading it. Each record is the key's length
// (uvarint), the key and the value.
type table struct {
	n    int
	offs string // n+1 little-endian uint32s: record i is recs[offs[i]:offs[i+1]]
	recs string
}

// span returns record i.
func (t table) span(i int) string { return t.recs[le32(t.offs, 4*i):le32(t.offs, 4*i+4)] }

// rec returns record i's key and value.
func (t table) rec(i int) (key, val string) {
	r := dec{s: t.span(i)}
	key = r.str()
	return key, r.s
}

func (t table) key(i int) string {
	k, _ := t.rec(i)
	return k
}

// search returns the index of the first key at or after key.
func (t table) search(key string) int {
	return sort.Search(t.n, func(i int) bool { return t.key(i) >= key })
}

// get returns key's value.
func (t table) get(key string) (string, bool) {
	if i := t.search(key); i < t.n {
		if k, v := t.rec(i); k == key {
			return v, true
		}
	}
	return "", false
}

// tableBuilder makes a table's bytes from records added in key order.
type tableBuilder struct {
	offs []byte
	recs enc
	n    int
}

// raw adds a record as another table holds it.
func (b *tableBuilder) raw(rec string) {
	b.mark()
	b.recs.b = append(b.recs.b, rec...)
}

// entry adds key with the value write writes.
func (b *tableBuilder) entry(key string, write func(*enc)) {
	b.mark()
	b.recs.str(key)
	write(&b.recs)
}

func (b *tableBuilder) mark() {
	b.offs = binary.LittleEndian.AppendUint32(b.offs, uint32(len(b.recs.b)))
	b.n++
}

// writeTo writes the table: its size, the offsets and the records.
func (b *tableBuilder) writeTo(w *enc) {
	w.uvarint(uint64(b.n))
	w.uvarint(uint64(len(b.recs.b)))
	w.b = append(w.b, b.offs...)
	w.u32(uint32(len(b.recs.b))) // the end of the last record
	w.b = append(w.b, b.recs.b...)
}

// table reads a table writeTo wrote, and checks that its offsets stay in
// it and its keys are sorted, once, so that no lookup can go astray.
func (r *dec) table() table {
	n, size := r.uvarint(), r.uvarint()
	if n >= 1<<31 || size >= 1<<32 {
		r.fail("table too large")
		return table{}
	}
	t := table{n: int(n), offs: r.take(4 * (n + 1)), recs: r.take(size)}
	if r.err != nil {
		return table{}
	}
	if le32(t.offs, 0) != 0 || le32(t.offs, 4*t.n) != uint32(size) {
		r.fail("table offsets")
		return table{}
	}
	prev := ""
	for i := range t.n {
		if le32(t.offs, 4*i) > le32(t.offs, 4*i+4) {
			r.fail("table offsets")
			return table{}
		}
		k := dec{s: t.span(i)}
		key := k.str()
		if k.err != nil || (i > 0 && key <= prev) {
			r.fail("table keys")
			return table{}
		}
		prev = key
	}
	return t
}

// layered is a map in up to three layers, newest first: fresh, what was
// set since the last seal; sealed, what was set before it, while the
// next archive is made of it and the table (merge); and table, the last
// archive's. A key's value is its newest layer's. Under Tasks.mu, but
// merge, which reads only the two layers nothing changes.
type layered[V any] struct {
	fresh, sealed map[string]V
	table         table
	read          func(string) V // a value from the table's bytes
	write         func(*enc, V)  // and back
}

func (l *layered[V]) get(k string) (V, bool) {
	if v, ok := l.fresh[k]; ok {
		return v, true
	}
	if v, ok := l.sealed[k]; ok {
		return v, true
	}
	if v, ok := l.table.get(k); ok {
		return l.read(v), true
	}
	var zero V
	return zero, false
}

// getAt is get of the key at index i of the table.
func (l *layered[V]) getAt(k string, i int) V {
	if v, ok := l.fresh[k]; ok {
		return v
	}
	if v, ok := l.sealed[k]; ok {
		return v
	}
	_, v := l.table.rec(i)
	return l.read(v)
}

func (l *layered[V]) has(k string) bool {
	_, fresh := l.fresh[k]
	_, sealed := l.sealed[k]
	if fresh || sealed {
		return true
	}
	_, ok := l.table.get(k)
	return ok
}

func (l *layered[V]) set(k string, v V) { l.fresh[k] = v }

// all yields every key once, with its value.
func (l *layered[V]) all() iter.Seq2[string, V] {
	return func(yield func(string, V) bool) {
		for k, v := range l.fresh {
			if !yield(k, v) {
				return
			}
		}
		for k, v := range l.sealed {
			if _, ok := l.fresh[k]; !ok && !yield(k, v) {
				return
			}
		}
		for i := range l.table.n {
			k, v := l.table.rec(i)
			_, fresh := l.fresh[k]
			_, sealed := l.sealed[k]
			if !fresh && !sealed && !yield(k, l.read(v)) {
				return
			}
		}
	}
}

func (l *layered[V]) len() int {
	n := 0
	for range l.all() {
		n++
	}
	return n
}

// seal starts a merge: what is fresh is sealed, and sets go to a new
// fresh layer. A merge that did not end in install left its sealed layer:
// the fresh one goes over it.
func (l *layered[V]) seal() {
	if l.sealed == nil {
		l.sealed, l.fresh = l.fresh, map[string]V{}
		return
	}
	maps.Copy(l.sealed, l.fresh)
	l.fresh = map[string]V{}
}

// merge writes the table and the sealed layer, the sealed value of a key
// in both, as one table into b. It copies the table's records as they
// are: it decodes none of them.
func (l *layered[V]) merge(b *tableBuilder) {
	keys := slices.Sorted(maps.Keys(l.sealed))
	t := l.table
	for i, k := 0, 0; i < t.n || k < len(keys); {
		if k == len(keys) || (i < t.n && t.key(i) < keys[k]) {
			b.raw(t.span(i))
			i++
			continue
		}
		if i < t.n && t.key(i) == keys[k] {
			i++ // replaced by the sealed value
		}
		v := l.sealed[keys[k]]
		b.entry(keys[k], func(w *enc) { l.write(w, v) })
		k++
	}
}

// install ends a merge with the table it made, which holds the sealed
// layer: it goes.
func (l *layered[V]) install(t table) {
	l.table, l.sealed = t, nil
}

func newOld() layered[endedTask] {
	return layered[endedTask]{fresh: map[string]endedTask{}, read: readEnded, write: writeEnded}
}

// newKeys holds idempotency keys: a value is a task id.
func newKeys() layered[string] {
	return layered[string]{fresh: map[string]string{},
		read:  func(s string) string { return s },
		write: func(w *enc, id string) { w.b = append(w.b, id...) }}
}

func writeEnded(w *enc, e endedTask) {
	w.str(string(e.status))
	w.varint(e.version)
	w.varint(e.queueSeq)
	w.time(e.completedAt)
	w.str(e.conversation)
	w.str(e.workspace)
	w.count(len(e.attachments), e.attachments == nil)
	for _, a := range e.attachments {
		w.str(a)
	}
	w.bool(e.savePending)
	w.varint(e.compactable)
}

// readEnded reads what writeEnded wrote. The table it comes from was
// checked whole when it was read (checksum, offsets), so a value that
// does not decode is a bug, not a bad disk: what it could read is kept.
func readEnded(s string) endedTask {
	r := dec{s: s}
	e := endedTask{status: task.Status(r.str()), version: r.varint(), queueSeq: r.varint(), completedAt: r.time(),
		conversation: r.str(), workspace: r.str()}
	if n, isNil := r.count(); !isNil {
		e.attachments = make([]string, n)
		for i := range e.attachments {
			e.attachments[i] = r.str()
		}
	}
	e.savePending = r.bool()
	e.compactable = r.varint()
	return e
}
