package workspace

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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
