//go:build linux

package local

import (
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/sandbox"
)

func TestValidateSpec(t *testing.T) {
	ok := sandbox.Spec{ID: "a-1", Command: []string{"true"}, Mounts: []sandbox.Mount{{Source: t.TempDir(), Target: "/task"}}}
	if err := validateSpec(ok); err != nil {
		t.Errorf("valid spec: %v", err)
	}
	for name, mod := range map[string]func(*sandbox.Spec){
		"long id":         func(s *sandbox.Spec) { s.ID = strings.Repeat("a", 64) },
		"underscore id":   func(s *sandbox.Spec) { s.ID = "a_b" },
		"unclean target":  func(s *sandbox.Spec) { s.Mounts[0].Target = "/task/../etc" },
		"root target":     func(s *sandbox.Spec) { s.Mounts[0].Target = "/" },
		"system target":   func(s *sandbox.Spec) { s.Mounts[0].Target = "/usr/lib" },
		"missing source":  func(s *sandbox.Spec) { s.Mounts[0].Source = "/nonexistent/x" },
		"relative dir":    func(s *sandbox.Spec) { s.Dir = "task" },
		"bad env":         func(s *sandbox.Spec) { s.Env = []string{"NOEQUALS"} },
		"negative limit":  func(s *sandbox.Spec) { s.Limits.Pids = -1 },
		"unknown network": func(s *sandbox.Spec) { s.Network = "open" },
	} {
		sp := ok
		sp.Mounts = append([]sandbox.Mount(nil), ok.Mounts...)
		mod(&sp)
		if err := validateSpec(sp); err == nil {
			t.Errorf("%s: validateSpec succeeded", name)
		}
	}
}
