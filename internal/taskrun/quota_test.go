package taskrun

import (
	"os"
	"path/filepath"
	"testing"
)

// A directory a worker removes while the quota walk reads it (Claude
// Code's lock directories come and go) counts as empty: it is no error,
// which would end the task as over its quota.
func TestWalkSkipsDirectoryRemovedWhileRead(t *testing.T) {
	dir := t.TempDir()
	lock := filepath.Join(dir, ".claude.json.lock")
	if err := os.Mkdir(lock, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(lock)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Remove(lock); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadDir(1); err == nil {
		t.Skip("this file system reads a removed directory without an error")
	}
	w := walker{maxBytes: 1 << 20, maxEntries: 100}
	if err := w.dir(f, 1); err != nil {
		t.Errorf("walk of a directory removed while read: %v, want none", err)
	}
}
