package lockfile

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// A held lock is refused, saying the data root is in use, and taken once
// released.
func TestAcquireRefusesAHeldLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db.lock")
	first, err := Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(path); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("a second Acquire: %v, want ErrFailedPrecondition", err)
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	second, err := Acquire(path)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	second.Release()
}

// A lock held a moment longer than its server lived (a child it was
// starting holds a copy of the lock's descriptor until its exec) is taken
// once it is let go: a start right after a kill -9 once failed, the data
// root "in use" by the dead server.
func TestLockWaitsForADyingHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db.lock")
	held, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(held.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		held.Close() // the child's exec
	}()
	l, err := Acquire(path)
	if err != nil {
		t.Fatalf("Acquire: %v, want the lock once its holder let go", err)
	}
	l.Release()
}

// Shared holders hold together, never beside one that holds alone; a try
// answers at once whether it took the lock.
func TestSharedAndTry(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db.lock")
	a, err := AcquireShared(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := AcquireShared(path)
	if err != nil {
		t.Fatalf("a second shared holder: %v", err)
	}
	if _, err := Acquire(path); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("an exclusive holder beside shared ones: %v, want ErrFailedPrecondition", err)
	}
	if l, err := TryAcquire(path); l != nil || err != nil {
		t.Errorf("a try beside shared holders: %v, %v; want nil, nil", l, err)
	}
	a.Release()
	b.Release()
	l, err := TryAcquire(path)
	if l == nil || err != nil {
		t.Fatalf("a try on a free lock: %v, %v", l, err)
	}
	if _, err := AcquireShared(path); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a shared holder beside an exclusive one: %v, want ErrFailedPrecondition", err)
	}
	l.Release()
}
