//go:build linux

package local

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
)

// TestDestroyWithoutStateRemovesCgroups: a sandbox whose state dir is gone
// (a server that crashed, a data root removed) still has its cgroups,
// named after it; Destroy by id removes them.
func TestDestroyWithoutStateRemovesCgroups(t *testing.T) {
	r, newRuntime := MustNew(t)
	if r.cg == nil {
		t.Skip("no cgroups here")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id := sandboxtest.NewID(t)
	if _, err := r.Create(ctx, sandbox.Spec{ID: id, Command: []string{"/bin/true"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Wait(ctx, id); err != nil {
		t.Fatal(err)
	}
	dirs := r.cg.Dirs(id)
	for _, d := range dirs {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("cgroup %s of a created sandbox: %v", d, err)
		}
	}
	if err := os.RemoveAll(r.Dir.Path(id)); err != nil {
		t.Fatal(err)
	}
	if err := newRuntime().Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup %s left behind: %v", d, err)
		}
	}
}
