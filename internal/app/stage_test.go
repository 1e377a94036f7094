package app

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
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

// The replicas of a cluster share the data root and may start together (a
// Deployment's first rollout), staging the same build at once: each finds
// it whole in place, and none fails to start ("rename corral-worker.new:
// no such file or directory", "open corral-worker.new: file exists").
func TestStageTogether(t *testing.T) {
	testenv.RequireRoot(t) // a tmpfs of its own, so that staging copies
	disk := t.TempDir()
	if err := unix.Mount("tmpfs", disk, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(disk, unix.MNT_DETACH) })
	src := filepath.Join(t.TempDir(), "corral-worker")
	bin := bytes.Repeat([]byte("w"), 8<<20)
	if err := os.WriteFile(src, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for round := range 5 {
		dir := filepath.Join(disk, fmt.Sprint(round))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Go(func() { errs[i] = stageAll(dir, map[string]string{"corral-worker": src}) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "corral-worker")); err != nil || !bytes.Equal(b, bin) {
			t.Fatalf("round %d: the staged copy: %d bytes, %v", round, len(b), err)
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}
}
