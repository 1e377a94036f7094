package hostuser

import (
	"fmt"
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
