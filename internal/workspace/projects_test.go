package workspace

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Roots must be directories of their own: not a system directory, not
// missing, not holding or inside the data root or another root (a link to
// one counts as the one it leads to).
func TestNewProjectsRefusesRoots(t *testing.T) {
	base := t.TempDir()
	d, err := Open(filepath.Join(base, "data"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	repos := filepath.Join(base, "repos")
	if err := os.MkdirAll(filepath.Join(repos, "team"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(repos, filepath.Join(base, "alias")); err != nil {
		t.Fatal(err)
	}
	if _, err := NewProjects(d, []string{repos}); err != nil {
		t.Fatalf("a root of its own: %v", err)
	}
	for _, tc := range []struct {
		roots []string
		rule  string
	}{
		{[]string{"/usr/src"}, "system directory"},
		{[]string{"/etc"}, "system directory"},
		{[]string{"relative"}, "absolute, clean"},
		{[]string{repos + "/"}, "absolute, clean"},
		{[]string{filepath.Join(base, "missing")}, "no such file"},
		{[]string{base}, "overlaps"},
		{[]string{filepath.Join(base, "data", "projects")}, "overlaps"},
		{[]string{repos, filepath.Join(repos, "team")}, "overlaps"},
		{[]string{repos, filepath.Join(base, "alias")}, "overlaps"},
	} {
		if _, err := NewProjects(d, tc.roots); err == nil || !strings.Contains(err.Error(), tc.rule) {
			t.Errorf("roots %v: %v, want an error naming %q", tc.roots, err, tc.rule)
		}
	}
}
