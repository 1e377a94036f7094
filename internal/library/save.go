package library

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/errdefs"
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

// SaveOutputs copies a successful task's output files to
// shared/outputs/YYYY-MM/<task-id>/, and scripts among them also to
// shared/scripts/, then records outputs_saved (or outputs_save_failed).
// A script whose name is taken by a different file gets a suffix and the
// event says so; an identical one is left as is. It runs once per task:
// a second call (the webhook and the sandbox's exit racing, a restart)
// finds the event and does nothing.
//
// Only this task's save is serialised (the webhook and the exit may both
// come here); the worker's files are read without any lock shared with
// other tasks, and opened so that a FIFO or a link swapped in is refused
// at once (workspace.OpenFile), so one task's files can never hold up
// another's save.
func (o *Library) SaveOutputs(ctx context.Context, t task.Task, files []task.OutputFile) {
	unlock := o.saving.lock(t.ID)
	defer unlock()
	if o.hasEvent(ctx, t.ID, task.EventOutputsSaved, task.EventOutputsSaveFailed) {
		return
	}
	dirName := path.Join("outputs", o.now().UTC().Format("2006-01"), t.ID)
	res := task.OutputsSaved{Directory: "shared/" + dirName, Files: []task.SavedFile{}}
	cctx, cancel := context.WithTimeout(ctx, maxSaveTime)
	defer cancel()
	err := o.copyOutputs(cctx, t, files, dirName, &res)
	typ := task.EventOutputsSaved
	if err != nil {
		typ, res.Error = task.EventOutputsSaveFailed, err.Error()
		o.log.Warn("outputs not saved to shared", "task_id", t.ID, "err", err)
	}
	if err := o.appendAnyVersion(ctx, task.StreamID(t.ID), projection.NewEvent(typ, res, "corral/save")); err != nil {
		o.log.Warn("cannot record saved outputs", "task_id", t.ID, "err", err)
	}
}

// maxSaveTime bounds save_to_shared: a task's end is not held up longer
// by copying its outputs, however many there are.
const maxSaveTime = 2 * time.Minute

func (o *Library) copyOutputs(ctx context.Context, t task.Task, files []task.OutputFile, dirName string, res *task.OutputsSaved) error {
	if len(files) == 0 {
		return nil
	}
	var total int64
	for _, f := range files {
		total += f.Size
		if IsScript(f.Name) {
			total += f.Size
		}
	}
	if err := o.checkSharedQuota(total); err != nil {
		return err
	}
	dir, err := o.data.OpenTask(t.ID)
	if err != nil {
		return err
	}
	defer dir.Close()
	out, err := dir.OpenRoot("output")
	if err != nil {
		return fmt.Errorf("open the task's output: %w", err)
	}
	defer out.Close()
	sh := o.data.Shared()
	max := o.opts.Limits.MaxTaskDirBytes
	if max <= 0 {
		max = 1 << 40
	}
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("saving took longer than %s; %d of %d files saved: %w", maxSaveTime, len(res.Files), len(files), err)
		}
		// shared/ takes only names every listing can show; a worker's
		// output/ may hold any.
		if err := workspace.CheckName(f.Name); err != nil {
			res.Skipped = append(res.Skipped, task.SkippedFile{Name: f.Name, Reason: errdefs.Message(err)})
			continue
		}
		to := path.Join(dirName, f.Name)
		n, err := workspace.CopyFile(out, f.Name, sh, to, max)
		if err != nil {
			return fmt.Errorf("copy %s: %w", f.Name, err)
		}
		res.Files = append(res.Files, task.SavedFile{From: f.Name, To: to, Size: n})
		if !IsScript(f.Name) {
			continue
		}
		// From the copy just made, the server's own file: the worker's
		// could change in between, and scripts/ is shared by every task.
		sf, err := o.saveScript(to, f.Name, max)
		if err != nil {
			return fmt.Errorf("copy %s to scripts/: %w", f.Name, err)
		}
		res.Files = append(res.Files, sf)
	}
	return nil
}

// saveScript copies a script to scripts/<base name>, never over a different
// file: a taken name gets "-2", "-3", ... before its extension (its stem
// shortened if the name would pass NAME_MAX). saved is the script's copy
// in shared/ (under outputs/), name its name in the task's output/.
func (o *Library) saveScript(saved, name string, max int64) (task.SavedFile, error) {
	sh := o.data.Shared()
	sum, err := fileSum(sh, saved)
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
		to := wanted
		if i > 1 {
			suffix := fmt.Sprintf("-%d%s", i, ext)
			to = path.Join("scripts", cutName(stem, nameMax-len(suffix))+suffix)
		}
		existing, err := fileSum(sh, to)
		switch {
		case err == nil && existing == sum:
			return task.SavedFile{From: name, To: to, Unchanged: true, Renamed: to != wanted, Wanted: wantedIf(to != wanted, wanted)}, nil
		case err == nil:
			continue // taken by another file
		case !errors.Is(err, errdefs.ErrNotFound):
			if _, lerr := sh.Lstat(to); lerr == nil {
				continue // a directory or a link: taken
			}
			return task.SavedFile{}, err
		}
		n, err := workspace.CopyFile(sh, saved, sh, to, max)
		if err != nil {
			return task.SavedFile{}, err
		}
		return task.SavedFile{From: name, To: to, Size: n, Renamed: to != wanted, Wanted: wantedIf(to != wanted, wanted)}, nil
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

// fileSum returns the sha256 of a regular file beneath root.
func fileSum(root *os.Root, name string) ([32]byte, error) {
	f, _, err := workspace.OpenFile(root, name)
	if err != nil {
		return [32]byte{}, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return [32]byte{}, err
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s, nil
}

// hasEvent reports whether a task's stream holds an event of one of types.
func (o *Library) hasEvent(ctx context.Context, id string, types ...string) bool {
	evs, err := o.store.ReadStream(ctx, task.StreamID(id), 0)
	if err != nil {
		return false
	}
	for _, e := range evs {
		for _, typ := range types {
			if e.Type == typ {
				return true
			}
		}
	}
	return false
}
