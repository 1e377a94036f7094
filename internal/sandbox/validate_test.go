package sandbox_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
)

func TestSpecValidate(t *testing.T) {
	ok := sandbox.Spec{
		ID:      "a-1",
		Command: []string{"true"},
		Dir:     "/task",
		Env:     []string{"A=1", "B="},
		Mounts:  []sandbox.Mount{{Source: "nonexistent/is/fine/here", Target: "/task"}},
		Network: sandbox.NetworkEgress,
	}
	if err := ok.Validate(); err != nil {
		t.Errorf("valid spec: %v", err)
	}
	for name, tc := range map[string]struct {
		mod   func(*sandbox.Spec)
		field string
	}{
		"empty id":          {func(s *sandbox.Spec) { s.ID = "" }, "id"},
		"long id":           {func(s *sandbox.Spec) { s.ID = strings.Repeat("a", 64) }, "id"},
		"underscore id":     {func(s *sandbox.Spec) { s.ID = "a_b" }, "id"},
		"no command":        {func(s *sandbox.Spec) { s.Command = nil }, "command"},
		"empty argv0":       {func(s *sandbox.Spec) { s.Command = []string{""} }, "command"},
		"relative dir":      {func(s *sandbox.Spec) { s.Dir = "task" }, "dir"},
		"bad env":           {func(s *sandbox.Spec) { s.Env = []string{"NOEQUALS"} }, "env[0]"},
		"empty env key":     {func(s *sandbox.Spec) { s.Env = []string{"A=1", "=x"} }, "env[1]"},
		"unclean target":    {func(s *sandbox.Spec) { s.Mounts[0].Target = "/task/../x" }, "mounts[0].target"},
		"root target":       {func(s *sandbox.Spec) { s.Mounts[0].Target = "/" }, "mounts[0].target"},
		"system target":     {func(s *sandbox.Spec) { s.Mounts[0].Target = "/usr/lib" }, "mounts[0].target"},
		"etc target":        {func(s *sandbox.Spec) { s.Mounts[0].Target = "/etc" }, "mounts[0].target"},
		"absolute source":   {func(s *sandbox.Spec) { s.Mounts[0].Source = "/etc" }, "mounts[0].source"},
		"escaping source":   {func(s *sandbox.Spec) { s.Mounts[0].Source = "tasks/../../etc" }, "mounts[0].source"},
		"empty source":      {func(s *sandbox.Spec) { s.Mounts[0].Source = "" }, "mounts[0].source"},
		"negative limit":    {func(s *sandbox.Spec) { s.Limits.Pids = -1 }, "limits"},
		"negative wall":     {func(s *sandbox.Spec) { s.Limits.WallClock = -1 }, "limits"},
		"unknown network":   {func(s *sandbox.Spec) { s.Network = "open" }, "network"},
		"nul in target":     {func(s *sandbox.Spec) { s.Mounts[0].Target = "/ta\x00sk" }, "mounts[0].target"},
		"lookalike of /usr": {func(s *sandbox.Spec) { s.Mounts[0].Target = "/usrx" }, ""},
	} {
		sp := ok
		sp.Mounts = append([]sandbox.Mount(nil), ok.Mounts...)
		tc.mod(&sp)
		err := sp.Validate()
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		var fe *errdefs.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: Validate() = %v, want an error for field %s", name, err, tc.field)
		}
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v is not ErrInvalidArgument", name, err)
		}
	}
}

func TestSpecValidateReportsAll(t *testing.T) {
	err := sandbox.Spec{ID: "A", Network: "open"}.Validate()
	for _, want := range []string{"id", "command", "network"} {
		if err == nil || !strings.Contains(err.Error(), want+": ") {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
}

func TestCleanAbs(t *testing.T) {
	for p, want := range map[string]bool{"/a/b": true, "/": true, "a": false, "/a/": false, "/a/../b": false, "": false} {
		if got := sandbox.CleanAbs(p); got != want {
			t.Errorf("CleanAbs(%q) = %v, want %v", p, got, want)
		}
	}
}
