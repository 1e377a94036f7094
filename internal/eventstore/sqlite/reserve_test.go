package sqlite

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/storetest"
)

// TestReserveRecordsAfterDiskFull: a disk filled to its last block fails
// a commit, and the store gives back its reserve, so that the next commit
// (a task's end, retried) fits; once there is room again, the reserve is
// made again.
func TestReserveRecordsAfterDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small filesystem needs root")
	}
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=24m,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	s := MustOpen(t, filepath.Join(mnt, "corral.db"))
	if fi, err := os.Stat(s.reservePath()); err != nil || fi.Size() != reserveBytes {
		t.Fatalf("the reserve after Open: %v, %v; want %d bytes", fi, err, reserveBytes)
	}
	p := eventstore.Proposed{Type: "t", SchemaVersion: 1, Data: []byte(`{"summary":"` + strings.Repeat("x", 2000) + `"}`)}
	storetest.MustAppend(t, s, "a", 0, p)

	filler := filepath.Join(mnt, "filler")
	if out, err := exec.Command("dd", "if=/dev/zero", "of="+filler, "bs=1M").CombinedOutput(); err == nil || !strings.Contains(string(out), "No space left") {
		t.Fatalf("dd filling the disk: %v %s", err, out)
	}
	// Appends until one finds the disk full (the WAL may have had room
	// for a few), then the next fits in the reserve's space.
	var full error
	for i := 0; i < 1000 && full == nil; i++ {
		_, full = s.Append(t.Context(), "a", eventstore.AnyVersion, p)
	}
	if !errors.Is(full, errdefs.ErrNoSpace) {
		t.Fatalf("append on a full disk: %v, want ErrNoSpace", full)
	}
	if _, err := os.Stat(s.reservePath()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the reserve after a full disk: %v, want it given back", err)
	}
	if _, err := s.Append(t.Context(), "a", eventstore.AnyVersion, p); err != nil {
		t.Fatalf("append after the reserve was given back: %v", err)
	}

	// Room again: the reserve comes back at a commit after reserveRetry
	// (moved back here rather than waited for).
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	s.reserveAt = time.Now().Add(-reserveRetry) // the writer is idle between appends
	storetest.MustAppend(t, s, "b", 0, p)
	if fi, err := os.Stat(s.reservePath()); err != nil || fi.Size() != reserveBytes {
		t.Errorf("the reserve once there is room: %v, %v; want %d bytes", fi, err, reserveBytes)
	}
}
