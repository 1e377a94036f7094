package workspace

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/units"
)

// FreeBytes returns the bytes an unprivileged writer (a sandbox) may still
// write to the filesystem holding the data root.
func (d *DataRoot) FreeBytes() (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(d.Path(), &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// CheckFreeSpace returns an ErrNoSpace error when the data root's
// filesystem has less than floor bytes free, or none at all when there is
// no floor (never when it cannot tell: the write itself then says). New
// work (a task, a write to shared/, an attachment) is refused below the
// floor, and taken again by itself once space is freed. A full disk is
// refused even without a floor: what is accepted there could be recorded
// in space the store already holds and then fail the moment it needs a
// block more, whereas a refusal records nothing.
func (d *DataRoot) CheckFreeSpace(floor int64) error {
	free, err := d.FreeBytes()
	if err != nil || free >= floor && free > 0 {
		return nil
	}
	if floor <= 0 {
		return fmt.Errorf("the data root's disk is full: nothing new is taken until space is freed (corral gc removes ended tasks' directories past retention): %w", errdefs.ErrNoSpace)
	}
	return fmt.Errorf("the data root's disk has %s free, below limits.min_free_disk (%s): nothing new is taken until space is freed (corral gc removes ended tasks' directories past retention): %w",
		units.FormatSize(free), units.FormatSize(floor), errdefs.ErrNoSpace)
}
