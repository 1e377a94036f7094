package library

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"time"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/units"
	"github.com/corral-dev/corral/internal/workspace"
)

// ListWorkspace lists a directory of shared/.
func (o *Library) ListWorkspace(ctx context.Context, p string, recursive bool) ([]workspace.Entry, error) {
	ents, err := workspace.List(o.data.Shared(), p, recursive)
	if err != nil {
		return nil, &errdefs.FieldError{Field: "path", Err: err}
	}
	if ents == nil {
		ents = []workspace.Entry{}
	}
	return ents, nil
}

// ReadWorkspace reads a file of shared/.
func (o *Library) ReadWorkspace(ctx context.Context, p string) (service.File, error) {
	f, err := o.ReadFile(o.data.Shared(), p)
	if err != nil {
		return service.File{}, &errdefs.FieldError{Field: "path", Err: err}
	}
	return f, nil
}

// WriteWorkspace writes a file of shared/ atomically.
func (o *Library) WriteWorkspace(ctx context.Context, p string, content []byte) (workspace.Entry, error) {
	if err := o.CheckFreeSpace(); err != nil {
		return workspace.Entry{}, err
	}
	c, err := workspace.Clean(p)
	if err != nil {
		return workspace.Entry{}, &errdefs.FieldError{Field: "path", Err: err}
	}
	if c == "." {
		return workspace.Entry{}, errdefs.Field("path", "must name a file, not the workspace root")
	}
	if max := o.opts.Limits.MaxWriteBytes; max > 0 && int64(len(content)) > max {
		return workspace.Entry{}, &errdefs.FieldError{Field: "content", Err: fmt.Errorf("is %d bytes, over the limit of %s: %w", len(content), units.FormatSize(max), errdefs.ErrTooLarge)}
	}
	if err := o.checkSharedQuota(int64(len(content))); err != nil {
		return workspace.Entry{}, err
	}
	if err := workspace.WriteFileAtomic(o.data.Shared(), c, content, 0o644); err != nil {
		return workspace.Entry{}, &errdefs.FieldError{Field: "path", Err: err}
	}
	// Not a Stat of the path: it may already be something else (another
	// writer, a worker's symlink); report what this call wrote.
	o.log.Info("workspace file written", "path", c, "size", len(content), "actor", service.ActorFrom(ctx))
	sum := sha256.Sum256(content)
	ev := projection.NewEvent(task.EventSharedFileWritten, task.SharedFileWritten{Path: c, Size: int64(len(content)), SHA256: hex.EncodeToString(sum[:])}, service.ActorFrom(ctx))
	if err := o.appendAnyVersion(ctx, task.SharedStreamID, ev); err != nil {
		return workspace.Entry{}, fmt.Errorf("the file is written, its record failed: %w", err)
	}
	return workspace.Entry{Path: c, Size: int64(len(content)), Modified: time.Now().UTC()}, nil
}

// OpenOutput opens a task's output file for download. Symbolic links are
// refused, never followed.
func (o *Library) OpenOutput(ctx context.Context, id, p string) (*os.File, fs.FileInfo, error) {
	if _, err := o.task(id); err != nil {
		return nil, nil, err
	}
	dir, err := o.data.OpenTask(id)
	if err != nil {
		return nil, nil, err
	}
	defer dir.Close()
	out, err := dir.OpenRoot("output")
	if err != nil {
		return nil, nil, fmt.Errorf("task %s has no output directory: %w", id, errdefs.ErrNotFound)
	}
	defer out.Close()
	f, info, err := workspace.OpenFile(out, p)
	if err != nil {
		return nil, nil, &errdefs.FieldError{Field: "path", Err: err}
	}
	return f, info, nil
}

// OpenShared opens a regular file of shared/ (never through a link).
func (o *Library) OpenShared(ctx context.Context, p string) (*os.File, fs.FileInfo, error) {
	f, info, err := workspace.OpenFile(o.data.Shared(), p)
	if err != nil {
		return nil, nil, &errdefs.FieldError{Field: "path", Err: err}
	}
	return f, info, nil
}

// ReadFile reads a file beneath root for a caller: text as is, other
// content base64-encoded, both cut at the read limit.
func (o *Library) ReadFile(root *os.Root, p string) (service.File, error) {
	c, err := workspace.Clean(p)
	if err != nil {
		return service.File{}, err
	}
	max := o.opts.Limits.MaxReadBytes
	data, truncated, err := workspace.ReadFile(root, c, max)
	if err != nil {
		return service.File{}, err
	}
	info, err := root.Stat(c)
	if err != nil {
		return service.File{}, err
	}
	f := service.File{Path: c, Size: info.Size(), Type: workspace.DetectType(root, c), Truncated: truncated}
	if utf8.Valid(data) || truncated && utf8.Valid(clip.TrimPartialRune(data)) {
		f.Encoding, f.Content = "utf-8", string(clip.TrimPartialRune(data))
	} else {
		f.Encoding, f.Content = "base64", base64.StdEncoding.EncodeToString(data)
	}
	if truncated {
		f.Note = fmt.Sprintf("content cut at %s of %s", units.FormatSize(max), units.FormatSize(f.Size))
	}
	return f, nil
}

// ErrNotDir is returned by ListWorkspace for a path that is a file, so a
// transport can read the file instead.
var ErrNotDir = workspace.ErrNotDir
