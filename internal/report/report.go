// Package report tells the conversation a workspace task came from that it
// started and that it ended (seed 002 §8, by event): for every workspace
// task with an origin conversation, a workspace_task_spawned event on that
// conversation's stream, and then a workspace_task_completed or
// workspace_task_failed event, each once, whatever crashes come between. The
// host hears it through every channel that follows events: the signed
// callback, SSE on /api/conversations/{id}/events, and MCP.
package report

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/task"
)

// Actor is who reports.
const Actor = "corral/report"

// Run reports every ended workspace task not reported yet (from the start
// of the log), then each as it ends, until ctx is done.
func Run(ctx context.Context, store eventstore.Store, log *slog.Logger) error {
	r := &reporter{store: store, log: log, reports: map[string]bool{}}
	var after int64
	for {
		evs, err := store.ReadAll(ctx, after, 1024)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read events to report: %w", err)
		}
		if len(evs) == 0 {
			break
		}
		for _, e := range evs {
			after = e.Position
			r.handle(ctx, e)
		}
	}
	sub := eventstore.Subscribe(store, after)
	for {
		e, err := sub.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("follow events to report: %w", err)
		}
		r.handle(ctx, e)
	}
}

// reporter is Run's state: the tasks created and not ended whose end it
// reports, workspace tasks with an origin conversation, learnt from their
// task_created events. Run reads the log from its start, so it sees every
// task's creation before its end, and the end of any other task costs no
// read of its stream.
type reporter struct {
	store   eventstore.Store
	log     *slog.Logger
	reports map[string]bool // task id → its end is reported
}

func (r *reporter) handle(ctx context.Context, e eventstore.Event) {
	id := task.IDFromStream(e.StreamID)
	if id == "" {
		return
	}
	switch e.Type {
	case task.EventCreated:
		var c task.Created
		// One that does not decode is looked at whole at its end, where
		// the error shows.
		if err := json.Unmarshal(e.Data, &c); err != nil || reportTo(c.Spec) != "" {
			r.reports[id] = true
		}
		if conv := reportTo(c.Spec); conv != "" {
			ev := projection.NewEvent(task.EventWorkspaceTaskSpawned, task.WorkspaceTaskSpawned{TaskID: id, Workspace: c.Spec.Workspace, Origin: c.Spec.Origin}, Actor)
			ev.CausationID, ev.CorrelationID = e.ID, e.CorrelationID
			if err := appendOnce(ctx, r.store, conv, id, ev); err != nil && ctx.Err() == nil {
				r.log.Warn("cannot report a workspace task's start", "event_id", e.ID, "err", err)
			}
		}
	case task.EventCompleted:
		if !r.reports[id] {
			return
		}
		delete(r.reports, id)
		if err := report(ctx, r.store, e); err != nil && ctx.Err() == nil {
			r.log.Warn("cannot report a workspace task's end", "event_id", e.ID, "err", err)
		}
	}
}

// reportTo is the conversation the end of a task with spec s is reported
// to: a workspace task's origin conversation; "" for none.
func reportTo(s task.Spec) string {
	if s.Workspace == "" {
		return ""
	}
	return s.ReportConversation()
}

// report appends the report of the task whose terminal event is e, unless
// its conversation has it already.
func report(ctx context.Context, store eventstore.Store, e eventstore.Event) error {
	evs, err := store.ReadStream(ctx, e.StreamID, 0)
	if err != nil {
		return err
	}
	t := task.Task{ID: task.IDFromStream(e.StreamID)}
	for _, te := range evs {
		if te.StreamVersion > e.StreamVersion {
			break
		}
		if err := t.Apply(te); err != nil {
			return err
		}
	}
	conv := reportTo(t.Spec)
	if conv == "" {
		return nil
	}
	typ := task.EventWorkspaceTaskFailed
	if t.Status == task.Success {
		typ = task.EventWorkspaceTaskCompleted
	}
	ev := projection.NewEvent(typ, task.WorkspaceTaskReport{
		TaskID: t.ID, Workspace: t.Workspace, Status: t.Status, Summary: t.Summary,
		ErrorMessage: t.ErrorMessage, Changes: t.Changes, Origin: t.Origin,
	}, Actor)
	ev.CausationID, ev.CorrelationID = e.ID, e.CorrelationID
	return appendOnce(ctx, store, conv, t.ID, ev)
}

// appendOnce appends ev, a report of task id, to conversation conv's
// stream unless one of its type for that task is there. The stream is read
// and appended at its version: a report another append raced is seen on
// the retry.
func appendOnce(ctx context.Context, store eventstore.Store, conv, id string, ev eventstore.Proposed) error {
	stream := task.ConversationStreamID(conv)
	ended := ev.Type == task.EventWorkspaceTaskCompleted || ev.Type == task.EventWorkspaceTaskFailed
	for {
		evs, err := store.ReadStream(ctx, stream, 0)
		if err != nil {
			return err
		}
		for _, ce := range evs {
			var r struct {
				TaskID string `json:"task_id"`
			}
			same := ce.Type == ev.Type || ended && (ce.Type == task.EventWorkspaceTaskCompleted || ce.Type == task.EventWorkspaceTaskFailed)
			if same && json.Unmarshal(ce.Data, &r) == nil && r.TaskID == id {
				return nil // reported already
			}
		}
		_, err = store.Append(ctx, stream, int64(len(evs)), ev)
		if err == nil || !errors.Is(err, eventstore.ErrVersionConflict) {
			return err
		}
	}
}
