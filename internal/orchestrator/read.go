package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/service"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

const (
	defaultListLimit = 50
	maxListLimit     = 500
)

// List returns a page of tasks, newest first.
func (o *Orchestrator) List(ctx context.Context, req service.ListRequest) (service.ListPage, error) {
	var errs []error
	st := task.Status(req.Status)
	if st != "" && !st.Valid() {
		errs = append(errs, errdefs.Field("status", fmt.Sprintf("%q is not a status (pending, queued, starting, running, success, failed, timeout, cancelled)", clip.String(req.Status, 32))))
	}
	limit := req.Limit
	if limit == 0 {
		limit = defaultListLimit
	}
	if limit < 1 || limit > maxListLimit {
		errs = append(errs, errdefs.Field("limit", fmt.Sprintf("must be between 1 and %d", maxListLimit)))
	}
	if req.Cursor != "" && !task.ValidID(req.Cursor) {
		errs = append(errs, errdefs.Field("cursor", "is not a cursor this server returned"))
	}
	if err := errors.Join(errs...); err != nil {
		return service.ListPage{}, err
	}
	ts, more, err := o.tasks.List(projection.Filter{Status: st, ConversationID: req.ConversationID, Workspace: req.Workspace, Before: req.Cursor, Limit: limit})
	if err != nil {
		return service.ListPage{}, err
	}
	page := service.ListPage{Tasks: ts}
	if more {
		page.NextCursor = ts[len(ts)-1].ID
	}
	return page, nil
}

// Result returns a task's result, waiting up to req.Wait for it to end.
func (o *Orchestrator) Result(ctx context.Context, req service.ResultRequest) (service.Result, error) {
	if err := task.CheckID(req.TaskID); err != nil {
		return service.Result{}, err
	}
	if req.Wait < 0 || req.Wait > service.MaxWait {
		return service.Result{}, errdefs.Field("wait", fmt.Sprintf("must be between 0 and %s", service.MaxWait))
	}
	t, err := o.waitEnded(ctx, req.TaskID, req.Wait)
	if err != nil {
		return service.Result{}, err
	}
	res := service.Result{Task: t, Done: t.Status.Terminal()}
	if len(req.IncludeFileContents) > 0 && res.Done {
		dir, err := o.data.OpenTask(t.ID)
		if err != nil {
			return service.Result{}, err
		}
		defer dir.Close()
		out, err := dir.OpenRoot("output")
		if err != nil {
			return service.Result{}, fmt.Errorf("open output of task %s: %w", t.ID, errdefs.ErrNotFound)
		}
		defer out.Close()
		res.FileContents = map[string]service.File{}
		for _, name := range req.IncludeFileContents {
			f, err := o.lib.ReadFile(out, name)
			if err != nil {
				res.FileContents[name] = service.File{Path: name, Note: err.Error()}
				continue
			}
			f.Note = fmt.Sprintf("full file: GET /api/tasks/%s/files/%s", t.ID, f.Path)
			res.FileContents[name] = f
		}
	}
	return res, nil
}

// waitEnded returns the task once it has ended or wait has passed.
func (o *Orchestrator) waitEnded(ctx context.Context, id string, wait time.Duration) (task.Task, error) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		ch := o.tasks.TaskChanged(id)
		t, err := o.tasks.Lookup(ctx, id)
		if err != nil || t.Status.Terminal() {
			return t, err
		}
		if ch == nil {
			continue // unknown until Lookup read it from the store: its channel now
		}
		select {
		case <-ch:
		case <-timer.C:
			return t, nil
		case <-ctx.Done():
			return t, nil
		}
	}
}

// Cancel stops a task. A pending or queued task ends at once; a starting or
// running one is asked to stop, and Cancel waits for it to end (up to the
// stop grace period and a little more).
func (o *Orchestrator) Cancel(ctx context.Context, id string) (task.Task, error) {
	if err := task.CheckID(id); err != nil {
		return task.Task{}, err
	}
	if _, err := o.tasks.Lookup(ctx, id); err != nil { // made through another server a moment ago?
		return task.Task{}, err
	}
	actor := service.ActorFrom(ctx)
	t, err := o.tasks.Update(ctx, id, func(t task.Task) ([]eventstore.Proposed, error) {
		switch {
		case t.Status.Terminal():
			return nil, fmt.Errorf("task %s already ended with status %s: %w", id, t.Status, errdefs.ErrConflict)
		case t.Status == task.Pending || t.Status == task.Queued:
			return []eventstore.Proposed{projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Cancelled, ErrorMessage: "cancelled before it started", Reason: "cancel"}, actor)}, nil
		case t.CancelRequested:
			return nil, projection.ErrNoChange
		}
		return []eventstore.Proposed{projection.NewEvent(task.EventCancelRequested, task.CancelRequested{Reason: "cancelled by " + actor}, actor)}, nil
	})
	if err != nil || t.Status.Terminal() {
		return t, err
	}
	return o.waitEnded(ctx, id, o.opts.Limits.StopGrace+5*time.Second)
}

// Logs writes a task's transcript to w.
func (o *Orchestrator) Logs(ctx context.Context, req service.LogsRequest, w io.Writer) error {
	t, err := o.Get(ctx, req.TaskID)
	if err != nil {
		return err
	}
	var names []string
	switch req.Stream {
	case "", "agent":
		names = []string{"logs/agent.jsonl", "logs/stdout.log"}
	case "stderr":
		names = []string{"logs/stderr.log"}
	case "prompt":
		names = []string{workerproto.PromptFile}
	default:
		return errdefs.Field("stream", "must be agent, stderr or prompt")
	}
	var f *os.File
	for {
		ch := o.tasks.TaskChanged(t.ID)
		t, _ = o.tasks.Get(t.ID)
		ended := t.Status.Terminal()
		if f == nil {
			// The directory is opened anew each time: a task that claims
			// a warm sandbox gets another directory inode at the same
			// path, with its entries moved in.
			dir, err := o.data.OpenTask(t.ID)
			if err != nil {
				return err
			}
			for _, n := range names {
				if g, _, err := workspace.OpenFile(dir, n); err == nil {
					f = g
					defer f.Close()
					break
				}
			}
			dir.Close()
		}
		if f != nil {
			n, err := io.Copy(w, f)
			if err != nil && !errors.Is(err, fs.ErrClosed) {
				return err
			}
			if n > 0 {
				if fl, ok := w.(interface{ Flush() }); ok {
					fl.Flush()
				}
			}
		}
		if !req.Follow || ended {
			return nil
		}
		select {
		case <-ch:
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return nil
		}
	}
}

// compacted says, for the error of an after that names no event, that
// retention compacted task id's events (if id is a task's, and it did):
// the event may have been one of those it removed.
func (o *Orchestrator) compacted(ctx context.Context, id string) string {
	if id == "" {
		return ""
	}
	evs, err := o.store.ReadStream(ctx, task.StreamID(id), 0)
	if err != nil {
		return ""
	}
	for _, e := range slices.Backward(evs) {
		var p task.Compacted
		if e.Type == task.EventCompacted && json.Unmarshal(e.Data, &p) == nil {
			return fmt.Sprintf(" among the events of task %s: retention has removed %d of them (of the versions up to %d) since the task ended; read its events without after",
				id, p.Removed, p.Through)
		}
	}
	return ""
}

// Events calls fn with the events req selects.
func (o *Orchestrator) Events(ctx context.Context, req service.EventsRequest, fn func(eventstore.Event) error) error {
	var stream string
	if req.TaskID != "" {
		if _, err := o.Get(ctx, req.TaskID); err != nil {
			return err
		}
		stream = task.StreamID(req.TaskID)
	} else if req.ConversationID != "" {
		if len(req.ConversationID) > 255 || strings.ContainsAny(req.ConversationID, "\x00\n") {
			return errdefs.Field("conversation_id", "must be at most 255 bytes, without NUL or newline")
		}
		stream = task.ConversationStreamID(req.ConversationID)
	}
	var after int64
	if req.After == service.AfterNow {
		after = o.tasks.Position()
	} else if req.After != "" {
		pos, err := o.store.Position(ctx, req.After)
		if err != nil {
			return &errdefs.FieldError{Field: "after", Err: fmt.Errorf("no event %q%s: %w", clip.String(req.After, 64), o.compacted(ctx, req.TaskID), errdefs.ErrNotFound)}
		}
		after = pos
	}
	if !req.Follow && stream != "" {
		evs, err := o.store.ReadStream(ctx, stream, 0)
		if err != nil {
			return err
		}
		for _, e := range evs {
			if e.Position > after {
				if err := fn(e); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if !req.Follow {
		for {
			evs, err := o.store.ReadAll(ctx, after, 512)
			if err != nil || len(evs) == 0 {
				return err
			}
			for _, e := range evs {
				if stream == "" || e.StreamID == stream {
					if err := fn(e); err != nil {
						return err
					}
				}
			}
			after = evs[len(evs)-1].Position
		}
	}
	sub := eventstore.Subscribe(o.store, after)
	for {
		e, err := sub.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if stream == "" || e.StreamID == stream {
			if err := fn(e); err != nil {
				return err
			}
		}
	}
}
