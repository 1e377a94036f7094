// Package projection folds events into current state: the tasks "table" of
// SPEC §3. It is never written on its own — only by applying events read
// from the store — and it is rebuilt at start-up: from the store's
// checkpoint of it, when there is one, and the events after it, else from
// the whole log (checkpoint.go).
//
// Writers change a task with Update, which appends with the task's expected
// stream version and returns once the projection has applied the new
// events, so a caller reads its own writes.
package projection

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/task"
)

// Tasks is the current state of every task. It is safe for concurrent use.
//
// A server holds every task it has run, ended ones by far the most, so
// what runs on every event, spawn, page of the list or look at the
// metrics goes by an index, not a walk over them all: the tasks that have
// not ended (SelectLive), the count in each status (Counts), the ids in
// creation order (List) and what ended tasks reported (Ended). With
// 100,000 ended tasks the walks took 4 ms, 17 ms, 158 ms and 425 ms
// (BenchmarkScale).
//
// Nor does it hold every ended task whole: past the keepEnded that ended
// last, a task is kept in part (endedTask: what the indexes, List's
// filters and Select read), and Get, List and ByIdempotencyKey fold it
// again from its events. So a server's memory grows by about 400 bytes an
// ended task, not by its prompt, summary and output list
// (BenchmarkEndedMemory); and by some 65 once a checkpoint has put it in
// the archive's table (archive.go), where a read of it pays a binary
// search and a decode: 0.5 µs for Status against 0.1 from a map, a list
// that walks them all faster, Select over all 40 % slower
// (BenchmarkArchived).
type Tasks struct {
	store eventstore.Store
	log   *slog.Logger

	mu     sync.RWMutex
	tasks  map[string]*task.Task // every task held whole
	old    layered[endedTask]    // the ended tasks held in part
	recent []string              // the tasks in tasks that ended, in the order they did
	keep   int                   // how many ended tasks are held whole: keepEnded
	live   map[string]*task.Task // the tasks not ended yet
	counts map[task.Status]int
	ended  Ended
	// order holds, sorted, the id of every task but those in old's table:
	// ids sort in creation order, and ids merges the two.
	order   []string
	byKey   layered[string] // idempotency key → task id
	pos     int64           // position of the last applied event
	changed chan struct{}   // closed and replaced on every apply
	// waits holds, for a live task someone waits on, the channel its next
	// event closes (TaskChanged).
	waits map[string]chan struct{}
	// saves holds the ended tasks whose save_to_shared copy is pending,
	// with when they ended (PendingSaves).
	saves map[string]time.Time
	// archived is closed once the archive of the checkpoint the
	// projection started from is in place (loadArchive); at once in one
	// that started without. Until then old and byKey hold only what
	// changed after the checkpoint, and what needs the rest waits.
	archived chan struct{}

	saving  sync.Mutex    // one SaveCheckpoint at a time: each seals old and byKey
	saved   int64         // position of the last checkpoint loaded or saved; under mu
	every   int64         // KeepCheckpoints saves after this many events: checkpointEvents
	spacing time.Duration // and no sooner after the last save: checkpointSpacing
}

// New returns an empty projection over store. Call Rebuild, then Run.
func New(store eventstore.Store, log *slog.Logger) *Tasks {
	archived := make(chan struct{})
	close(archived)
	return &Tasks{store: store, log: log, tasks: map[string]*task.Task{}, old: newOld(), keep: keepEnded, live: map[string]*task.Task{},
		counts: map[task.Status]int{}, ended: newEnded(), byKey: newKeys(), saves: map[string]time.Time{}, changed: make(chan struct{}),
		waits: map[string]chan struct{}{}, archived: archived, every: checkpointEvents, spacing: checkpointSpacing}
}

// keepEnded is how many of the tasks that ended last are held whole: those
// whose result a client is still likely to read, or a host to be told.
// At the prompt's size limit (64 KiB), some 70 MB at most.
const keepEnded = 1000

// endedTask is what the projection holds of an ended task past the
// keepEnded that ended last.
type endedTask struct {
	status       task.Status
	version      int64
	queueSeq     int64
	completedAt  time.Time
	conversation string
	workspace    string
	attachments  []string
	savePending  bool  // its save_to_shared copy is still to be done
	compactable  int64 // task.Task.Compactable
}

func inPart(t *task.Task) endedTask {
	e := endedTask{status: t.Status, version: t.Version, queueSeq: t.QueueSeq, conversation: t.ConversationID,
		workspace: t.Workspace, attachments: t.AttachmentIDs, savePending: t.SavePending(), compactable: t.Compactable}
	if t.CompletedAt != nil {
		e.completedAt = *t.CompletedAt
	}
	return e
}

// task is e as a Task with only the fields endedTask holds.
func (e endedTask) task(id string) task.Task {
	t := task.Task{ID: id, Status: e.status, Version: e.version, QueueSeq: e.queueSeq, Compactable: e.compactable,
		Spec: task.Spec{Workspace: e.workspace, AttachmentIDs: e.attachments, Origin: task.Origin{ConversationID: e.conversation}}}
	if !e.completedAt.IsZero() {
		at := e.completedAt
		t.CompletedAt = &at
	}
	if e.savePending {
		t.SharedOutputs = &task.SharedOutputs{State: task.SavePending}
	}
	return t
}

// DurationBuckets are the upper bounds, in seconds, of Ended's histogram
// of run times.
var DurationBuckets = []float64{1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200}

// Ended sums what tasks reported as they ended, for the server's metrics.
type Ended struct {
	// Within[i] counts the tasks that ran at most DurationBuckets[i]
	// seconds; Timed counts every task with a run time, Seconds sums them.
	Within  []uint64
	Timed   uint64
	Seconds float64
	// Agents sums the tokens and cost they reported, by agent.
	Agents map[string]Usage
}

// Usage is one agent's tokens (input counts cache reads and writes too)
// and cost in US dollars.
type Usage struct {
	InputTokens, OutputTokens int64
	CostUSD                   float64
}

func newEnded() Ended {
	return Ended{Within: make([]uint64, len(DurationBuckets)), Agents: map[string]Usage{}}
}

// add counts t, which has just ended: its run time, tokens and cost are
// set by its end and never change after.
func (e *Ended) add(t *task.Task) {
	if t.DurationMS != nil {
		s := float64(*t.DurationMS) / 1000
		e.Timed++
		e.Seconds += s
		for i, b := range DurationBuckets {
			if s <= b {
				e.Within[i]++
			}
		}
	}
	if t.Usage != nil || t.CostUSD > 0 {
		u := e.Agents[t.Agent]
		if t.Usage != nil {
			u.InputTokens += t.Usage.InputTokens + t.Usage.CacheReadTokens + t.Usage.CacheCreationTokens
			u.OutputTokens += t.Usage.OutputTokens
		}
		u.CostUSD += t.CostUSD
		e.Agents[t.Agent] = u
	}
}

// Rebuild brings the projection up to the store's current end. A new
// projection starts from the store's checkpoint of it, if the store keeps
// one this binary can read (checkpoint.go), and applies the events after
// it; else, or when the checkpoint cannot be read, from the whole log: a
// checkpoint that cannot be used is logged and passed over, never an
// error. From a checkpoint, it returns before the archive of ended tasks
// is read: that goes on in the background (Archived).
func (p *Tasks) Rebuild(ctx context.Context) error {
	start := time.Now()
	var from *head
	if p.Position() == 0 {
		from = p.loadCheckpoint(ctx)
	}
	err := p.fold(ctx)
	if from == nil {
		if err != nil {
			return err
		}
		p.log.Info("tasks rebuilt", "checkpoint", 0, "position", p.Position(), "took", time.Since(start).Round(time.Microsecond))
		return nil
	}
	// Read after the fold, not beside it: it would take half the CPU of
	// a small machine from the fold the server waits for, and an event
	// that needs a task in it meanwhile folds that task from the log.
	go p.loadArchive(context.WithoutCancel(ctx), from.archive)
	if err != nil {
		return err
	}
	p.log.Info("tasks rebuilt", "checkpoint", from.pos, "position", p.Position(), "took", time.Since(start).Round(time.Microsecond))
	return nil
}

// fold applies every event in the store after the projection's position
// up to the store's end. The log is read a batch ahead of the fold, in a
// goroutine of its own: reading and folding take about the same time
// (BenchmarkRebuild), and a server waits for both before it serves.
func (p *Tasks) fold(ctx context.Context) error {
	p.mu.RLock()
	after := p.pos
	p.mu.RUnlock()
	batches := make(chan []eventstore.Event, 1)
	var readErr error
	go func() {
		defer close(batches)
		for {
			evs, err := p.store.ReadAll(ctx, after, 1024)
			if err != nil || len(evs) == 0 {
				readErr = err
				return
			}
			after = evs[len(evs)-1].Position
			batches <- evs
		}
	}()
	for evs := range batches {
		p.apply(evs...)
	}
	if readErr != nil {
		return fmt.Errorf("rebuild tasks: %w", readErr)
	}
	return nil
}

// Run applies new events as the store commits them until ctx is done.
func (p *Tasks) Run(ctx context.Context) error {
	p.mu.RLock()
	sub := eventstore.Subscribe(p.store, p.pos)
	p.mu.RUnlock()
	for {
		e, err := sub.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("follow events: %w", err)
		}
		p.apply(e)
	}
}

func (p *Tasks) apply(evs ...eventstore.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range evs {
		if e.Position <= p.pos {
			continue // already applied (Rebuild and Run overlap)
		}
		p.pos = e.Position
		id := task.IDFromStream(e.StreamID)
		if id == "" {
			continue
		}
		t, held := p.tasks[id], true
		if t == nil && e.StreamVersion > 1 { // a first event has no task before it
			if ot, ok := p.heldInPart(id, e.Position); ok {
				t, held = &ot, false
			}
		}
		if t == nil {
			if e.Type != task.EventCreated {
				p.log.Warn("event for unknown task", logkey.TaskID, id, logkey.EventID, e.ID)
				continue
			}
			t = &task.Task{ID: id}
		}
		next := *t
		if err := next.Apply(e); err != nil {
			p.log.Error("cannot apply event", logkey.TaskID, id, logkey.EventID, e.ID, logkey.Error, err)
			continue
		}
		if held {
			p.tasks[id] = &next
		} else {
			p.old.set(id, inPart(&next)) // an event after its end: the version moves
		}
		p.index(t, &next)
		if ch, ok := p.waits[id]; ok {
			close(ch)
			delete(p.waits, id)
		}
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

// heldInPart returns task id, ended and held in part, as it was before
// the event at position before. Under p.mu. Until the archive is in place
// a task that ended before the checkpoint is not in old: it is folded
// from its events instead, a read of the store under the lock that only
// an event for such a task, in the moments after a start, pays.
func (p *Tasks) heldInPart(id string, before int64) (task.Task, bool) {
	if o, ok := p.old.get(id); ok {
		return o.task(id), true
	}
	if p.isArchived() {
		return task.Task{}, false
	}
	evs, err := p.store.ReadStream(context.Background(), task.StreamID(id), 0)
	if err != nil {
		p.log.Error("cannot read the events of an ended task before the archive is read: its event is not applied", logkey.TaskID, id, logkey.Error, err)
		return task.Task{}, false
	}
	t := task.Task{ID: id}
	for _, e := range evs {
		if e.Position >= before {
			break
		}
		if next := t; next.Apply(e) == nil {
			t = next
		}
	}
	return t, t.Status.Terminal()
}

// isArchived reports whether the archive is in place. Under p.mu.
func (p *Tasks) isArchived() bool {
	select {
	case <-p.archived:
		return true
	default:
		return false
	}
}

// Archived returns a channel closed once the projection holds every task:
// at once, but after a start from a checkpoint, whose archive of ended
// tasks Rebuild leaves to be read in the background. Until then what
// needs one of those tasks (Get, Status, List, Select,
// ByIdempotencyKey) waits.
func (p *Tasks) Archived() <-chan struct{} {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.archived
}

// index files next, which replaces prev (a new task's is the zero Task),
// in the indexes. Under p.mu.
func (p *Tasks) index(prev, next *task.Task) {
	if prev.Version == 0 {
		if next.IdempotencyKey != "" {
			p.byKey.set(next.IdempotencyKey, next.ID)
		}
		// A new id is almost always the largest: it goes at the end.
		i := len(p.order)
		if i > 0 && p.order[i-1] > next.ID {
			i, _ = slices.BinarySearch(p.order, next.ID)
		}
		p.order = slices.Insert(p.order, i, next.ID)
	} else if p.counts[prev.Status]--; p.counts[prev.Status] == 0 {
		delete(p.counts, prev.Status)
	}
	p.counts[next.Status]++
	if next.Status.Terminal() {
		if !prev.Status.Terminal() {
			p.ended.add(next)
			p.recent = append(p.recent, next.ID)
			p.trimRecent()
		}
		delete(p.live, next.ID)
	} else {
		p.live[next.ID] = next
	}
	if next.SavePending() && next.CompletedAt != nil {
		p.saves[next.ID] = *next.CompletedAt
	} else {
		delete(p.saves, next.ID)
	}
}

// trimRecent puts the ended tasks held whole past p.keep in part. Under
// p.mu.
func (p *Tasks) trimRecent() {
	for len(p.recent) > p.keep {
		id := p.recent[0]
		p.recent[0] = ""
		p.recent = p.recent[1:]
		p.old.set(id, inPart(p.tasks[id]))
		delete(p.tasks, id)
	}
}

// Position returns the position of the last applied event.
func (p *Tasks) Position() int64 {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.pos
}

// Changed returns a channel closed at the next apply, of any task's
// events. To wait for one task, TaskChanged.
func (p *Tasks) Changed() <-chan struct{} {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.changed
}

// TaskChanged returns a channel closed at the next event of task id, or
// nil (never ready) when the task has ended or does not exist: nothing
// left to wait for. Take it before reading the task (Get), so that an
// event between the two is not missed. A waiter on one task wakes for
// that task's events only: with Changed, every waiter woke on every
// event of every task (BenchmarkWaiters).
func (p *Tasks) TaskChanged(id string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live[id] == nil {
		return nil
	}
	ch, ok := p.waits[id]
	if !ok {
		ch = make(chan struct{})
		p.waits[id] = ch
	}
	return ch
}

// WaitPosition blocks until events up to pos are applied or ctx is done.
func (p *Tasks) WaitPosition(ctx context.Context, pos int64) error {
	for {
		p.mu.RLock()
		done, ch := p.pos >= pos, p.changed
		p.mu.RUnlock()
		if done {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Get returns a task, or an error of class errdefs.ErrNotFound.
func (p *Tasks) Get(id string) (task.Task, error) {
	t, _, old := p.find(id)
	switch {
	case t != nil:
		return *t, nil
	case old:
		return p.load(id)
	}
	return task.Task{}, fmt.Errorf("task %s: %w", id, errdefs.ErrNotFound)
}

// find returns task id as p holds it: whole (t), in part (o and old), or
// not at all. It waits for the archive (Archived) unless it finds the
// task without it.
func (p *Tasks) find(id string) (t *task.Task, o endedTask, old bool) {
	for {
		p.mu.RLock()
		t = p.tasks[id]
		if t == nil {
			o, old = p.old.get(id)
		}
		done := t != nil || old || p.isArchived()
		p.mu.RUnlock()
		if done {
			return t, o, old
		}
		<-p.Archived()
	}
}

// Status returns task id's status and, once it has ended, when it did,
// without reading the log: for the scans over every task directory or
// proxy, where Get would read back each task held in part. ok is false
// for a task the projection does not know.
func (p *Tasks) Status(id string) (st task.Status, ended time.Time, ok bool) {
	t, o, old := p.find(id)
	if t != nil {
		if t.CompletedAt != nil {
			ended = *t.CompletedAt
		}
		return t.Status, ended, true
	}
	return o.status, o.completedAt, old
}

// load folds an ended task held in part again from its events, as apply
// folded it: an event that does not apply is skipped (apply logged it).
// The store may hold events apply has not seen yet: the task is then newer
// than the projection, never older.
func (p *Tasks) load(id string) (task.Task, error) {
	evs, err := p.store.ReadStream(context.Background(), task.StreamID(id), 0)
	if err != nil {
		return task.Task{}, fmt.Errorf("read the events of task %s: %w", id, err)
	}
	t := task.Task{ID: id}
	for _, e := range evs {
		next := t
		if next.Apply(e) == nil {
			t = next
		}
	}
	if !t.Status.Terminal() {
		return task.Task{}, fmt.Errorf("task %s: its %d events fold to status %q, not an end", id, len(evs), t.Status)
	}
	return t, nil
}

// ByIdempotencyKey returns the task spawned with key, if any.
func (p *Tasks) ByIdempotencyKey(key string) (task.Task, bool, error) {
	for {
		p.mu.RLock()
		id, ok := p.byKey.get(key)
		done := ok || p.isArchived()
		p.mu.RUnlock()
		if ok {
			t, err := p.Get(id)
			return t, true, err
		}
		if done {
			return task.Task{}, false, nil
		}
		<-p.Archived()
	}
}

// Filter selects tasks for List.
type Filter struct {
	Status         task.Status
	ConversationID string
	Workspace      string
	Before         string // only tasks with an id (creation order) before this one
	Limit          int
}

// List returns the tasks matching f, newest first, and whether more match.
// It walks back from the newest (or from f.Before) and stops once it has
// one more than f.Limit; the ended tasks held in part are folded again
// after the walk, outside the lock.
func (p *Tasks) List(f Filter) ([]task.Task, bool, error) {
	match := func(status task.Status, conversation, workspace string) bool {
		return (f.Status == "" || status == f.Status) &&
			(f.ConversationID == "" || conversation == f.ConversationID) &&
			(f.Workspace == "" || workspace == f.Workspace)
	}
	type found struct {
		id string
		t  *task.Task // nil: held in part
	}
	var page []found
	more := false
	<-p.Archived()
	p.mu.RLock()
	for id, at := range p.ids(f.Before) {
		t, ok := p.tasks[id]
		if ok && !match(t.Status, t.ConversationID, t.Workspace) {
			continue
		}
		if !ok {
			var o endedTask
			if at >= 0 {
				o = p.old.getAt(id, at)
			} else {
				o, _ = p.old.get(id)
			}
			if !match(o.status, o.conversation, o.workspace) {
				continue
			}
		}
		if f.Limit > 0 && len(page) == f.Limit {
			more = true
			break
		}
		page = append(page, found{id, t})
	}
	p.mu.RUnlock()
	out := make([]task.Task, 0, len(page)) // an empty page is a list, not null
	for _, e := range page {
		if e.t != nil {
			out = append(out, *e.t)
			continue
		}
		t, err := p.load(e.id)
		if err != nil {
			return nil, false, err
		}
		out = append(out, t)
	}
	return out, more, nil
}

// ids yields the id of every task below before ("" for every task),
// newest first, with its index in old's table, or -1 for one in p.order:
// the two hold each id once between them. Under p.mu.
func (p *Tasks) ids(before string) iter.Seq2[string, int] {
	return func(yield func(string, int) bool) {
		t := p.old.table
		i, j := len(p.order), t.n
		if before != "" {
			i, _ = slices.BinarySearch(p.order, before)
			j = t.search(before)
		}
		for i > 0 || j > 0 {
			if j == 0 || (i > 0 && p.order[i-1] > t.key(j-1)) {
				i--
				if !yield(p.order[i], -1) {
					return
				}
			} else {
				j--
				if !yield(t.key(j), j) {
					return
				}
			}
		}
	}
}

// Select returns the tasks for which keep is true, in queue order (the
// position of their queued event), then creation order. It looks at every
// task the server has run (for those that have not ended, SelectLive), as
// the projection holds them: an ended task past the keepEnded that ended
// last has only its id, status, version, queue position, end, conversation
// id, workspace, attachment ids, the count of its events retention would
// remove (Compactable) and, if its save_to_shared copy is pending, that.
// Get returns it whole.
func (p *Tasks) Select(keep func(*task.Task) bool) []task.Task {
	return p.selectFrom(p.tasks, true, keep)
}

// SelectLive is Select over the tasks that have not ended.
func (p *Tasks) SelectLive(keep func(*task.Task) bool) []task.Task {
	return p.selectFrom(p.live, false, keep)
}

func (p *Tasks) selectFrom(from map[string]*task.Task, old bool, keep func(*task.Task) bool) []task.Task {
	if old {
		<-p.Archived()
	}
	p.mu.RLock()
	var out []task.Task
	for _, t := range from {
		if keep(t) {
			out = append(out, *t)
		}
	}
	if old {
		var t task.Task // one for every call of keep: a server holds many
		for id, o := range p.old.all() {
			if t = o.task(id); keep(&t) {
				out = append(out, t)
			}
		}
	}
	p.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].QueueSeq != out[j].QueueSeq {
			return out[i].QueueSeq < out[j].QueueSeq
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// PendingSaves returns the ended tasks whose save_to_shared copy is still
// to be done (task.Task.SavePending), in the order they ended: the
// copies' queue. A server holds few: a copy is bounded in time.
func (p *Tasks) PendingSaves() []string {
	type pending struct {
		id    string
		ended time.Time
	}
	p.mu.RLock()
	all := make([]pending, 0, len(p.saves))
	for id, at := range p.saves {
		all = append(all, pending{id, at})
	}
	p.mu.RUnlock()
	sort.Slice(all, func(i, j int) bool {
		if !all[i].ended.Equal(all[j].ended) {
			return all[i].ended.Before(all[j].ended)
		}
		return all[i].id < all[j].id
	})
	ids := make([]string, len(all))
	for i, e := range all {
		ids[i] = e.id
	}
	return ids
}

// SavePending reports whether task id has ended with its save_to_shared
// copy still to be done, without reading the log.
func (p *Tasks) SavePending(id string) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	_, ok := p.saves[id]
	return ok
}

// Ended returns what the ended tasks reported.
func (p *Tasks) Ended() Ended {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.ended.clone()
}

func (e Ended) clone() Ended {
	return Ended{Within: slices.Clone(e.Within), Timed: e.Timed, Seconds: e.Seconds, Agents: maps.Clone(e.Agents)}
}

// Counts returns how many tasks are in each status (none: absent).
func (p *Tasks) Counts() map[task.Status]int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return maps.Clone(p.counts)
}

// Waiting is the number of tasks pending or queued, plus each of ids the
// projection does not hold yet (tasks being created), taken at one
// instant: a task whose events are applied between two separate reads
// would be counted by neither. It does not wait for the archive
// (Archived): a task being created is in none.
func (p *Tasks) Waiting(ids iter.Seq[string]) int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	n := p.counts[task.Pending] + p.counts[task.Queued]
	for id := range ids {
		if _, held := p.tasks[id]; !held && !p.old.has(id) {
			n++
		}
	}
	return n
}

// NewEvent makes an event to append, marshalling payload (nil for none).
func NewEvent(typ string, payload any, actor string) eventstore.Proposed {
	data := json.RawMessage("{}")
	if payload != nil {
		b, err := json.Marshal(payload)
		if err != nil {
			panic(fmt.Sprintf("marshal %s payload: %v", typ, err)) // payloads are plain structs
		}
		data = b
	}
	return eventstore.Proposed{Type: typ, SchemaVersion: task.SchemaVersion, Data: data, Actor: actor}
}

// Create appends a new task's first events to a stream that must not exist.
// They share ctx's correlation id, or a new one when ctx has none; the
// first is caused by what ctx names.
func (p *Tasks) Create(ctx context.Context, id string, evs ...eventstore.Proposed) (task.Task, error) {
	c := eventstore.CauseOf(ctx)
	if c.CorrelationID == "" {
		c.CorrelationID = eventstore.NewCorrelationID()
	}
	return p.append(eventstore.WithCause(ctx, c), id, 0, evs)
}

// TaskCause returns ctx carrying the Cause of events appended to t's
// stream: t's correlation id, and as causation the request ctx names, if
// any, else t's latest event. Every append to a task stream goes under it.
func TaskCause(ctx context.Context, t task.Task) context.Context {
	c := eventstore.CauseOf(ctx)
	if t.CorrelationID != "" {
		c.CorrelationID = t.CorrelationID
	}
	if c.CausationID == "" {
		c.CausationID = t.LastEventID
	}
	return eventstore.WithCause(ctx, c)
}

// ErrNoChange is returned by an Update decision that has nothing to append.
var ErrNoChange = errors.New("no change")

// Update changes a task: decide looks at the current task and returns the
// events to append (or ErrNoChange, or another error to stop). Update
// appends them with the task's version as the expected version and, on a
// conflict with another writer, waits for the projection and decides again.
// It returns the task after the append.
func (p *Tasks) Update(ctx context.Context, id string, decide func(task.Task) ([]eventstore.Proposed, error)) (task.Task, error) {
	for attempt := 0; ; attempt++ {
		t, err := p.Get(id)
		if err != nil {
			return task.Task{}, err
		}
		evs, err := decide(t)
		if errors.Is(err, ErrNoChange) || (err == nil && len(evs) == 0) {
			return t, nil
		}
		if err != nil {
			return t, err
		}
		nt, err := p.append(TaskCause(ctx, t), id, t.Version, evs)
		if errors.Is(err, eventstore.ErrVersionConflict) && attempt < 50 {
			// Another writer got there first; wait until we see its event.
			wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			select {
			case <-p.Changed():
			case <-wctx.Done():
			}
			cancel()
			continue
		}
		return nt, err
	}
}

func (p *Tasks) append(ctx context.Context, id string, expected int64, evs []eventstore.Proposed) (task.Task, error) {
	got, err := p.store.Append(ctx, task.StreamID(id), expected, evs...)
	if err != nil {
		return task.Task{}, fmt.Errorf("record %s for task %s: %w", evs[0].Type, id, err)
	}
	if err := p.CatchUp(ctx, got[len(got)-1].Position); err != nil {
		return task.Task{}, err
	}
	return p.Get(id)
}

// CatchUp reads and applies events until the projection has applied pos.
// It reads the store itself instead of waiting for Run, so a writer sees its
// own events at once.
func (p *Tasks) CatchUp(ctx context.Context, pos int64) error {
	for p.Position() < pos {
		evs, err := p.store.ReadAll(ctx, p.Position(), 1024)
		if err != nil {
			return fmt.Errorf("catch up with events: %w", err)
		}
		if len(evs) == 0 {
			return p.WaitPosition(ctx, pos)
		}
		p.apply(evs...)
	}
	return nil
}
