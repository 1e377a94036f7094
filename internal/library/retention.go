package library

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workspace"
)

// Retention says how long things are kept. Zero durations keep forever.
type Retention struct {
	// TaskDirs is how long an ended task's directory is kept after it ended
	// (ai_worker_config.task_retention_hours).
	TaskDirs time.Duration
	// Attachments is how long an attachment is kept after it was created or
	// last named by a task, whichever is later; while a task that names it
	// has not ended, it is always kept.
	Attachments time.Duration
	// Events is how long an ended task's events are kept whole after it
	// ended (ai_worker_config.event_retention_hours): then those that told
	// how it ran are compacted away (gcEvents).
	Events time.Duration
	// Interval is the time between two sweeps of RunRetention.
	Interval time.Duration
}

// orphanAge is how old a content or temporary file of attachments/ without
// metadata must be before the sweeper removes it: older than any upload
// still being written.
const orphanAge = 24 * time.Hour

// RunRetention sweeps once at start and then every Retention.Interval
// until ctx is done. A sweep's failures are recorded as events and
// retried by the next sweep; they never end the loop.
func (o *Library) RunRetention(ctx context.Context) error {
	every := o.opts.Retention.Interval
	if every <= 0 {
		every = 10 * time.Minute
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if rep, err := o.GC(eventstore.Begin(ctx, "retention"), service.GCRequest{}); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			o.log.Warn("retention sweep failed", "err", err)
		} else if n := len(rep.TaskDirectories) + len(rep.Attachments); n > 0 || len(rep.TaskEvents) > 0 || len(rep.Failed) > 0 {
			o.log.Info("retention sweep", "removed", n, "bytes", rep.Bytes, "compacted", len(rep.TaskEvents), "failed", len(rep.Failed))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// GC removes the directories of tasks that ended more than
// Retention.TaskDirs ago (never one that has not ended, never a directory
// no event knows, never one whose save_to_shared copy is still to be
// recorded) and attachments unused for Retention.Attachments, each
// with an event, and compacts the events of tasks that ended more than
// Retention.Events ago (gcEvents). A failed or partial removal is a
// removal_failed event, and the next sweep tries again.
func (o *Library) GC(ctx context.Context, req service.GCRequest) (service.GCReport, error) {
	o.gcMu.Lock()
	defer o.gcMu.Unlock()
	now := o.now().UTC()
	rep := service.GCReport{DryRun: req.DryRun, Now: now, TaskDirectories: []service.GCItem{}, Attachments: []service.GCItem{}, TaskEvents: []service.GCEvents{}}
	if err := o.gcTasks(ctx, now, req.DryRun, &rep); err != nil {
		return rep, err
	}
	if err := o.gcAttachments(ctx, now, req.DryRun, &rep); err != nil {
		return rep, err
	}
	if err := o.gcEvents(ctx, now, req.DryRun, &rep); err != nil {
		return rep, err
	}
	return rep, nil
}

func (o *Library) gcTasks(ctx context.Context, now time.Time, dry bool, rep *service.GCReport) error {
	keep := o.opts.Retention.TaskDirs
	if keep <= 0 {
		return nil
	}
	ids, err := o.data.TaskIDs()
	if err != nil {
		return fmt.Errorf("list task directories: %w", err)
	}
	for _, id := range ids {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		st, ended, ok := o.tasks.Status(id)
		if !ok || !st.Terminal() || ended.IsZero() || now.Sub(ended) < keep {
			continue
		}
		// save_to_shared reads the directory after the task's end: it
		// stays until the copy is recorded, and is never removed while
		// a copy reads it (the copy holds the task's lock throughout).
		if o.tasks.SavePending(id) {
			continue
		}
		if err := o.gcTask(ctx, id, ended, now, keep, dry, rep); err != nil {
			return err
		}
	}
	return nil
}

// gcTask removes the directory of task id, which ended at ended, under the
// task's save lock; unless, looked at again under it, its save_to_shared
// copy is pending.
func (o *Library) gcTask(ctx context.Context, id string, ended, now time.Time, keep time.Duration, dry bool, rep *service.GCReport) error {
	unlock := o.saving.lock(id)
	defer unlock()
	if o.tasks.SavePending(id) {
		return nil
	}
	item := service.GCItem{Path: workspace.DirTasks + "/" + id, ID: id, Since: ended, Reason: fmt.Sprintf("ended %s ago, retention %s", now.Sub(ended).Round(time.Minute), keep)}
	if dir, err := o.data.OpenTask(id); err == nil {
		item.Bytes, _ = workspace.Size(dir, ".")
		dir.Close()
	}
	if dry {
		rep.TaskDirectories = append(rep.TaskDirectories, item)
		rep.Bytes += item.Bytes
		return nil
	}
	if err := o.data.RemoveTask(id); err != nil {
		item.Error = err.Error()
		rep.Failed = append(rep.Failed, item)
		o.recordFailure(ctx, task.StreamID(id), item.Path, err)
		return nil
	}
	rep.TaskDirectories = append(rep.TaskDirectories, item)
	rep.Bytes += item.Bytes
	ev := projection.NewEvent(task.EventDirectoryRemoved, task.DirectoryRemoved{Directory: item.Path, Bytes: item.Bytes, EndedAt: ended}, "corral/retention")
	if err := o.appendAnyVersion(ctx, task.StreamID(id), ev); err != nil {
		return fmt.Errorf("record removal of %s: %w", item.Path, err)
	}
	o.log.Info("task directory removed", "task_id", id, "bytes", item.Bytes)
	return nil
}

func (o *Library) gcAttachments(ctx context.Context, now time.Time, dry bool, rep *service.GCReport) error {
	keep := o.opts.Retention.Attachments
	store := o.opts.Attachments
	if keep <= 0 || store == nil {
		return nil
	}
	// An attachment is in use while a task naming it has not ended, and
	// was last used when the latest such task ended.
	inUse := map[string]bool{}
	lastUse := map[string]time.Time{}
	for _, t := range o.tasks.Select(func(t *task.Task) bool { return len(t.AttachmentIDs) > 0 }) {
		for _, id := range t.AttachmentIDs {
			switch {
			case !t.Status.Terminal() || t.CompletedAt == nil:
				inUse[id] = true
			case t.CompletedAt.After(lastUse[id]):
				lastUse[id] = *t.CompletedAt
			}
		}
	}
	atts, err := store.List()
	if err != nil {
		return err
	}
	for _, m := range atts {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		since := m.CreatedAt
		if lastUse[m.ID].After(since) {
			since = lastUse[m.ID]
		}
		if inUse[m.ID] || now.Sub(since) < keep {
			continue
		}
		item := service.GCItem{Path: workspace.DirAttachments + "/" + m.File, ID: m.ID, Bytes: m.Size, Since: since, Reason: fmt.Sprintf("unused for %s, retention %s", now.Sub(since).Round(time.Minute), keep)}
		if dry {
			rep.Attachments = append(rep.Attachments, item)
			rep.Bytes += item.Bytes
			continue
		}
		stream := task.AttachmentStreamID(m.ID)
		if err := store.Remove(m.ID); err != nil {
			item.Error = err.Error()
			rep.Failed = append(rep.Failed, item)
			o.recordFailure(ctx, stream, item.Path, err)
			continue
		}
		rep.Attachments = append(rep.Attachments, item)
		rep.Bytes += item.Bytes
		ev := projection.NewEvent(task.EventAttachmentRemoved, task.AttachmentRemoved{AttachmentID: m.ID, File: m.File, Bytes: m.Size, Reason: "retention"}, "corral/retention")
		if err := o.appendAnyVersion(ctx, stream, ev); err != nil {
			return fmt.Errorf("record removal of attachment %s: %w", m.ID, err)
		}
		o.log.Info("attachment removed", "attachment_id", m.ID, "bytes", m.Size)
	}
	orphans, err := store.Orphans(now.Add(-orphanAge))
	if err != nil {
		return fmt.Errorf("list orphan attachment files: %w", err)
	}
	for _, p := range orphans {
		item := service.GCItem{Path: workspace.DirAttachments + "/" + p, Reason: "content without metadata (an interrupted upload or removal)"}
		if info, err := store.Root().Stat(p); err == nil {
			item.Bytes, item.Since = info.Size(), info.ModTime().UTC()
		}
		if dry {
			rep.Attachments = append(rep.Attachments, item)
			rep.Bytes += item.Bytes
			continue
		}
		if err := store.RemoveFile(p); err != nil {
			item.Error = err.Error()
			rep.Failed = append(rep.Failed, item)
			o.recordFailure(ctx, task.SystemStream, item.Path, err)
			continue
		}
		rep.Attachments = append(rep.Attachments, item)
		rep.Bytes += item.Bytes
		ev := projection.NewEvent(task.EventAttachmentRemoved, task.AttachmentRemoved{File: p, Bytes: item.Bytes, Reason: "orphan"}, "corral/retention")
		if err := o.appendAnyVersion(ctx, task.SystemStream, ev); err != nil {
			return fmt.Errorf("record removal of %s: %w", item.Path, err)
		}
	}
	return nil
}

// compactBatch bounds how many tasks' events one sweep compacts, the
// oldest ended first, each in a transaction of its own: a backlog (the
// first sweep of a server that has run for years) goes a batch a sweep,
// and an append waits for one task's compaction at most.
const compactBatch = 200

// gcEvents compacts the event streams of the tasks that ended more than
// Retention.Events ago: the events task.CompactedTypes names (what the
// agent did, what the sandbox connected to, its restarts) go, and a
// task_events_compacted event after them says how many. What a task's
// record is folded from stays, so the task is listed and read as it
// ended, after a restart too. A task that has not ended is never touched,
// nor is one with nothing to remove (task.Task.Compactable), and a task
// whose stream moves while it is compacted (an event of its own, or
// another sweep) is left as it is, for the next sweep.
func (o *Library) gcEvents(ctx context.Context, now time.Time, dry bool, rep *service.GCReport) error {
	keep := o.opts.Retention.Events
	c, ok := o.store.(eventstore.Compactor)
	if keep <= 0 || !ok {
		return nil
	}
	due := o.tasks.Select(func(t *task.Task) bool {
		return t.Compactable > 0 && t.Status.Terminal() && t.CompletedAt != nil && now.Sub(*t.CompletedAt) >= keep
	})
	sort.Slice(due, func(i, j int) bool { return due[i].CompletedAt.Before(*due[j].CompletedAt) })
	for _, t := range due[:min(len(due), compactBatch)] {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := o.compactTask(ctx, c, t.ID, *t.CompletedAt, now, keep, dry, rep); err != nil {
			return err
		}
	}
	return nil
}

// compactTask compacts the event stream of task id, which ended at ended,
// as it reads it now.
func (o *Library) compactTask(ctx context.Context, c eventstore.Compactor, id string, ended, now time.Time, keep time.Duration, dry bool, rep *service.GCReport) error {
	stream := task.StreamID(id)
	evs, err := o.store.ReadStream(ctx, stream, 0)
	if err != nil {
		return fmt.Errorf("read the events of task %s: %w", id, err)
	}
	item := service.GCEvents{TaskID: id, Since: ended, Reason: fmt.Sprintf("ended %s ago, event retention %s", now.Sub(ended).Round(time.Minute), keep)}
	before := 0 // what earlier compactions removed: their last marker counts it all
	for _, e := range evs {
		switch {
		case e.Type == task.EventCompacted:
			var p task.Compacted
			if json.Unmarshal(e.Data, &p) == nil {
				before = p.Removed
			}
		case slices.Contains(task.CompactedTypes, e.Type):
			item.Events++
			item.Bytes += int64(len(e.Data))
		}
	}
	if item.Events == 0 {
		return nil // the projection has yet to apply a compaction of the stream
	}
	if dry {
		rep.TaskEvents = append(rep.TaskEvents, item)
		return nil
	}
	version := evs[len(evs)-1].StreamVersion
	marker := projection.NewEvent(task.EventCompacted, task.Compacted{Removed: before + item.Events, Through: version}, "corral/retention")
	_, _, err = c.Compact(ctx, stream, version, task.CompactedTypes, marker)
	if errors.Is(err, eventstore.ErrVersionConflict) {
		return nil // an event came meanwhile: the next sweep reads the stream again
	}
	if err != nil {
		return fmt.Errorf("compact the events of task %s: %w", id, err)
	}
	rep.TaskEvents = append(rep.TaskEvents, item)
	o.log.Info("task events compacted", "task_id", id, "events", item.Events, "bytes", item.Bytes)
	return nil
}

// recordFailure appends removal_failed; the thing stays, and the next
// sweep tries again.
func (o *Library) recordFailure(ctx context.Context, stream, p string, err error) {
	o.log.Warn("removal failed; retrying next sweep", "path", p, "err", err)
	ev := projection.NewEvent(task.EventRemovalFailed, task.RemovalFailed{Path: p, Error: err.Error()}, "corral/retention")
	if aerr := o.appendAnyVersion(ctx, stream, ev); aerr != nil && !errors.Is(aerr, context.Canceled) {
		o.log.Warn("cannot record failed removal", "path", p, "err", aerr)
	}
}
