//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestOutsideDescriptors runs the check outside a sandbox, where every
// open file is reachable by its path: it finds nothing, until the test
// holds a descriptor on a file its path no longer reaches (removed, as a
// file outside the sandbox's root is to the sandbox).
func TestOutsideDescriptors(t *testing.T) {
	if r := outsideDescriptors(); r.OK {
		t.Fatalf("found a descriptor outside with nothing left open: %s", r.Detail)
	}
	path := filepath.Join(t.TempDir(), "tasks")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if r := outsideDescriptors(); r.OK {
		t.Fatalf("found a descriptor outside on a file its path reaches: %s", r.Detail)
	}
	os.Remove(path)
	r := outsideDescriptors()
	if want := "fd " + strconv.Itoa(int(f.Fd())) + ": " + path; !r.OK || !strings.Contains(r.Detail, want) {
		t.Errorf("outsideDescriptors = %+v, want it to find %q", r, want)
	}
}
