package workspace

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A FIFO where a worker's file was expected is refused at once, never
// waited on: opening one for reading blocks until a writer comes.
func TestFIFORefusedWithoutBlocking(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mkfifo(filepath.Join(dir, "f.txt"), 0o644); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	dst, err := os.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	for name, fn := range map[string]func() error{
		"OpenFile": func() error { _, _, err := OpenFile(root, "f.txt"); return err },
		"ReadFile": func() error { _, _, err := ReadFile(root, "f.txt", 1<<20); return err },
		"CopyFile": func() error { _, err := CopyFile(root, "f.txt", dst, "f.txt", 1<<20); return err },
		"DetectType": func() error {
			if DetectType(root, "f.unknownext") != "application/octet-stream" {
				return nil // it read something
			}
			return os.ErrInvalid
		},
	} {
		done := make(chan error, 1)
		go func() { done <- fn() }()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("%s of a FIFO succeeded", name)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s of a FIFO blocked", name)
		}
	}
}

// A worker exchanging a regular file and a FIFO (renameat2
// RENAME_EXCHANGE) while the server reads: every read returns promptly
// with the file or a refusal, never blocks on the FIFO.
func TestFileFIFOSwapNeverBlocks(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte("content"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "b.txt"), 0o644); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			unix.Renameat2(unix.AT_FDCWD, filepath.Join(dir, "a.txt"), unix.AT_FDCWD, filepath.Join(dir, "b.txt"), unix.RENAME_EXCHANGE)
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	reads, refused := 0, 0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		for _, name := range []string{"a.txt", "b.txt"} {
			done := make(chan error, 1)
			var got []byte
			go func() {
				var err error
				got, _, err = ReadFile(root, name, 1<<10)
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					refused++
					continue
				}
				if string(got) != "content" {
					t.Fatalf("read %q from %s", got, name)
				}
				reads++
			case <-time.After(5 * time.Second):
				t.Fatalf("ReadFile(%s) blocked while a file and a FIFO were being swapped", name)
			}
		}
	}
	if reads == 0 || refused == 0 {
		t.Errorf("%d reads and %d refusals: the swap did not race the reads", reads, refused)
	}
	t.Logf("%d reads of the file, %d refusals of the FIFO, none blocked", reads, refused)
}

// A name near NAME_MAX can be written atomically: the temporary name does
// not grow with it.
func TestWriteAtomicLongName(t *testing.T) {
	root, err := os.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	name := strings.Repeat("n", 252) + ".py"
	if err := WriteFileAtomic(root, name, []byte("x"), 0o644); err != nil {
		t.Fatalf("WriteFileAtomic of a %d-byte name: %v", len(name), err)
	}
}
