//go:build linux

package local

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/testenv"
)

func TestValidateSpec(t *testing.T) {
	root := testenv.TempDir(t)
	if err := os.Mkdir(filepath.Join(root, "task"), 0o755); err != nil {
		t.Fatal(err)
	}
	ok := sandbox.Spec{ID: "a-1", Command: []string{"true"}, Mounts: []sandbox.Mount{{Source: "task", Target: "/task"}}}
	if err := hostuser.Default().ValidateSpec(ok, root); err != nil {
		t.Errorf("valid spec: %v", err)
	}
	for name, mod := range map[string]func(*sandbox.Spec){
		"long id":         func(s *sandbox.Spec) { s.ID = strings.Repeat("a", 64) },
		"underscore id":   func(s *sandbox.Spec) { s.ID = "a_b" },
		"unclean target":  func(s *sandbox.Spec) { s.Mounts[0].Target = "/task/../etc" },
		"root target":     func(s *sandbox.Spec) { s.Mounts[0].Target = "/" },
		"system target":   func(s *sandbox.Spec) { s.Mounts[0].Target = "/usr/lib" },
		"missing source":  func(s *sandbox.Spec) { s.Mounts[0].Source = "nonexistent/x" },
		"host path":       func(s *sandbox.Spec) { s.Mounts[0].Source = root + "/task" },
		"relative dir":    func(s *sandbox.Spec) { s.Dir = "task" },
		"bad env":         func(s *sandbox.Spec) { s.Env = []string{"NOEQUALS"} },
		"negative limit":  func(s *sandbox.Spec) { s.Limits.Pids = -1 },
		"unknown network": func(s *sandbox.Spec) { s.Network = "open" },
	} {
		sp := ok
		sp.Mounts = append([]sandbox.Mount(nil), ok.Mounts...)
		mod(&sp)
		if err := hostuser.Default().ValidateSpec(sp, root); err == nil {
			t.Errorf("%s: ValidateSpec succeeded", name)
		}
	}
}

// A root server runs bwrap as the sandbox identity, which binds mount
// sources by path: a source it cannot reach is refused at validation,
// naming the directory in the way, not left to a bwrap error.
func TestValidateSpecClosedSource(t *testing.T) {
	testenv.RequireRoot(t)
	root := t.TempDir() // 0700, the test's own
	if err := os.Mkdir(filepath.Join(root, "closed"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, ro := range []bool{true, false} {
		sp := sandbox.Spec{ID: "a-1", Command: []string{"true"}, Mounts: []sandbox.Mount{{Source: "closed", Target: "/in", ReadOnly: ro}}}
		err := hostuser.Default().ValidateSpec(sp, root)
		if err == nil || !strings.Contains(err.Error(), "closed to the sandbox identity") {
			t.Errorf("read-only %v: ValidateSpec = %v, want the source closed to the sandbox identity", ro, err)
		}
	}
}

func TestFitNoFile(t *testing.T) {
	for _, c := range []struct {
		want int
		hard uint64
		got  int
		warn bool
	}{
		{4096, 1 << 20, 4096, false},
		{4096, 4096, 4096, false},
		{4096, unix.RLIM_INFINITY, 4096, false},
		{4096, 1024, 1024, true},
		{65536, 20000, 20000, true},
	} {
		got, warn := fitNoFile(c.want, c.hard)
		if got != c.got || (warn != "") != c.warn {
			t.Errorf("fitNoFile(%d, hard %d) = %d, %q; want %d, warning %v", c.want, c.hard, got, warn, c.got, c.warn)
		}
		if c.warn && !strings.Contains(warn, fmt.Sprintf("get %d open files, not %d", c.got, c.want)) {
			t.Errorf("fitNoFile(%d, hard %d): warning %q does not say what sandboxes get", c.want, c.hard, warn)
		}
	}
}

// The filter bwrap reads is the runtime's, whole, and sealed: no holder of
// the descriptor can change it before bwrap has read it.
func TestOpenFilterSealed(t *testing.T) {
	want := []byte("a filter of some bytes")
	f, err := openFilter(want)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write([]byte("x")); err == nil {
		t.Errorf("writing to the sealed filter succeeded")
	}
	got, err := io.ReadAll(f)
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("read %q, %v; want %q", got, err, want)
	}
}
