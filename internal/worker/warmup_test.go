package worker

import (
	"os"
	"slices"
	"testing"
)

// TestWarmUpLeavesNothingOpen: a warm sandbox's worker holds nothing of
// what it warmed up (the pidfd of its own, the loopback listener) once
// WarmUp returns.
func TestWarmUpLeavesNothingOpen(t *testing.T) {
	fds := func() []string {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
				names = append(names, e.Name()+" "+target)
			}
		}
		slices.Sort(names)
		return names
	}
	before := fds()
	WarmUp()
	if after := fds(); !slices.Equal(before, after) {
		t.Errorf("descriptors before WarmUp %q, after %q", before, after)
	}
}
