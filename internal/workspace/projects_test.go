package workspace

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
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

// A workspace under a root that its owner swaps for a link to another
// directory, in a loop: Check and Open name what they see, and an Open
// that succeeds holds the workspace, never the link's target (a look then
// an open by name would follow a link swapped in between).
func TestOpenRefusesASwappedWorkspace(t *testing.T) {
	base := t.TempDir()
	d, err := Open(filepath.Join(base, "data"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	repos, secrets := filepath.Join(base, "repos"), filepath.Join(base, "secrets")
	app := filepath.Join(repos, "app")
	for _, dir := range []string{app, secrets} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(app, "MINE"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secrets, app+".link"); err != nil {
		t.Fatal(err)
	}
	p, err := NewProjects(d, []string{repos})
	if err != nil {
		t.Fatal(err)
	}
	pr, err := p.Resolve(app)
	if err != nil {
		t.Fatal(err)
	}
	exchange := func() {
		if err := unix.Renameat2(unix.AT_FDCWD, app, unix.AT_FDCWD, app+".link", unix.RENAME_EXCHANGE); err != nil {
			t.Error(err)
		}
	}
	exchange()
	if err := p.Check(pr); !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("Check of a link: %v, want permission denied naming the link", err)
	}
	if r, err := p.Open(pr); err == nil {
		r.Close()
		t.Errorf("Open of a link succeeded")
	}
	exchange()

	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				if n%2 == 1 {
					exchange()
				}
				done <- n
				return
			default:
				exchange()
				n++
			}
		}
	}()
	opened, refused := 0, 0
	for range 3000 {
		r, err := p.Open(pr)
		if err != nil {
			if !errors.Is(err, errdefs.ErrPermissionDenied) {
				t.Fatalf("Open: %v, want the workspace or permission denied", err)
			}
			refused++
			continue
		}
		if _, err := r.Stat("MINE"); err != nil {
			t.Errorf("Open gave a directory without the workspace's file: %v", err)
		}
		r.Close()
		opened++
	}
	close(stop)
	swaps := <-done
	t.Logf("%d opened, %d refused, %d swaps", opened, refused, swaps)
	if opened == 0 || refused == 0 {
		t.Errorf("%d opened, %d refused: the race did not happen", opened, refused)
	}
}
