package library

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/service"

	"github.com/corral-dev/corral/internal/attachment"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workspace"
)

// maxAttachmentsPerSpawn bounds attachment_ids.
const maxAttachmentsPerSpawn = 100

// maxDescription bounds an attachment's description.
const maxDescription = 1024

func (o *Library) now() time.Time {
	if o.opts.Now != nil {
		return o.opts.Now()
	}
	return time.Now()
}

func (o *Library) attachments() (*attachment.Store, error) {
	if o.opts.Attachments == nil {
		return nil, fmt.Errorf("attachments are not enabled on this server: %w", errdefs.ErrNotImplemented)
	}
	return o.opts.Attachments, nil
}

// UploadAttachments stores uploaded files, all or none, and records an
// attachment_created event for each once all are stored.
func (o *Library) UploadAttachments(ctx context.Context, next func() (string, io.Reader, error)) ([]service.Attachment, error) {
	if err := o.CheckFreeSpace(); err != nil {
		return nil, err
	}
	store, err := o.attachments()
	if err != nil {
		return nil, err
	}
	var staged []*attachment.Staged
	abort := func() {
		for _, st := range staged {
			st.Abort()
		}
	}
	for i := 0; ; i++ {
		name, r, err := next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			abort()
			return nil, err
		}
		st, err := store.Stage(name, r, "", "upload")
		if err != nil {
			abort()
			return nil, &errdefs.FieldError{Field: fmt.Sprintf("files[%d]", i), Err: err}
		}
		staged = append(staged, st)
		if err := ctx.Err(); err != nil {
			abort()
			return nil, err
		}
	}
	if len(staged) == 0 {
		return nil, errdefs.Field("files", "no file in the request (send multipart/form-data with one or more file parts)")
	}
	out := make([]service.Attachment, 0, len(staged))
	for i, st := range staged {
		if err := st.Commit(); err != nil {
			for _, later := range staged[i+1:] {
				later.Abort()
			}
			for _, m := range out {
				store.Remove(m.ID)
			}
			return nil, err
		}
		out = append(out, st.Meta())
	}
	actor := service.ActorFrom(ctx)
	for _, m := range out {
		if err := o.recordAttachment(ctx, m, "", actor); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// recordAttachment appends attachment_created to the attachment's stream.
func (o *Library) recordAttachment(ctx context.Context, m service.Attachment, taskID, actor string) error {
	ev := projection.NewEvent(task.EventAttachmentCreated, task.AttachmentCreated{
		AttachmentID: m.ID, Name: m.Name, Type: m.Type, Size: m.Size, SHA256: m.SHA256,
		Source: m.Source, TaskID: taskID, Description: m.Description,
	}, actor)
	if _, err := o.store.Append(ctx, task.AttachmentStreamID(m.ID), 0, ev); err != nil {
		return fmt.Errorf("record attachment %s: %w", m.ID, err)
	}
	o.log.Info("attachment created", "attachment_id", m.ID, "size", m.Size, "type", m.Type, "source", m.Source, "actor", actor)
	return nil
}

// OpenAttachment returns an attachment and its content.
func (o *Library) OpenAttachment(ctx context.Context, id string) (service.Attachment, io.ReadCloser, error) {
	store, err := o.attachments()
	if err != nil {
		return service.Attachment{}, nil, err
	}
	m, f, err := store.Open(id)
	if err != nil {
		return service.Attachment{}, nil, err
	}
	return m, f, nil
}

// CreateAttachmentFromWorkspace streams a task's output file or a shared
// file into a new attachment. Symbolic links are refused, never followed.
func (o *Library) CreateAttachmentFromWorkspace(ctx context.Context, req service.CreateAttachmentRequest) (service.Attachment, error) {
	if err := o.CheckFreeSpace(); err != nil {
		return service.Attachment{}, err
	}
	store, err := o.attachments()
	if err != nil {
		return service.Attachment{}, err
	}
	if len(req.Description) > maxDescription || strings.ContainsRune(req.Description, 0) {
		return service.Attachment{}, errdefs.Field("description", fmt.Sprintf("must be text of at most %d bytes", maxDescription))
	}
	taskID, root, rel, source, err := o.resolveSource(ctx, req.SourcePath)
	if err != nil {
		return service.Attachment{}, &errdefs.FieldError{Field: "source_path", Err: err}
	}
	defer root.Close()
	f, _, err := workspace.OpenFile(root, rel)
	if err != nil {
		return service.Attachment{}, &errdefs.FieldError{Field: "source_path", Err: err}
	}
	defer f.Close()
	m, err := store.Create(path.Base(rel), f, req.Description, source)
	if err != nil {
		return service.Attachment{}, &errdefs.FieldError{Field: "source_path", Err: err}
	}
	if err := o.recordAttachment(ctx, m, taskID, service.ActorFrom(ctx)); err != nil {
		store.Remove(m.ID)
		return service.Attachment{}, err
	}
	return m, nil
}

// resolveSource opens the root a source path is in and returns the path
// within it: a task's output/ or shared/. The caller closes the root.
func (o *Library) resolveSource(ctx context.Context, p string) (taskID string, root *os.Root, rel, source string, err error) {
	if strings.TrimSpace(p) == "" {
		return "", nil, "", "", fmt.Errorf("is required: %w", errdefs.ErrInvalidArgument)
	}
	if strings.ContainsRune(p, 0) || strings.ContainsRune(p, '\\') {
		return "", nil, "", "", fmt.Errorf("path contains a NUL byte or backslash: %w", workspace.ErrPathEscapes)
	}
	p = strings.TrimPrefix(p, "/workspace/")
	p = strings.TrimLeft(p, "/")
	if rest, ok := strings.CutPrefix(p, "tasks/"); ok {
		id, inTask, _ := strings.Cut(rest, "/")
		if err := task.CheckID(id); err != nil {
			return "", nil, "", "", fmt.Errorf("%q does not name a task: %w", clip.String(id, 64), errdefs.ErrInvalidArgument)
		}
		out, ok := strings.CutPrefix(inTask, "output/")
		if !ok {
			return "", nil, "", "", fmt.Errorf("only a task's output/ can be made an attachment, not %q: %w", clip.String(inTask, 64), errdefs.ErrPermissionDenied)
		}
		c, err := workspace.Clean(out)
		if err != nil {
			return "", nil, "", "", err
		}
		if c == "." {
			return "", nil, "", "", fmt.Errorf("must name a file in the task's output/: %w", errdefs.ErrInvalidArgument)
		}
		if _, err := o.task(id); err != nil {
			return "", nil, "", "", err
		}
		dir, err := o.data.OpenTask(id)
		if err != nil {
			return "", nil, "", "", err
		}
		defer dir.Close()
		outRoot, err := dir.OpenRoot("output")
		if err != nil {
			return "", nil, "", "", fmt.Errorf("task %s has no output directory: %w", id, errdefs.ErrNotFound)
		}
		return id, outRoot, c, "tasks/" + id + "/output/" + c, nil
	}
	p = strings.TrimPrefix(p, "shared/")
	c, err := workspace.Clean(p)
	if err != nil {
		return "", nil, "", "", err
	}
	if c == "." {
		return "", nil, "", "", fmt.Errorf("must name a file: %w", errdefs.ErrInvalidArgument)
	}
	sh, err := o.data.Root().OpenRoot(workspace.DirShared)
	if err != nil {
		return "", nil, "", "", fmt.Errorf("open shared: %w", err)
	}
	return "", sh, c, "shared/" + c, nil
}

// CheckAttachments validates attachment_ids: well formed, known, no
// repeats. It returns the field errors and the attachments in order.
func (o *Library) CheckAttachments(ids []string) ([]service.Attachment, []error) {
	if len(ids) == 0 {
		return nil, nil
	}
	store, err := o.attachments()
	if err != nil {
		return nil, []error{&errdefs.FieldError{Field: "attachment_ids", Err: err}}
	}
	if len(ids) > maxAttachmentsPerSpawn {
		return nil, []error{errdefs.Field("attachment_ids", fmt.Sprintf("has %d ids, over the limit of %d", len(ids), maxAttachmentsPerSpawn))}
	}
	var errs []error
	var out []service.Attachment
	seen := map[string]bool{}
	for i, id := range ids {
		field := fmt.Sprintf("attachment_ids[%d]", i)
		if seen[id] {
			errs = append(errs, errdefs.Field(field, fmt.Sprintf("%s is listed twice", id)))
			continue
		}
		seen[id] = true
		m, err := store.Get(id)
		if err != nil {
			if fe := (*errdefs.FieldError)(nil); errors.As(err, &fe) {
				err = fe.Err
			}
			errs = append(errs, &errdefs.FieldError{Field: field, Err: err})
			continue
		}
		out = append(out, m)
	}
	return out, errs
}

// CopyAttachments copies attachments into the task's context/ under their
// original names, a suffix added where a name is taken, within budget
// bytes. Copies, not links: a symbolic link to attachments/ would not
// resolve inside the sandbox, which sees only /task and shared/, and a hard
// link would share the inode the worker can write, changing the stored
// attachment. It returns the names used, in order. Nothing is synced: the
// caller makes the task's directory durable (workspace.SyncTreeLater).
func (o *Library) CopyAttachments(dir *os.Root, atts []service.Attachment, taken map[string]bool, budget int64) ([]string, error) {
	var names []string
	for i, m := range atts {
		name := uniqueName(m.Name, taken)
		taken[name] = true
		n, err := workspace.CopyFileNoSync(o.opts.Attachments.Root(), m.File, dir, "context/"+name, budget)
		if err != nil {
			if errors.Is(err, errdefs.ErrTooLarge) {
				err = fmt.Errorf("%s does not fit in what is left of the context limit: %w", m.Name, errdefs.ErrTooLarge)
			}
			return nil, &errdefs.FieldError{Field: fmt.Sprintf("attachment_ids[%d]", i), Err: err}
		}
		budget -= n
		names = append(names, name)
	}
	return names, nil
}

// uniqueName returns name, or name with "-2", "-3", ... before its
// extension if taken.
func uniqueName(name string, taken map[string]bool) string {
	if !taken[name] {
		return name
	}
	ext := path.Ext(name)
	stem := strings.TrimSuffix(name, ext)
	for i := 2; ; i++ {
		if n := fmt.Sprintf("%s-%d%s", stem, i, ext); !taken[n] {
			return n
		}
	}
}

// PromptAttachments lists the attachments for prompt.md, under the names
// they took in context/.
func PromptAttachments(atts []service.Attachment, names []string) []ContextFile {
	var out []ContextFile
	for i, m := range atts {
		out = append(out, ContextFile{Name: names[i], About: fmt.Sprintf("(%s, %d bytes)", m.Type, m.Size)})
	}
	return out
}

// appendAnyVersion appends one event to a stream whatever its version:
// bridge and retention events on a task's stream change nothing of it.
func (o *Library) appendAnyVersion(ctx context.Context, stream string, ev eventstore.Proposed) error {
	_, err := o.store.Append(ctx, stream, eventstore.AnyVersion, ev)
	return err
}

// ContextNames returns the names context files take in context/.
func ContextNames(files []string) map[string]bool {
	taken := map[string]bool{}
	for _, f := range files {
		taken[path.Base(f)] = true
	}
	return taken
}

// ContextLeft returns what is left of the context limit after the context
// files already copied into dir.
func (o *Library) ContextLeft(dir *os.Root) int64 {
	max := o.opts.Limits.MaxContextBytes
	if max <= 0 {
		return 1 << 40
	}
	used, _ := workspace.Size(dir, "context")
	return max - used
}
