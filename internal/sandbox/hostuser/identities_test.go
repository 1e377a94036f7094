package hostuser

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// Sandboxes started at once each get an identity of their own, in the
// range, with the sandboxes' group; a sandbox asking again gets its own
// back (a restart recovers it), also after its lease moved to a task's
// name; a released identity is free again.
func TestIdentities(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("each sandbox has its own identity under a root server only")
	}
	dir := filepath.Join(t.TempDir(), "ids")
	p := NewIdentities(Default(), dir)
	if p.Fixed() != (Identity{}) {
		t.Fatalf("the default identity under root is fixed: %v", p.Fixed())
	}
	const n = 200
	got := make([]Identity, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id, err := p.Take(fmt.Sprintf("task-%d", i))
			if err != nil {
				t.Error(err)
			}
			got[i] = id
		})
	}
	wg.Wait()
	seen := map[int]bool{}
	for i, id := range got {
		if seen[id.UID] || id.GID != Reserved || !InRange(id.UID) || id.UID == Reserved {
			t.Fatalf("sandbox %d: %v (taken before: %v)", i, id, seen[id.UID])
		}
		seen[id.UID] = true
	}
	// Another instance over the same leases (a restarted server).
	again := NewIdentities(Default(), dir)
	if id, err := again.Take("task-7"); err != nil || id != got[7] {
		t.Errorf("task-7 again: %v %v, want %v", id, err, got[7])
	}
	if err := again.Rename("task-7", "task-seven"); err != nil {
		t.Fatal(err)
	}
	if id, err := again.Take("task-seven"); err != nil || id != got[7] {
		t.Errorf("after the rename: %v %v, want %v", id, err, got[7])
	}
	for i := range n {
		name := fmt.Sprintf("task-%d", i)
		if i == 7 {
			name = "task-seven"
		}
		if err := again.Release(name); err != nil {
			t.Fatal(err)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("%d leases left after every release", len(ents))
	}
	// A configured identity, or a server that is not root: that one, for all.
	fixed := NewIdentities(Identity{UID: 999, GID: 999}, dir)
	if id, _ := fixed.Take("x"); id != (Identity{UID: 999, GID: 999}) || fixed.Fixed() != id {
		t.Errorf("a configured identity: %v", id)
	}
}

// A sandbox restored from another's memory holds that one's identity with
// it: the uid stays leased until the last of them lets go, never to a
// third sandbox meanwhile, and a restart finds every holder.
func TestShare(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("each sandbox has its own identity under a root server only")
	}
	dir := filepath.Join(t.TempDir(), "ids")
	p := NewIdentities(Default(), dir)
	if _, err := p.Share("sess-none", "sess-fork"); err == nil {
		t.Fatal("shared the identity of a sandbox that holds none")
	}
	src, err := p.Take("sess-src")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"sess-f1", "sess-f2"} {
		if got, err := p.Share("sess-src", f); err != nil || got != src {
			t.Fatalf("share with %s: %v %v, want %v", f, got, err, src)
		}
	}
	if got, err := p.Share("sess-src", "sess-f1"); err != nil || got != src {
		t.Errorf("shared again: %v %v", got, err)
	}
	other, err := p.Take("sess-other")
	if err != nil || other == src {
		t.Fatalf("another sandbox: %v %v, while %v is leased", other, err, src)
	}
	if _, err := p.Share("sess-src", "sess-other"); err == nil {
		t.Error("a sandbox holding its own identity was given another's")
	}
	again := NewIdentities(Default(), dir)
	if err := again.Release("sess-src"); err != nil {
		t.Fatal(err)
	}
	if got, err := again.Take("sess-f2"); err != nil || got != src {
		t.Errorf("a fork after its source let go: %v %v, want %v", got, err, src)
	}
	if err := again.Rename("sess-f2", "sess-f2b"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"sess-f1", "sess-f2b", "sess-other"} {
		if err := again.Release(f); err != nil {
			t.Fatal(err)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("%d leases left after every holder let go", len(ents))
	}
}

// An instance remembers the lease it saw for each sandbox, but reads it
// before it trusts it: a lease another instance moved meanwhile (a
// restarted server beside one stopping) is looked for again, and the
// uid that now leases another sandbox is left to that one.
func TestLeaseSeenIsChecked(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("each sandbox has its own identity under a root server only")
	}
	dir := filepath.Join(t.TempDir(), "ids")
	p := NewIdentities(Default(), dir)
	first, err := p.Take("task-a")
	if err != nil {
		t.Fatal(err)
	}
	// Elsewhere: task-a's uid went to task-b, and task-a leases another.
	moved := first.UID + 1
	if moved > Reserved+Span {
		moved = Reserved + 1
	}
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprint(first.UID)), []byte("task-b"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprint(moved)), []byte("task-a"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := p.Take("task-a"); err != nil || got.UID != moved {
		t.Fatalf("task-a after its lease moved: %v %v, want uid %d", got, err, moved)
	}
	if err := p.Rename("task-b", "task-c"); err != nil {
		t.Fatal(err)
	}
	if err := p.Release("task-a"); err != nil {
		t.Fatal(err)
	}
	for uid, want := range map[int]string{first.UID: "task-c", moved: ""} {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprint(uid)))
		if string(b) != want || (want == "" && !errors.Is(err, fs.ErrNotExist)) {
			t.Errorf("lease %d: %q (%v), want %q", uid, b, err, want)
		}
	}
}

// BenchmarkRename moves a lease back and forth among 200 (a claim's
// rename, then a destroy's release reads it the same way) from an
// instance that saw it last, and, the nearest alternative, from a fresh
// instance, which reads every lease until it finds it.
//
//	go test -run '^$' -bench Rename ./internal/sandbox/hostuser
func BenchmarkRename(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("each sandbox has its own identity under a root server only")
	}
	dir := filepath.Join(b.TempDir(), "ids")
	p := NewIdentities(Default(), dir)
	for i := range 200 {
		if _, err := p.Take(fmt.Sprintf("warm-%d", i)); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		of   func() *Identities
	}{
		{"seen", func() *Identities { return p }},
		{"scan", func() *Identities { return NewIdentities(Default(), dir) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			names := [2]string{"warm-100", "task-100"}
			for i := 0; b.Loop(); i++ {
				if err := c.of().Rename(names[i%2], names[(i+1)%2]); err != nil {
					b.Fatal(err)
				}
			}
			if b.N%2 == 1 {
				p.Rename(names[1], names[0])
			}
		})
	}
}
