package sqlite

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/logkey"
)

// A reserve: a file of reserveBytes beside the database, given back when a
// commit finds the disk full, so that the commits that follow fit. Without
// it, a task that filled the disk (past limits.min_free_disk, between two
// of its measures) could not have its end recorded until someone freed
// space, and stayed running. It is made again once the disk has room.
const (
	reserveBytes = 4 << 20
	// reserveRetry is how often a store without its reserve looks for
	// room to make it again, at its commits.
	reserveRetry = 10 * time.Second
)

func (s *Store) reservePath() string { return s.path + ".reserve" }

// keepReserve makes the reserve if it is missing and the disk has room for
// it twice over, and reports whether the store has it now; without room
// it does nothing, and the next try does.
func (s *Store) keepReserve() (bool, error) {
	path := s.reservePath()
	if _, err := os.Lstat(path); err == nil {
		return true, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(path), &st); err != nil {
		return false, fmt.Errorf("free space for the event store's reserve: %w", err)
	}
	if int64(st.Bavail)*st.Bsize < 2*reserveBytes {
		return false, nil
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return false, fmt.Errorf("make the event store's reserve: %w", err)
	}
	// Written, not allocated sparse: its blocks are the disk's, to give back.
	_, err = f.Write(make([]byte, reserveBytes))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return false, fmt.Errorf("make the event store's reserve: %w", err)
	}
	return true, nil
}

// releaseReserve gives the reserve's space back after err, a commit that
// found the disk full.
func (s *Store) releaseReserve(err error) {
	if !errors.Is(err, errdefs.ErrNoSpace) {
		return
	}
	if os.Remove(s.reservePath()) != nil {
		return // none left to give
	}
	s.reserveAt = time.Now()
	s.log.Warn("the disk is full: gave back the event store's reserve so that the next commits fit; it is made again once there is room",
		"reserve_bytes", reserveBytes, logkey.Error, err)
}

// retryReserve makes the reserve again, at most every reserveRetry, after
// it was given back.
func (s *Store) retryReserve() {
	if s.reserveAt.IsZero() || time.Since(s.reserveAt) < reserveRetry {
		return
	}
	s.reserveAt = time.Now()
	kept, err := s.keepReserve()
	if err != nil {
		s.log.Warn("cannot make the event store's reserve", logkey.Error, err)
	}
	if kept {
		s.reserveAt = time.Time{}
		s.log.Info("the event store's reserve is made again", "reserve_bytes", reserveBytes)
	}
}
