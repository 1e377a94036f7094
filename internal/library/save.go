package library

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/units"
	"github.com/corral-dev/corral/internal/workspace"
)

// scriptExts are the extensions save_to_shared also copies to
// shared/scripts/, where the next task finds them (seed 000 use case 3).
var scriptExts = map[string]bool{
	".py": true, ".sh": true, ".bash": true, ".js": true, ".mjs": true, ".ts": true,
	".rb": true, ".pl": true, ".r": true, ".lua": true, ".php": true, ".go": true,
}

// IsScript reports whether save_to_shared treats a file as a script.
func IsScript(name string) bool { return scriptExts[strings.ToLower(path.Ext(name))] }

// checkSharedQuota refuses adding bytes to shared/ if that would take it
// past the shared/ limit. The measure is a walk of shared/: exact on any
// filesystem, at the cost of a walk per write (some milliseconds for
// thousands of files).
func (o *Library) checkSharedQuota(adding int64) error {
	max := o.opts.Limits.MaxSharedBytes
	if max <= 0 {
		return nil
	}
	size, err := workspace.Size(o.data.Shared(), ".")
	if err != nil {
		return fmt.Errorf("measure shared/: %w", err)
	}
	if size+adding > max {
		return fmt.Errorf("shared/ quota exceeded: shared/ holds %s, this adds %s, the limit (limits.max_shared_bytes) is %s: %w",
			units.FormatSize(size), units.FormatSize(adding), units.FormatSize(max), errdefs.ErrResourceExhausted)
	}
	return nil
}

// saveWorkers is how many save_to_shared copies run at once, server-wide.
// Tasks that end together queue for them, in the order they ended, rather
// than load the disk at once; two, not one, so that one task's copy of
// 20,000 files (up to maxSaveTime) does not hold every other copy
// behind it.
const saveWorkers = 2

// maxSaveTime bounds one save_to_shared copy, from its start: the copy
// that takes longer stops and is recorded as failed, saying how far it got.
const maxSaveTime = 2 * time.Minute

// saveRetry is the first wait before recording a copy's event again after
// the store refused it (a full disk); it doubles up to 5 minutes.
const saveRetry = 5 * time.Second

// RunSaves does save_to_shared until ctx is done: for each task that ended
// successfully having asked for it (the projection's PendingSaves), in the
// order they ended and saveWorkers at a time, it copies the outputs to
// shared/outputs/YYYY-MM/<task-id>/ (YYYY-MM of the task's end), scripts
// also to shared/scripts/, and records outputs_saved or
// outputs_save_failed, caused by the task's end.
//
// The copy follows the task's end and runs apart from the scheduler: the
// end (and the notification of it, and the task's worker slot) never waits
// for it. Nothing of it is kept only in memory: a copy that a crash or a
// shutdown interrupts leaves the task pending in the log, and the next
// start does it again from nothing (its directory is emptied first), so
// each task's copy is recorded exactly once.
func (o *Library) RunSaves(ctx context.Context) error {
	done := make(chan string, saveWorkers) // one for each copy in flight
	busy := map[string]bool{}
	var wg sync.WaitGroup
	defer wg.Wait()
	for ctx.Err() == nil {
		changed := o.tasks.Changed()
		for _, id := range o.tasks.PendingSaves() {
			if len(busy) == saveWorkers {
				break
			}
			if busy[id] {
				continue
			}
			busy[id] = true
			wg.Add(1)
			go func() {
				defer wg.Done()
				o.save(ctx, id)
				if o.tasks.SavePending(id) && ctx.Err() == nil {
					// Not recorded (the task could not be read): not again
					// at once.
					select {
					case <-time.After(saveRetry):
					case <-ctx.Done():
					}
				}
				done <- id
			}()
		}
		select {
		case <-changed:
		case id := <-done:
			delete(busy, id)
		case <-ctx.Done():
		}
	}
	return nil
}

// save copies task id's outputs to shared/ and records the event, unless
// the task's copy is not pending (recorded already). The retention sweep
// takes the same lock before it removes a task's directory.
func (o *Library) save(ctx context.Context, id string) {
	unlock := o.saving.lock(id)
	defer unlock()
	t, err := o.tasks.Get(id)
	if err != nil {
		if ctx.Err() == nil {
			o.log.Warn("cannot read a task to save its outputs", "task_id", id, "err", err)
		}
		return
	}
	if !t.SavePending() {
		return
	}
	began := time.Now()
	res, err := o.copyOutputs(ctx, t)
	if ctx.Err() != nil {
		return // shutting down: the next start copies again
	}
	typ := task.EventOutputsSaved
	if err != nil {
		typ, res.Error = task.EventOutputsSaveFailed, err.Error()
		o.log.Warn("outputs not saved to shared", "task_id", id, "err", err)
	} else {
		o.log.Info("outputs saved to shared", "task_id", id, "files", max(res.FilesTotal, len(res.Files)), "seconds", time.Since(began).Seconds())
	}
	ev := projection.NewEvent(typ, res, "corral/save")
	cause := eventstore.WithCause(ctx, eventstore.Cause{CorrelationID: t.CorrelationID, CausationID: t.SharedOutputs.After})
	for n := 0; ; n++ {
		// At the task's version, and only while the copy is pending: one
		// event, whoever else appends to the stream meanwhile.
		_, err := o.tasks.Update(cause, id, func(cur task.Task) ([]eventstore.Proposed, error) {
			if !cur.SavePending() {
				return nil, projection.ErrNoChange
			}
			return []eventstore.Proposed{ev}, nil
		})
		if err == nil || ctx.Err() != nil {
			return
		}
		o.log.Warn("cannot record saved outputs; trying again", "task_id", id, "err", err)
		select {
		case <-time.After(min(saveRetry<<min(n, 6), 5*time.Minute)):
		case <-ctx.Done():
			return
		}
	}
}

// copyOutputs copies a task's output files to shared/, within maxSaveTime.
// The work per file is bounded: at most the task directory's quota in
// bytes, no fsync (one syncfs makes the whole copy durable before its event
// is recorded: an fsync of each file and its directory cost 40,000 journal
// commits for 20,000 files), and a bounded look for a free name in
// scripts/. A file that is not (or no longer) a regular file, or too
// large, or a script with no free name, is skipped and the event says
// why; the others are still copied.
func (o *Library) copyOutputs(ctx context.Context, t task.Task) (res task.OutputsSaved, err error) {
	ended := o.now()
	if t.CompletedAt != nil {
		ended = *t.CompletedAt
	}
	dirName := path.Join("outputs", ended.UTC().Format("2006-01"), t.ID)
	res = task.OutputsSaved{Directory: "shared/" + dirName, Files: []task.SavedFile{}}
	sh := o.data.Shared()
	// What a copy a crash interrupted left there (its temporary files
	// too): the copy starts again from nothing, and the event lists what
	// is there.
	if err := sh.RemoveAll(dirName); err != nil {
		return res, fmt.Errorf("empty %s: %w", res.Directory, err)
	}
	dir, err := o.data.OpenTask(t.ID)
	if err != nil {
		return res, err
	}
	defer dir.Close()
	out, err := dir.OpenRoot("output")
	if err != nil {
		return res, fmt.Errorf("open the task's output: %w", err)
	}
	defer out.Close()
	entries, err := workspace.List(out, ".", true)
	if err != nil {
		return res, fmt.Errorf("list the task's output: %w", err)
	}
	var files []workspace.Entry
	var total int64
	for _, e := range entries {
		if e.IsDir {
			continue
		}
		files = append(files, e)
		total += e.Size
		if IsScript(e.Path) {
			total += e.Size
		}
	}
	if len(files) == 0 {
		return res, nil
	}
	if err := o.checkSharedQuota(total); err != nil {
		return res, err
	}
	if err := sh.MkdirAll(dirName, 0o755); err != nil {
		return res, fmt.Errorf("create %s: %w", res.Directory, err)
	}
	// Copies go through a root on the directory itself: each costs a walk
	// of the file's own path, not of outputs/YYYY-MM/<task-id>/ too.
	dst, err := sh.OpenRoot(dirName)
	if err != nil {
		return res, fmt.Errorf("open %s: %w", res.Directory, err)
	}
	defer dst.Close()
	max := o.opts.Limits.MaxTaskDirBytes
	if max <= 0 {
		max = 1 << 40
	}
	limit := maxSaveTime
	if o.saveTime > 0 {
		limit = o.saveTime
	}
	cctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	if o.copyHook != nil {
		o.copyHook(cctx, t.ID)
	}
	var saved, skipped int
	add := func(f task.SavedFile) {
		if saved++; len(res.Files) < task.MaxSavedListed {
			res.Files = append(res.Files, f)
		}
	}
	skip := func(name string, err error) {
		if skipped++; len(res.Skipped) < task.MaxSavedListed {
			res.Skipped = append(res.Skipped, task.SkippedFile{Name: name, Reason: errdefs.Message(err)})
		}
	}
	defer func() { // on every return: res is the named result
		if saved > len(res.Files) {
			res.FilesTotal = saved
		}
		if skipped > len(res.Skipped) {
			res.SkippedTotal = skipped
		}
	}()
	for i, f := range files {
		if cctx.Err() != nil {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			return res, fmt.Errorf("saving took longer than %s: stopped after %d of %d files (those copied are in %s)", limit, i, len(files), res.Directory)
		}
		// shared/ takes only names every listing can show; a worker's
		// output/ may hold any.
		if err := workspace.CheckName(f.Path); err != nil {
			skip(f.Path, err)
			continue
		}
		to := path.Join(dirName, f.Path)
		n, err := workspace.CopyFileContext(cctx, out, f.Path, dst, f.Path, max)
		switch {
		case err == nil:
		case skippable(err):
			skip(f.Path, err)
			continue
		case cctx.Err() != nil:
			continue // the deadline, said at the top of the loop
		default:
			return res, fmt.Errorf("copy %s: %w", f.Path, err)
		}
		add(task.SavedFile{From: f.Path, To: to, Size: n})
		if !IsScript(f.Path) {
			continue
		}
		// From the copy just made, the server's own file: the worker's
		// could change in between, and scripts/ is shared by every task.
		sf, err := o.saveScript(cctx, to, f.Path, max)
		switch {
		case err == nil:
			add(sf)
		case errors.Is(err, errdefs.ErrAlreadyExists):
			skip(f.Path, fmt.Errorf("not copied to scripts/ (it is in %s): %w", res.Directory, err))
		case cctx.Err() != nil:
		default:
			return res, fmt.Errorf("copy %s to scripts/: %w", f.Path, err)
		}
	}
	if err := workspace.SyncFS(sh); err != nil {
		return res, fmt.Errorf("make the copies durable: %w", err)
	}
	return res, nil
}

// skippable reports whether a file's copy failed for the file's own sake
// (it vanished, is not a regular file, or is too large), so that the
// others are still copied; any other failure (a full disk, an I/O error)
// ends the copy.
func skippable(err error) bool {
	return errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, workspace.ErrPathEscapes) ||
		errors.Is(err, workspace.ErrIsDir) || errors.Is(err, workspace.ErrTooLarge) || errors.Is(err, errdefs.ErrInvalidArgument)
}

// saveScript copies a script to scripts/<base name>, never over a different
// file: a taken name gets "-2", "-3", ... before its extension (its stem
// shortened if the name would pass NAME_MAX); with that and 999 suffixed
// names taken it returns an ErrAlreadyExists. A name taken by a file of
// another size is passed over without reading it, so each try costs a
// stat, and a read of at most max bytes when the sizes match. saved is
// the script's copy in shared/ (under outputs/), name its name in the
// task's output/.
func (o *Library) saveScript(ctx context.Context, saved, name string, max int64) (task.SavedFile, error) {
	sh := o.data.Shared()
	sum, size, err := fileSum(sh, saved)
	if err != nil {
		return task.SavedFile{}, err
	}
	o.scriptsMu.Lock()
	defer o.scriptsMu.Unlock()
	base := path.Base(name)
	wanted := path.Join("scripts", base)
	ext := path.Ext(base)
	stem := strings.TrimSuffix(base, ext)
	for i := 1; i < 1000; i++ {
		if err := ctx.Err(); err != nil {
			return task.SavedFile{}, err
		}
		to := wanted
		if i > 1 {
			suffix := fmt.Sprintf("-%d%s", i, ext)
			to = path.Join("scripts", cutName(stem, nameMax-len(suffix))+suffix)
		}
		info, err := sh.Lstat(to)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			n, err := workspace.CopyFileContext(ctx, sh, saved, sh, to, max)
			if err != nil {
				return task.SavedFile{}, err
			}
			return task.SavedFile{From: name, To: to, Size: n, Renamed: to != wanted, Wanted: wantedIf(to != wanted, wanted)}, nil
		case err != nil:
			return task.SavedFile{}, err
		case !info.Mode().IsRegular() || info.Size() != size:
			continue // a directory, a link or another file: taken
		}
		if existing, _, err := fileSum(sh, to); err == nil && existing == sum {
			return task.SavedFile{From: name, To: to, Unchanged: true, Renamed: to != wanted, Wanted: wantedIf(to != wanted, wanted)}, nil
		}
	}
	return task.SavedFile{}, fmt.Errorf("scripts/%s and 999 suffixed names are taken: %w", base, errdefs.ErrAlreadyExists)
}

// nameMax is the longest file name Linux file systems take (NAME_MAX).
const nameMax = 255

// cutName shortens s to at most n bytes, at a character boundary.
func cutName(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func wantedIf(ok bool, s string) string {
	if ok {
		return s
	}
	return ""
}

// fileSum returns the sha256 and size of a regular file beneath root.
func fileSum(root *os.Root, name string) ([32]byte, int64, error) {
	f, _, err := workspace.OpenFile(root, name)
	if err != nil {
		return [32]byte{}, 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return [32]byte{}, 0, err
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s, n, nil
}
