//go:build linux

package gvisor

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
)

func TestValidateSpec(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "task"), 0o755); err != nil {
		t.Fatal(err)
	}
	ok := sandbox.Spec{ID: "a-1", Command: []string{"true"}, Mounts: []sandbox.Mount{{Source: "task", Target: "/task"}}}
	if err := validateSpec(ok, root); err != nil {
		t.Errorf("valid spec: %v", err)
	}
	for name, tc := range map[string]struct {
		mod   func(*sandbox.Spec)
		field string
	}{
		"runsc id":       {func(s *sandbox.Spec) { s.ID = "runsc" }, "id"},
		"sys target":     {func(s *sandbox.Spec) { s.Mounts[0].Target = "/sys" }, "mounts[0].target"},
		"under sys":      {func(s *sandbox.Spec) { s.Mounts[0].Target = "/sys/fs" }, "mounts[0].target"},
		"system target":  {func(s *sandbox.Spec) { s.Mounts[0].Target = "/usr/lib" }, "mounts[0].target"},
		"missing source": {func(s *sandbox.Spec) { s.Mounts[0].Source = "nonexistent/x" }, "mounts[0].source"},
		"host path":      {func(s *sandbox.Spec) { s.Mounts[0].Source = root + "/task" }, "mounts[0].source"},
		"bad env":        {func(s *sandbox.Spec) { s.Env = []string{"NOEQUALS"} }, "env[0]"},
	} {
		sp := ok
		sp.Mounts = append([]sandbox.Mount(nil), ok.Mounts...)
		tc.mod(&sp)
		var fe *errdefs.FieldError
		if err := validateSpec(sp, root); !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: validateSpec = %v, want an error for %s", name, err, tc.field)
		}
	}
}

// TestNewChecksTheSubreaper: the subreaper, run as root on the host, must
// be an absolute path to an executable file.
func TestNewChecksTheSubreaper(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"corral-worker", plain, filepath.Join(dir, "missing"), dir} {
		_, err := New(Options{DataRoot: dir, StateDir: filepath.Join(dir, "state"), Subreaper: bad, DisableCgroups: true}, slog.New(slog.DiscardHandler))
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("subreaper %q: New = %v, want invalid argument", bad, err)
		}
	}
}
