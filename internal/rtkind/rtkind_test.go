package rtkind

import (
	"slices"
	"testing"
)

func TestKinds(t *testing.T) {
	if got := Names(); !slices.Equal(got, []string{"local", "gvisor", "docker", "kubernetes"}) {
		t.Errorf("Names() = %v", got)
	}
	for name, want := range map[string]bool{"local": false, "gvisor": false, "docker": true, "kubernetes": true, "": false, "podman": false} {
		if RunsImages(name) != want {
			t.Errorf("RunsImages(%q) = %v, want %v", name, !want, want)
		}
	}
}
