package workspace

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzResolve feeds arbitrary paths to every reading and writing entry
// point over a root that has a symlink pointing outside it. Whatever the
// path, nothing outside the root is read or written, and no name a write
// creates has a control character or is not UTF-8.
func FuzzResolve(f *testing.F) {
	for _, seed := range []string{
		"", ".", "a.txt", "../outside.txt", "a/../../outside.txt", "/etc/passwd", "/workspace/shared/a.txt",
		"/workspace/shared-evil/a.txt", "link/outside.txt", "out", "out/x", "dir/../a.txt", "a.txt\x00.png",
		"..\\outside.txt", "....//outside.txt", "%2e%2e/outside.txt", "dir/./../../outside.txt", "//a.txt",
		"dir/a\nb.txt", "c1\u0085.txt", "bad\xff.txt",
	} {
		f.Add(seed)
	}
	secret := []byte("FUZZ-OUTSIDE-SECRET")
	f.Fuzz(func(t *testing.T, p string) {
		base := t.TempDir()
		outside := filepath.Join(base, "outside")
		inside := filepath.Join(base, "inside")
		for _, d := range []string{outside, filepath.Join(inside, "dir")} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		os.WriteFile(filepath.Join(outside, "outside.txt"), secret, 0o644)
		os.WriteFile(filepath.Join(inside, "a.txt"), []byte("inside"), 0o644)
		os.Symlink(outside, filepath.Join(inside, "link"))
		os.Symlink(filepath.Join(outside, "outside.txt"), filepath.Join(inside, "out"))
		root, err := os.OpenRoot(inside)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()

		if data, _, err := ReadFile(root, p, 1<<20); err == nil && bytes.Contains(data, secret) {
			t.Fatalf("ReadFile(%q) read outside the root", p)
		}
		if f, _, err := OpenFile(root, p); err == nil {
			f.Close()
			if c, err := Clean(p); err != nil || strings.HasPrefix(c, "link") || c == "out" {
				t.Fatalf("OpenFile(%q) opened %q through a link or an unclean path", p, c)
			}
		}
		if ents, err := List(root, p, true); err == nil {
			for _, e := range ents {
				if strings.Contains(e.Path, "outside.txt") {
					t.Fatalf("List(%q) listed outside the root: %v", p, ents)
				}
			}
		}
		WriteFileAtomic(root, p, []byte("written"), 0o644)
		if c, err := Clean(p); err == nil && c != "." {
			WriteFileAtomic(root, c, []byte("written"), 0o644)
		}
		got, _ := os.ReadFile(filepath.Join(outside, "outside.txt"))
		if !bytes.Equal(got, secret) {
			t.Fatalf("a write of %q changed a file outside the root", p)
		}
		ents, _ := os.ReadDir(outside)
		if len(ents) != 1 {
			t.Fatalf("a write of %q created a file outside the root: %v", p, ents)
		}
		filepath.WalkDir(inside, func(name string, _ fs.DirEntry, _ error) error {
			if err := CheckName(name); err != nil {
				t.Fatalf("a write of %q created %q: %v", p, name, err)
			}
			return nil
		})
	})
}
