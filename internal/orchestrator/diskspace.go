package orchestrator

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/units"
)

// freeBytes returns the bytes an unprivileged writer (a sandbox) may still
// write to the filesystem holding path.
func freeBytes(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// belowFloor returns an ErrNoSpace error when the filesystem holding path
// has less than floor bytes free (never when floor <= 0, or when it cannot
// tell: the write itself then says).
func belowFloor(path string, floor int64) error {
	if floor <= 0 {
		return nil
	}
	free, err := freeBytes(path)
	if err != nil || free >= floor {
		return nil
	}
	return fmt.Errorf("the data root's disk has %s free, below limits.min_free_disk (%s): nothing new is taken until space is freed (corral gc removes ended tasks' directories past retention): %w",
		units.FormatSize(free), units.FormatSize(floor), errdefs.ErrNoSpace)
}

// checkFreeSpace refuses new work (a task, a write to shared/, an
// attachment) while the data root is below its free-space floor; it takes
// work again by itself once space is freed.
func (o *Orchestrator) checkFreeSpace() error {
	return belowFloor(o.data.Path(), o.opts.Limits.MinFreeBytes)
}
