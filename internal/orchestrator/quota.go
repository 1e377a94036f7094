package orchestrator

import (
	"context"
	"fmt"
	"os"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/units"
	"github.com/corral-dev/corral/internal/workspace"
)

// CheckQuota measures a running task's directory against the task
// directory limit. The scheduler calls it every few seconds and stops a
// task that is over: a disk quota that works on any filesystem, at the
// cost of a directory walk per check. Each file is also bounded by the
// sandbox's RLIMIT_FSIZE, so one runaway write cannot outrun the walk.
func (o *Orchestrator) CheckQuota(ctx context.Context, t task.Task) error {
	max := o.opts.Limits.MaxTaskDirBytes
	if max <= 0 {
		return nil
	}
	dir, err := o.data.OpenTask(t.ID)
	if err != nil {
		return nil // gone: Collect reports it
	}
	defer dir.Close()
	return quotaError(dir, max)
}

// quotaError says whether a task directory has reached max bytes. Reaching
// the limit counts: a single file stopped by RLIMIT_FSIZE (set to the same
// limit) ends exactly at it.
func quotaError(dir *os.Root, max int64) error {
	size, err := workspace.Size(dir, ".")
	if err != nil || size < max {
		return nil
	}
	return fmt.Errorf("%s: the task directory holds %s, the limit is %s: %w", errQuota, units.FormatSize(size), units.FormatSize(max), errdefs.ErrResourceExhausted)
}

// errQuota starts every quota error message, so a person and a test can
// tell it from other failures.
const errQuota = "output quota exceeded"
