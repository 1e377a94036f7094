package workspace

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestCopyFileContext: the copy is exact across chunks, held to its limit
// (a file that grows past it is refused too), refuses a symbolic link, and
// stops at a done context, leaving nothing behind.
func TestCopyFileContext(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", copyChunk/16*2+3) // two chunks and some
	src, srcDir := MustOpenRoot(t, map[string]string{"big": big, "small": "hi"})
	if err := os.Symlink("small", filepath.Join(srcDir, "link")); err != nil {
		t.Fatal(err)
	}
	dst, dstDir := MustOpenRoot(t, map[string]string{})
	ctx := context.Background()
	if n, err := CopyFileContext(ctx, src, "big", dst, "out/big", int64(len(big))); err != nil || n != int64(len(big)) {
		t.Fatalf("CopyFileContext(big) = %d, %v", n, err)
	}
	if b, err := os.ReadFile(filepath.Join(dstDir, "out", "big")); err != nil || string(b) != big {
		t.Errorf("copied %d bytes, %v; want the %d of the source", len(b), err, len(big))
	}
	if _, err := CopyFileContext(ctx, src, "big", dst, "out/big2", int64(len(big)-1)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over the limit: %v, want ErrTooLarge", err)
	}
	if _, err := CopyFileContext(ctx, src, "link", dst, "out/link", 100); !errors.Is(err, ErrPathEscapes) {
		t.Errorf("a symbolic link: %v, want ErrPathEscapes", err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := CopyFileContext(done, src, "small", dst, "out/small", 100); !errors.Is(err, context.Canceled) {
		t.Errorf("a done context: %v, want context.Canceled", err)
	}
	for _, name := range []string{"big2", "link", "small"} {
		if _, err := os.Stat(filepath.Join(dstDir, "out", name)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a refused copy left out/%s: %v", name, err)
		}
	}
	mustNoTemp(t, filepath.Join(dstDir, "out"))
	if err := SyncFS(dst); err != nil {
		t.Errorf("SyncFS: %v", err)
	}
}

// TestCopyTree: a worker's tree is copied whole, its links as links
// (never followed, out of the tree or in), executable bits kept and
// nothing else of its modes, what is neither file, directory nor link
// skipped and said.
func TestCopyTree(t *testing.T) {
	src, srcDir := MustOpenRoot(t, map[string]string{"a/b/c.txt": "deep", "top": "top", "run.sh": "#!/bin/sh\n"})
	os.Chmod(filepath.Join(srcDir, "run.sh"), 0o4775) // set-uid and group write: dropped
	os.Chmod(filepath.Join(srcDir, "top"), 0o666)
	if err := os.Symlink("/etc/passwd", filepath.Join(srcDir, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../top", filepath.Join(srcDir, "a", "b", "up")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(srcDir, "a", "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst, dstDir := MustOpenRoot(t, map[string]string{})
	c, err := CopyTree(context.Background(), src, dst)
	if err != nil {
		t.Fatal(err)
	}
	if c.Files != 3 || c.Dirs != 2 || c.Links != 2 || c.Bytes != int64(len("deep")+len("top")+len("#!/bin/sh\n")) || c.SkippedTotal != 1 || c.Skipped[0] != "a/fifo" {
		t.Errorf("copied %+v", c)
	}
	if b, err := os.ReadFile(filepath.Join(dstDir, "a", "b", "c.txt")); err != nil || string(b) != "deep" {
		t.Errorf("a/b/c.txt: %q, %v", b, err)
	}
	for name, want := range map[string]string{"out": "/etc/passwd", "a/b/up": "../../top"} {
		if got, err := os.Readlink(filepath.Join(dstDir, name)); err != nil || got != want {
			t.Errorf("%s: a link to %q, %v; want one to %q", name, got, err, want)
		}
	}
	for name, want := range map[string]fs.FileMode{"run.sh": 0o755, "top": 0o644} {
		if fi, err := os.Lstat(filepath.Join(dstDir, name)); err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v, %v; want %v", name, fi.Mode(), err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(dstDir, "a", "fifo")); !os.IsNotExist(err) {
		t.Errorf("the FIFO was copied: %v", err)
	}
}

// TestCopyTreeSwaps: a worker that swaps a directory of its tree for a
// link out of it while the copy walks never gets the copy to read through
// the link.
func TestCopyTreeSwaps(t *testing.T) {
	src, srcDir := MustOpenRoot(t, map[string]string{"d/passwd": "mine"})
	out := t.TempDir()
	if err := os.WriteFile(filepath.Join(out, "passwd"), []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		d, aside := filepath.Join(srcDir, "d"), filepath.Join(srcDir, "aside")
		for {
			select {
			case <-stop:
				return
			default:
			}
			os.Rename(d, aside)
			os.Symlink(out, d)
			os.Remove(d)
			os.Rename(aside, d)
		}
	}()
	for range 200 {
		dst, dstDir := MustOpenRoot(t, map[string]string{})
		CopyTree(context.Background(), src, dst)
		// The copy may hold the link itself; no file of it may hold
		// what is behind it.
		filepath.WalkDir(dstDir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if b, _ := os.ReadFile(p); string(b) == "secret" {
					t.Fatalf("the copy read through a link the worker swapped in: %s", p)
				}
			}
			return nil
		})
	}
	close(stop)
	<-done
}
