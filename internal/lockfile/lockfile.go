// Package lockfile is an exclusive flock on a file, the way one Corral
// server claims its data root (and SQLite's database) for itself: the
// kernel drops it when the process dies, so a crashed server never leaves
// a stale lock.
package lockfile

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// File is an exclusive flock on a file. The file itself is never removed:
// removing it would let a second process lock a new inode while the first
// still holds the old one.
type File struct {
	f *os.File
}

// Acquire locks path (made if missing), waiting a moment for a holder that
// is dying; one held by a live process is errdefs.ErrFailedPrecondition,
// saying the data root is in use and by which pid.
func Acquire(path string) (*File, error) {
	return acquire(path, syscall.LOCK_EX)
}

// AcquireShared is Acquire for one of several processes that may hold
// path together (the replicas of a cluster sharing a data root), never
// beside one that holds it alone.
func AcquireShared(path string) (*File, error) {
	return acquire(path, syscall.LOCK_SH)
}

// TryAcquire locks path (made if missing) if no other process holds it,
// and returns nil, nil if one does.
func TryAcquire(path string) (*File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close() // the lock's answer is the one that matters
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return &File{f: f}, nil
}

func acquire(path string, how int) (*File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	if err := flockWaiting(f, how, lockWait); err != nil {
		holder := ""
		if b, rerr := os.ReadFile(path); rerr == nil && len(strings.TrimSpace(string(b))) > 0 {
			holder = " (pid " + strings.TrimSpace(string(b)) + ")"
		}
		_ = f.Close() // the lock error is the one that matters
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: data root is in use by another corral server%s: %w",
				path, holder, errdefs.ErrFailedPrecondition)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// The pid is only for the error message above; the flock is the lock.
	// (Shared holders leave it: each would write over the others'.)
	if how == syscall.LOCK_EX {
		if err := f.Truncate(0); err == nil {
			_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0) // best effort, see above
		}
	}
	return &File{f: f}, nil
}

// lockWait is how long Acquire waits for a lock that is held. A
// server killed with SIGKILL can leave its lock held a moment longer by a
// child it was starting: between its fork and its exec the child holds a
// copy of every descriptor, the lock's too, until the exec closes them.
const lockWait = 2 * time.Second

// flockWaiting takes a flock on f (how: LOCK_EX or LOCK_SH), trying again
// for up to wait while another holds it.
func flockWaiting(f *os.File, how int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Release unlocks and closes the file. It is safe on a nil File and when
// called twice.
func (l *File) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	f := l.f
	l.f = nil
	// Closing the descriptor drops the flock too; unlocking first is explicit.
	uerr := syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	if err := errors.Join(uerr, f.Close()); err != nil {
		return fmt.Errorf("release lock %s: %w", f.Name(), err)
	}
	return nil
}
