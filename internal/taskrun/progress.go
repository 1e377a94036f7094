package taskrun

import (
	"context"
	"fmt"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/webhook"
	"github.com/corral-dev/corral/internal/workerproto"
)

// WorkerProgress takes a progress report from a worker: it verifies it as
// a completion is verified (the task's derived key, the timestamp window,
// a webhook id never seen) and appends one task_progress event per item to
// the task's stream, with any expected version. A report for a task that
// has not started is refused with errdefs.ErrFailedPrecondition; one for a
// task starting waits for its start to be recorded; one for a task that
// ended (the last report races the completion) is recorded. It returns
// the number of events appended.
func (o *Runner) WorkerProgress(ctx context.Context, m webhook.Signed) (int, error) {
	p, err := o.opts.Verifier.VerifyProgress(m)
	if err != nil {
		return 0, err
	}
	t, err := o.started(ctx, p.TaskID)
	if err != nil {
		o.opts.Verifier.Forget(p.WebhookID) // let the worker's retry through
		return 0, err
	}
	evs := o.progressEvents(t, p.Items)
	if len(evs) == 0 {
		return 0, nil
	}
	if _, err := o.store.Append(projection.TaskCause(ctx, t), task.StreamID(t.ID), eventstore.AnyVersion, evs...); err != nil {
		o.opts.Verifier.Forget(p.WebhookID)
		return 0, fmt.Errorf("record progress of task %s: %w", t.ID, err)
	}
	return len(evs), nil
}

// progressEvents are the task_progress events of a worker's progress
// items, each clipped and redacted: the worker redacts its agent's
// secrets, and the sandbox is not trusted to have done so.
func (o *Runner) progressEvents(t task.Task, items []webhook.ProgressItem) []eventstore.Proposed {
	secrets := workerproto.Secrets(o.opts.Agents[t.Agent].Env)
	red := func(s string) string { return workerproto.RedactString(s, secrets) }
	actor := "worker/" + t.ID
	evs := make([]eventstore.Proposed, 0, len(items))
	for _, it := range items {
		evs = append(evs, projection.NewEvent(task.EventProgress, task.Progress{
			Kind: red(clipTo(it.Kind, 32)), Text: red(clipTo(it.Text, 1024)), Tool: red(clipTo(it.Tool, 128)),
			Input: red(clipTo(it.Input, 512)), Status: red(clipTo(it.Status, 16)), Coalesced: max(it.Coalesced, 0),
		}, actor))
	}
	return evs
}

func clipTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
