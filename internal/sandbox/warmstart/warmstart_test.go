package warmstart

import (
	"slices"
	"testing"
)

// A start's variables replace the image's of the same name; the image's
// others stay, before them.
func TestOverlay(t *testing.T) {
	got := Overlay([]string{"PATH=/image/bin", "LANG=C.UTF-8", "EMPTY="}, []string{"PATH=/usr/bin", "TASK=1"})
	want := []string{"LANG=C.UTF-8", "EMPTY=", "PATH=/usr/bin", "TASK=1"}
	if !slices.Equal(got, want) {
		t.Errorf("Overlay = %q, want %q", got, want)
	}
	if got := Overlay(nil, []string{"A=1"}); !slices.Equal(got, []string{"A=1"}) {
		t.Errorf("Overlay(nil, A=1) = %q", got)
	}
}
