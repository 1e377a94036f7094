package projection

import (
	"fmt"
	"maps"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestLayered: a key's value is its newest layer's, before a seal, during
// a merge, after its install, and after a seal whose merge was never
// installed (a save that failed); a merged table holds every key once, in
// order, and reads back as it was written.
func TestLayered(t *testing.T) {
	l := newKeys()
	want := map[string]string{}
	set := func(k, v string) {
		l.set(k, v)
		want[k] = v
	}
	check := func(what string) {
		t.Helper()
		for k, v := range want {
			if got, ok := l.get(k); !ok || got != v || !l.has(k) {
				t.Fatalf("%s: get(%s) = %q, %v; want %q", what, k, got, ok, v)
			}
		}
		if _, ok := l.get("missing"); ok || l.has("missing") {
			t.Fatalf("%s: a key never set is there", what)
		}
		if diff := cmp.Diff(want, maps.Collect(l.all())); diff != "" || l.len() != len(want) {
			t.Fatalf("%s: all (-want +got), len %d:\n%s", what, l.len(), diff)
		}
	}
	merge := func() {
		t.Helper()
		var b tableBuilder
		l.merge(&b)
		var w enc
		b.writeTo(&w)
		r := dec{s: string(w.b)}
		tab := r.table()
		if r.err != nil || r.s != "" {
			t.Fatalf("read back the merged table: %v, %d bytes left", r.err, len(r.s))
		}
		for i := 1; i < tab.n; i++ {
			if tab.key(i-1) >= tab.key(i) {
				t.Fatalf("merged table out of order at %d: %q, %q", i, tab.key(i-1), tab.key(i))
			}
		}
		l.install(tab)
	}
	for i := range 5 {
		set(fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i))
	}
	check("fresh")
	l.seal()
	set("k2", "newer")
	set("k9", "v9")
	check("sealed")
	merge()
	check("merged")
	l.seal()
	set("k0", "newest")
	set("k5", "v5")
	check("sealed over a table")
	l.seal() // its merge never came
	set("k1", "after two seals")
	check("sealed twice")
	merge()
	check("merged after two seals")
	if l.table.n != len(want) || len(l.fresh) != 1 || l.sealed != nil {
		t.Errorf("table of %d, %d fresh, sealed %v; want %d, 1, nil", l.table.n, len(l.fresh), l.sealed, len(want))
	}
}

// TestTableRefusesBadBytes: a table whose offsets leave it, or whose keys
// are out of order, is an error when it is read, never a lookup astray.
func TestTableRefusesBadBytes(t *testing.T) {
	var b tableBuilder
	for _, k := range []string{"a", "b", "c"} {
		b.entry(k, func(w *enc) { w.str("value of " + k) })
	}
	var w enc
	b.writeTo(&w)
	good := string(w.b)
	if r := (dec{s: good}); r.table().n != 3 || r.err != nil {
		t.Fatalf("the good table: %v", r.err)
	}
	for name, bad := range map[string]string{
		"truncated":           good[:len(good)-1],
		"offset past the end": good[:2] + "\xff" + good[3:],
		"keys out of order":   string(swapKeys(w.b)),
	} {
		r := dec{s: bad}
		if r.table(); r.err == nil {
			t.Errorf("%s: read without an error", name)
		}
	}
}

// swapKeys is the table's bytes with its first two keys, of one byte
// each, swapped.
func swapKeys(b []byte) []byte {
	b = append([]byte(nil), b...)
	r := dec{s: string(b)}
	tab := r.table()
	first := len(b) - len(tab.recs) // the records start here, each a length byte and its key
	second := first + int(le32(tab.offs, 4))
	b[first+1], b[second+1] = b[second+1], b[first+1]
	return b
}
