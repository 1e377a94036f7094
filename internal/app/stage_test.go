package app

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/testenv"
)

// A data root on another file system than the binaries gets copies of
// them; a restart of the same build then needs no room for a second copy
// (a full data disk stopped every start: "stage corral-worker: no space
// left on device"). A new build that does not fit says what to free.
func TestStageOnAFullDisk(t *testing.T) {
	testenv.RequireRoot(t) // a small tmpfs of its own
	disk := t.TempDir()
	if err := unix.Mount("tmpfs", disk, "tmpfs", 0, "size=3m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(disk, unix.MNT_DETACH) })
	src := filepath.Join(t.TempDir(), "corral-worker")
	bin := bytes.Repeat([]byte("w"), 2<<20)
	if err := os.WriteFile(src, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(disk, "corral-worker")
	for i := range 3 { // the first start copies; the next ones find it
		if err := stage(src, dst); err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
	}
	if b, err := os.ReadFile(dst); err != nil || !bytes.Equal(b, bin) {
		t.Fatalf("the staged copy: %d bytes, %v", len(b), err)
	}
	bin[0] = 'x' // another build, of the same size
	if err := os.WriteFile(src, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	err := stage(src, dst)
	if !errors.Is(err, errdefs.ErrNoSpace) {
		t.Fatalf("a new build on a full disk: %v, want no space naming what to free", err)
	}
	if b, _ := os.ReadFile(dst); b[0] != 'w' {
		t.Errorf("the staged binary changed although the new one did not fit")
	}
	if _, err := os.Stat(dst + ".new"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a partial copy left: %v", err)
	}
}
