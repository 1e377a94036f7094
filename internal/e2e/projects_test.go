//go:build integration

package e2e_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
)

// TestWorkspaces: named workspaces are created (with git when asked),
// listed and browsed read-only; every path that is not a workspace name
// is refused with the rule it breaks, and nothing is created.
func TestWorkspaces(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()
	p, err := s.client.CreateProject(ctx, service.CreateProjectRequest{Name: "myapp", InitGit: true})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Git || p.Name != "myapp" || p.Path != "/workspace/project" {
		t.Errorf("created %+v, want myapp with git", p)
	}
	if _, err := s.client.CreateProject(ctx, service.CreateProjectRequest{Name: "myapp"}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("creating myapp again: %v, want 409", err)
	}
	dir := filepath.Join(s.data, "projects", "myapp")
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("# my app\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ps, err := s.client.ListProjects(ctx)
	if err != nil || len(ps) != 1 || ps[0].Name != "myapp" {
		t.Errorf("ListProjects = %+v, %v", ps, err)
	}
	ents, err := s.client.ListProjectFiles(ctx, "myapp", ".", false)
	var names []string
	for _, e := range ents {
		names = append(names, e.Path)
	}
	if err != nil || !strings.Contains(strings.Join(names, " "), "README.md") {
		t.Errorf("files of myapp: %v, %v", names, err)
	}
	if f, err := s.client.ReadProjectFile(ctx, "myapp", "README.md"); err != nil || f.Content != "# my app\n" {
		t.Errorf("README.md: %+v, %v", f, err)
	}
	if got := s.runCLI(t, "workspaces", "cat", "--server", s.url, "myapp", "README.md"); got != "# my app\n" {
		t.Errorf("corral workspaces cat: %q", got)
	}

	// A link out of projects/ is no workspace, and a link inside one leads
	// nowhere outside it.
	if err := os.Symlink("/etc", filepath.Join(s.data, "projects", "evil")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "passwd")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.ListProjectFiles(ctx, "evil", ".", false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a symlink out as a workspace: %v, want 404", err)
	}
	if f, err := s.client.ReadProjectFile(ctx, "myapp", "passwd"); err == nil || strings.Contains(f.Content, "root:") {
		t.Errorf("a symlink out inside a workspace: %+v, %v; want refused", f, err)
	}

	for _, tc := range []struct {
		name string
		want error
		rule string
	}{
		{"/", errdefs.ErrPermissionDenied, "system directory"},
		{"/usr", errdefs.ErrPermissionDenied, "system directory"},
		{"/etc", errdefs.ErrPermissionDenied, "system directory"},
		{"/srv/repos/app", errdefs.ErrPermissionDenied, "outside the data root"},
		{"../x", errdefs.ErrInvalidArgument, "no .. or /"},
		{"a/b", errdefs.ErrInvalidArgument, "no .. or /"},
		{"Bad", errdefs.ErrInvalidArgument, "lowercase"},
		{"a\x00b", errdefs.ErrInvalidArgument, "NUL"},
		{strings.Repeat("a", 65), errdefs.ErrInvalidArgument, "at most 64"},
		{strings.Repeat("a", 5000), errdefs.ErrInvalidArgument, "at most 4096"},
	} {
		_, err := s.client.CreateProject(ctx, service.CreateProjectRequest{Name: tc.name})
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.rule) {
			t.Errorf("create %.20q: %v, want %v naming %q", tc.name, err, tc.want, tc.rule)
		}
	}
	ents2, _ := os.ReadDir(filepath.Join(s.data, "projects"))
	if len(ents2) != 2 { // myapp and the evil link
		t.Errorf("projects/ holds %d entries after the refusals, want 2", len(ents2))
	}
}
