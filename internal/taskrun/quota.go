package taskrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/quota"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/units"
	"github.com/corral-dev/corral/internal/workspace"
)

// The task directory quota in figures.
const (
	// QuotaInterval is the longest a running task's directory goes
	// unmeasured, unless measuring it takes long (see minQuotaShare).
	QuotaInterval = 250 * time.Millisecond
	// minQuotaGap is the shortest: the gap shrinks with the headroom left
	// under the limit and with the rate the directory grows (see next).
	minQuotaGap = 10 * time.Millisecond
	// assumedWriteRate is the rate a worker is assumed able to write at
	// until it is seen writing faster: a local SSD through the page cache.
	assumedWriteRate = 1 << 30 // bytes per second
	// minQuotaShare bounds a walk's cost: the gap after a walk is at least
	// this many times as long as the walk took.
	minQuotaShare = 10
	// bytesPerEntry sets the limit on files and directories from the byte
	// limit (at least minEntries): a block each, so a million empty files
	// cannot pass a byte limit that counts none of them.
	bytesPerEntry = 4 << 10
	minEntries    = 1024
	// maxDepth is how deep a task directory may nest; every level is a
	// file descriptor held during the walk.
	maxDepth = 512
	// hardSlack is how close to the limit a project quota's usage counts
	// as reached: a write that failed with EDQUOT may have left up to a few
	// blocks unused.
	hardSlack = 64 << 10
)

// TaskQuota holds each running task's directory to
// limits.max_task_dir_bytes and to one file or directory per 4 KiB of it.
//
// Where the data root's filesystem enforces project quotas, the kernel
// does: Limit gives the directory a project of its own with hard limits
// before the sandbox starts, and a write past them fails with EDQUOT.
// Elsewhere the limit is soft: Check walks the directory, stopping as soon
// as it passes a limit, at most QuotaInterval apart and sooner the less
// headroom is left and the faster the directory grows; the scheduler
// kills the sandbox at once when Check reports it over. Each file is also bounded by the
// local sandbox's RLIMIT_FSIZE.
type TaskQuota struct {
	data     *workspace.DataRoot
	max      int64
	minFree  int64           // the data root's free-space floor; 0: none
	projects *quota.Projects // nil: soft
	log      *slog.Logger

	mu   sync.Mutex
	last map[string]sample // the last measure of each task
}

// sample is one measure of a task directory.
type sample struct {
	at    time.Time
	bytes int64
}

// NewTaskQuota returns the quota of task directories under data, max bytes
// each (none if max <= 0), enforced by projects where not nil. Below
// minFree bytes free on the data root's filesystem (0: no floor), a task
// whose directory grew since its last measure is over its quota too: the
// task filling the disk stops, the others go on.
func NewTaskQuota(data *workspace.DataRoot, max, minFree int64, projects *quota.Projects, log *slog.Logger) *TaskQuota {
	return &TaskQuota{data: data, max: max, minFree: minFree, projects: projects, log: log, last: map[string]sample{}}
}

// Mode says how the quota is enforced, for a person.
func (q *TaskQuota) Mode() string { return QuotaMode(q.projects != nil) }

// QuotaMode says how the task directory quota is enforced, hard (by the
// kernel's project quotas) or not, for a person.
func QuotaMode(hard bool) string {
	if hard {
		return "hard (project quotas)"
	}
	return fmt.Sprintf("soft (polled every %s or sooner, as the headroom shrinks)", QuotaInterval)
}

// Limit sets the kernel's limits on a task's directory before its sandbox
// starts, where the filesystem has project quotas; elsewhere it does
// nothing. An error leaves the task with the soft quota alone.
func (q *TaskQuota) Limit(ctx context.Context, t task.Task) error {
	return q.LimitDir(ctx, taskDir(t.ID))
}

// QuotaDir is a directory of the data root held to the quota: a task's or
// a session's.
type QuotaDir struct {
	Key  string // the task's or session's id
	Rel  string // its path in the data root
	Noun string // what it is, for a person: "task directory", "session directory"
}

// taskDir is task id's directory.
func taskDir(id string) QuotaDir {
	return QuotaDir{Key: id, Rel: workspace.DirTasks + "/" + id, Noun: "task directory"}
}

// LimitDir is Limit for any directory the quota holds.
func (q *TaskQuota) LimitDir(ctx context.Context, d QuotaDir) error {
	if q.projects == nil || q.max <= 0 {
		return nil
	}
	dir, err := q.openDir(d)
	if err != nil {
		return err
	}
	defer dir.Close()
	id, err := q.projects.Assign(dir, d.Key, quota.Limits{Bytes: q.max, Inodes: maxEntries(q.max)})
	if err != nil {
		return fmt.Errorf("hold %s %s to its quota: %w", d.Noun, d.Key, err)
	}
	q.log.Debug("directory quota set", "dir", d.Rel, "project", id)
	return nil
}

// Check measures a task's directory: an error over the limit (the task
// ends with it), else how soon to measure again.
func (q *TaskQuota) Check(ctx context.Context, t task.Task) (time.Duration, error) {
	return q.CheckDir(ctx, taskDir(t.ID))
}

// CheckDir is Check for any directory the quota holds.
func (q *TaskQuota) CheckDir(ctx context.Context, d QuotaDir) (time.Duration, error) {
	if q.max <= 0 {
		return QuotaInterval, nil
	}
	root, err := q.data.Root().OpenRoot(d.Rel)
	if err != nil {
		return QuotaInterval, nil // gone: Collect reports it
	}
	defer root.Close()
	start := time.Now()
	bytes, err := q.measure(root, d.Noun)
	took := time.Since(start)
	if err != nil {
		return 0, err
	}
	q.mu.Lock()
	prev, seen := q.last[d.Key]
	q.last[d.Key] = sample{at: start, bytes: bytes}
	q.mu.Unlock()
	headroom := q.max - bytes
	if q.minFree > 0 {
		if free, err := q.data.FreeBytes(); err == nil {
			if free < q.minFree && (!seen || bytes > prev.bytes) {
				return 0, fmt.Errorf("the data root's disk is down to %s free, below limits.min_free_disk (%s), and this %s was still growing (it holds %s): stopped so that the server and other tasks can go on: %w",
					units.FormatSize(free), units.FormatSize(q.minFree), d.Noun, units.FormatSize(bytes), errdefs.ErrNoSpace)
			}
			headroom = min(headroom, free-q.minFree)
		}
	}
	return nextGap(prev, seen, start, bytes, headroom, took), nil
}

// measure returns the bytes a task directory holds, or its quota error.
func (q *TaskQuota) measure(root *os.Root, noun string) (int64, error) {
	if q.projects != nil {
		if u, lim, ok := projectUsage(root); ok {
			return u.Bytes, hardQuotaError(u, lim, noun)
		}
	}
	u, err := walkUsage(root, q.max, maxEntries(q.max))
	if err != nil {
		return 0, err
	}
	return u.bytes, u.err(q.max, maxEntries(q.max), noun)
}

// nextGap is how long to wait before measuring a task's directory again,
// given its previous measure (if seen) and this one of bytes at at: half
// the time the headroom (under the limit and above the free-space floor)
// lasts at the rate it last grew, or at assumedWriteRate if that is
// faster, so that a writer at that rate overshoots by at most half the
// headroom it had; within [minQuotaGap, QuotaInterval], and at least
// minQuotaShare times what the measure took.
func nextGap(prev sample, seen bool, at time.Time, bytes, headroom int64, took time.Duration) time.Duration {
	rate := float64(assumedWriteRate)
	if dt := at.Sub(prev.at).Seconds(); seen && dt > 0 {
		rate = max(rate, float64(bytes-prev.bytes)/dt)
	}
	gap := time.Duration(float64(headroom) / rate / 2 * float64(time.Second))
	gap = min(max(gap, minQuotaGap), QuotaInterval)
	return max(gap, minQuotaShare*took)
}

// Release clears the kernel's limits once a task's sandbox is gone: the
// directory keeps its project id, and the id is free again when the
// directory is removed.
func (q *TaskQuota) Release(ctx context.Context, t task.Task) {
	q.ReleaseDir(ctx, taskDir(t.ID))
}

// ReleaseDir is Release for any directory the quota holds.
func (q *TaskQuota) ReleaseDir(ctx context.Context, d QuotaDir) {
	q.mu.Lock()
	delete(q.last, d.Key)
	q.mu.Unlock()
	if q.projects == nil {
		return
	}
	dir, err := q.openDir(d)
	if err != nil {
		return
	}
	defer dir.Close()
	if err := q.projects.Clear(dir); err != nil {
		q.log.Warn("cannot clear a directory's quota", "dir", d.Rel, logkey.Error, err)
	}
}

func (q *TaskQuota) openDir(d QuotaDir) (*os.File, error) {
	root, err := q.data.Root().OpenRoot(d.Rel)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return root.Open(".")
}

// maxEntries is how many files and directories a task directory of max
// bytes may hold.
func maxEntries(maxBytes int64) int64 {
	return max(maxBytes/bytesPerEntry, minEntries)
}

// projectUsage reads the usage of a task directory's own project, if it
// has one with limits.
func projectUsage(root *os.Root) (quota.Usage, quota.Limits, bool) {
	f, err := root.Open(".")
	if err != nil {
		return quota.Usage{}, quota.Limits{}, false
	}
	defer f.Close()
	u, lim, err := quota.Read(f)
	return u, lim, err == nil && lim.Bytes > 0
}

// hardQuotaError says whether a project's usage has reached its limits.
func hardQuotaError(u quota.Usage, lim quota.Limits, noun string) error {
	if lim.Inodes > 0 && u.Inodes >= lim.Inodes {
		return fmt.Errorf("%s: the %s holds %d files and directories, the limit is %d (one per %s of limits.max_task_dir_bytes): %w",
			errQuota, noun, u.Inodes, lim.Inodes, units.FormatSize(bytesPerEntry), errdefs.ErrResourceExhausted)
	}
	if u.Bytes+hardSlack < lim.Bytes {
		return nil
	}
	return fmt.Errorf("%s: the %s holds %s, the limit is %s: %w", errQuota, noun, units.FormatSize(u.Bytes), units.FormatSize(lim.Bytes), errdefs.ErrResourceExhausted)
}

// errQuota starts every quota error message, so a person and a test can
// tell it from other failures.
const errQuota = "output quota exceeded"

// quotaError says whether a task directory has reached max bytes or its
// share of entries. Reaching the byte limit counts: a single file stopped
// by RLIMIT_FSIZE (set to the same limit) ends exactly at it.
func quotaError(dir *os.Root, max int64) error {
	u, err := walkUsage(dir, max, maxEntries(max))
	if err != nil {
		return nil // unreadable: Collect reports what it can
	}
	return u.err(max, maxEntries(max), "task directory")
}

// dirUsage is what a walk of a task directory found before it stopped.
type dirUsage struct {
	bytes   int64 // sizes of the regular files
	entries int64 // files and directories of every kind
	tooDeep bool
}

func (u dirUsage) err(max, maxEntries int64, noun string) error {
	switch {
	case u.tooDeep:
		return fmt.Errorf("%s: the %s nests deeper than %d directories: %w", errQuota, noun, maxDepth, errdefs.ErrResourceExhausted)
	case u.bytes >= max:
		return fmt.Errorf("%s: the %s holds %s or more, the limit is %s: %w", errQuota, noun, units.FormatSize(u.bytes), units.FormatSize(max), errdefs.ErrResourceExhausted)
	case u.entries > maxEntries:
		return fmt.Errorf("%s: the %s holds more than %d files and directories, the limit is %d (one per %s of limits.max_task_dir_bytes): %w",
			errQuota, noun, maxEntries, maxEntries, units.FormatSize(bytesPerEntry), errdefs.ErrResourceExhausted)
	}
	return nil
}

// errStop ends a walk that passed a limit.
var errStop = errors.New("over a limit")

// walkUsage adds up a task directory, stopping as soon as it passes
// maxBytes or maxEntries or nests deeper than maxDepth. It works on file
// descriptors (openat, fstatat, never following a link), so its cost is
// one getdents per directory and one fstatat per regular file, whatever
// the depth, and a worker renaming things meanwhile cannot lead it out.
func walkUsage(root *os.Root, maxBytes, maxEntries int64) (dirUsage, error) {
	f, err := root.Open(".")
	if err != nil {
		return dirUsage{}, err
	}
	defer f.Close()
	w := walker{maxBytes: maxBytes, maxEntries: maxEntries}
	if err := w.dir(f, 0); err != nil && err != errStop {
		return dirUsage{}, err
	}
	return w.u, nil
}

type walker struct {
	u                    dirUsage
	maxBytes, maxEntries int64
}

// dir adds up the open directory d, depth levels down.
func (w *walker) dir(d *os.File, depth int) error {
	fd := int(d.Fd())
	for {
		ents, err := d.ReadDir(256)
		for _, e := range ents {
			w.u.entries++
			if w.u.entries > w.maxEntries {
				return errStop
			}
			switch {
			case e.Type().IsRegular():
				var st unix.Stat_t
				if unix.Fstatat(fd, e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
					w.u.bytes += st.Size
				}
				if w.u.bytes >= w.maxBytes {
					return errStop
				}
			case e.IsDir():
				if err := w.sub(fd, e.Name(), depth+1); err != nil {
					return err
				}
			}
		}
		if err == io.EOF || errors.Is(err, fs.ErrNotExist) {
			return nil // read to the end, or removed while read: nothing more of it counts
		}
		if err != nil {
			return err
		}
	}
}

// sub adds up the directory name in the directory open as fd.
func (w *walker) sub(fd int, name string, depth int) error {
	if depth > maxDepth {
		w.u.tooDeep = true
		return errStop
	}
	c, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil // gone or replaced meanwhile: the next walk sees it
	}
	sub := os.NewFile(uintptr(c), name)
	defer sub.Close()
	return w.dir(sub, depth)
}
