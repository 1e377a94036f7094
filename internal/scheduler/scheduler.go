// Package scheduler starts queued tasks in sandboxes and watches them to the
// end: a FIFO queue bounded by max_concurrent_workers, the task timeout,
// cancel in any state, and start-up reconciliation of the tasks, sandboxes
// and task directories a crashed server left behind (SPEC §2, §3).
//
// The scheduler holds no task state of its own: it reads the projection and
// changes tasks only by appending events through projection.Update, so a
// restart loses nothing. Sandboxes outlive the server (unless it ends
// its tasks as it shuts down: StopAll); on start-up Reconcile reattaches
// to the ones still running.
//
// Several servers (replicas, package cluster) may share one store. Then
// the leader alone decides which queued task starts and on which replica
// (the least busy one that offers its runtime), recording the replica in
// task_starting, so max_concurrent_workers holds for the cluster; each
// replica starts the tasks given to it (pickup) and watches them. A task
// whose replica's lease lapsed is adopted by a survivor (task_adopted,
// under the task's version, so by one): the survivor reattaches to its
// sandbox, starts it again if its worker never had its start, or ends it,
// exactly as a restarted server does with its own. A restarted server is a
// new replica, and adopts what its predecessor ran the same way.
package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/task"
)

// Actor names the scheduler uses on the events it records.
const (
	ActorScheduler  = "corral/scheduler"
	ActorReconciler = "corral/reconciler"
)

// Options configure a Scheduler.
type Options struct {
	// MaxConcurrent is how many tasks may be starting or running at once.
	MaxConcurrent int
	// StopGrace is how long a stopped sandbox has between SIGTERM and SIGKILL.
	StopGrace time.Duration
	// ExitGrace is how long a sandbox may keep running after its worker
	// reported completion by webhook before it is stopped.
	ExitGrace time.Duration
	// Runtimes are the available backends by name.
	Runtimes map[string]sandbox.Runtime
	// Members is this server's view of the cluster; nil: a server alone
	// on its store (cluster.Solo).
	Members cluster.Members
	// Runner is the rest of a task's life in a sandbox (taskrun.Runner).
	Runner Runner
	// Writers is who writes each named workspace, shared with the session
	// manager: a workspace task starts only when it can hold its
	// workspace, and holds it until its sandbox is gone. Nil: the
	// scheduler's own.
	Writers *task.Writers
	// Quota, when set, holds each task's directory to its disk quota from
	// before its sandbox starts until the sandbox is gone.
	Quota Quota
	// Now returns the current time; time.Now when nil.
	Now func() time.Time
	// RecordRetry is the first wait before recording a task's end again
	// after the store refused it; it doubles up to 30 s. Default 1 s.
	RecordRetry time.Duration
	// DestroyRetry is the first wait before a sandbox whose destroy
	// failed (and was not quarantined) is destroyed again; it doubles up
	// to 5 minutes, as long as the server runs. Default 5 s.
	DestroyRetry time.Duration
	// Crash, when set, is called at each of sandbox.CrashPoints the
	// scheduler passes (created, started, exited, ended); the fault tests
	// have the server die there. Nil in production.
	Crash func(point string)
}

// Runner is what the scheduler asks of a task's life in a sandbox beyond
// starting, watching and stopping it: taskrun.Runner.
type Runner interface {
	// Reconcile is the runner's part of the one start-up reconciliation,
	// done first: task directories no event knows.
	Reconcile(ctx context.Context) error
	// Adopt takes up what a task this server adopts (after a restart, or
	// from a replica gone) needs of the runner before it is reattached:
	// its egress proxy, listening again where its sandbox has it mounted.
	Adopt(ctx context.Context, t task.Task)
	// Prepare builds the sandbox spec for a task that is starting.
	Prepare(ctx context.Context, t task.Task) (sandbox.Spec, error)
	// Collect reads a finished task's result from its directory. exit is
	// the sandbox's exit status, or nil when it is unknown (the sandbox was
	// gone after a restart). It runs in the supervision that holds the
	// task's slot, so it does no more than read: save_to_shared's copy
	// follows the end, outside the scheduler (library.RunSaves).
	Collect(ctx context.Context, t task.Task, exit *sandbox.ExitStatus) task.Completed
	// Reported returns a task's result, as Collect does, when its worker
	// has already written its final status: a task that finished while the
	// server was down is then recorded at once on reattach, not when its
	// worker next retries its report.
	Reported(ctx context.Context, t task.Task) (task.Completed, bool)
	// Released is called once a task's sandbox is destroyed (nothing of it
	// can change its directories any more), after the task's end.
	Released(ctx context.Context, t task.Task)
}

// Quota is a task directory's disk quota, as the scheduler drives it.
type Quota interface {
	// Limit is called before a task's sandbox is created, to set a limit
	// the kernel enforces where the host can. An error is logged and the
	// task runs with Check alone.
	Limit(ctx context.Context, t task.Task) error
	// Check measures a task's directory from its sandbox's start until the
	// sandbox is gone, also after the task ended, and once more when the
	// sandbox exits. An error says the directory is over its quota: the
	// task, if it has not ended, ends as failed with the error's message
	// (reason "quota"), and the sandbox is killed at once. Otherwise
	// Check returns how soon to call it again.
	Check(ctx context.Context, t task.Task) (time.Duration, error)
	// Release is called once a task's sandbox is gone.
	Release(ctx context.Context, t task.Task)
}

// Scheduler runs queued tasks. Create it with New and start it with Run.
type Scheduler struct {
	opts  Options
	tasks *projection.Tasks
	store eventstore.Store
	log   *slog.Logger

	// life is Run's context: what this scheduler does in the background
	// (a failed destroy tried again) ends with it.
	life context.Context

	mu         sync.Mutex
	running    map[string]bool // tasks this process starts or supervises
	kick       chan struct{}
	wg         sync.WaitGroup
	reconciled chan struct{}
	leading    atomic.Bool // this replica leads (Lead): it assigns queued tasks
	// assigning is held while fill or Admit gives tasks their replicas,
	// so that the two never hand out the same free slot.
	assigning sync.Mutex
	// admitted counts the slots Admit holds for spawns not yet applied.
	admitted int // under mu
	// orphans counts the slots held by orphan sandboxes being stopped
	// (stopOrphan).
	orphans int // under mu
	// listFailed is, by runtime, why its sandboxes could not be listed
	// last: a runtime that stays out of reach is logged once, not at
	// every look (adoption looks every second).
	listFailed map[string]string
}

// New returns a scheduler over the task projection.
func New(opts Options, tasks *projection.Tasks, store eventstore.Store, log *slog.Logger) *Scheduler {
	if opts.MaxConcurrent < 1 {
		opts.MaxConcurrent = 1
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.ExitGrace == 0 {
		opts.ExitGrace = 10 * time.Second
	}
	if opts.RecordRetry <= 0 {
		opts.RecordRetry = time.Second
	}
	if opts.DestroyRetry <= 0 {
		opts.DestroyRetry = 5 * time.Second
	}
	if opts.Writers == nil {
		opts.Writers = &task.Writers{}
	}
	if opts.Members == nil {
		solo := cluster.NewSolo(cluster.Replica{ID: cluster.NewID()})
		opts.Members = solo
	}
	return &Scheduler{opts: opts, tasks: tasks, store: store, log: log, running: map[string]bool{}, listFailed: map[string]string{}, kick: make(chan struct{}, 1), reconciled: make(chan struct{})}
}

// Reconciled is closed once Run's start-up reconciliation is recorded:
// from then on every task's state is this process's to keep.
func (s *Scheduler) Reconciled() <-chan struct{} { return s.reconciled }

// Run reconciles, then, until ctx is done, starts the tasks given to this
// replica (all of them, alone on a store, or while it leads: see Lead)
// and adopts those of replicas gone. Sandboxes keep running when Run
// returns: the next server, or another replica, reattaches, unless
// StopAll follows.
func (s *Scheduler) Run(ctx context.Context) error {
	s.life = ctx
	if err := s.Reconcile(ctx); err != nil {
		if ctx.Err() != nil {
			s.wg.Wait() // shutting down mid-reconcile is not an error
			return nil
		}
		return err
	}
	close(s.reconciled)
	// Leases are judged again every Renew: a replica's end is seen when
	// its lease lapses, not at an event.
	tick := time.NewTicker(cluster.Renew)
	defer tick.Stop()
	for {
		ch, members := s.tasks.Changed(), s.opts.Members.Changed()
		if s.leading.Load() {
			s.fill(ctx)
		}
		s.pickup(ctx)
		if err := s.adopt(ctx, nil); err != nil && ctx.Err() == nil {
			s.log.Warn("cannot adopt the tasks of a replica gone", logkey.Error, err)
		}
		select {
		case <-ch:
		case <-members:
		case <-tick.C:
		case <-s.kick:
		case <-ctx.Done():
			s.wg.Wait()
			return nil
		}
	}
}

// Lead has this replica assign queued tasks until ctx ends: the cluster's
// leader calls it (cluster.Members.Lead), a server alone on its store for
// its whole life.
func (s *Scheduler) Lead(ctx context.Context) {
	s.leading.Store(true)
	s.wake()
	<-ctx.Done()
	s.leading.Store(false)
}

// Running returns how many tasks this scheduler is starting or supervising.
func (s *Scheduler) Running() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.running)
}

// StopAll ends what Run leaves running, for a server that stops its
// sandboxes when it shuts down (config shutdown: stop); call it once Run
// has returned. Every task this replica was starting or running ends
// cancelled (reason "shutdown"), recorded first as a cancel is, and its
// sandbox is stopped with StopGrace and destroyed, all of them at once,
// within ctx. Queued tasks stay queued for the next start. A task whose
// end cannot be recorded keeps its sandbox, which the next start
// reattaches.
func (s *Scheduler) StopAll(ctx context.Context) {
	self := s.opts.Members.Self()
	active := s.tasks.SelectLive(func(t *task.Task) bool {
		return (t.Status == task.Starting || t.Status == task.Running) && t.Replica == self
	})
	var wg sync.WaitGroup
	for _, t := range active {
		wg.Go(func() { s.stopAtShutdown(ctx, t) })
	}
	wg.Wait()
}

// stopAtShutdown ends task t and its sandbox for StopAll.
func (s *Scheduler) stopAtShutdown(ctx context.Context, t task.Task) {
	end := task.Completed{Status: task.Cancelled, ErrorMessage: "cancelled: the server shut down (shutdown: stop)", Reason: "shutdown"}
	if !s.complete(ctx, t.ID, end) {
		return
	}
	rt := s.opts.Runtimes[t.Runtime]
	if rt == nil {
		s.releaseQuota(ctx, t)
		return
	}
	// A task still starting may have no handle yet; its sandbox, if it
	// has one, is named after it.
	id := t.ID
	var h sandbox.Handle
	if json.Unmarshal(t.Handle, &h) == nil && h.ID != "" {
		id = h.ID
	}
	if err := rt.Stop(ctx, id, s.opts.StopGrace); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		s.log.Warn("cannot stop a task's sandbox at shutdown", logkey.TaskID, t.ID, logkey.SandboxID, id, logkey.Error, err)
	}
	s.destroy(ctx, rt, t.ID, id)
	s.opts.Runner.Released(ctx, t)
	s.releaseQuota(ctx, t)
}

func (s *Scheduler) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// fill gives the oldest queued tasks a replica while the cluster has free
// slots: a slot is held by every task starting or running, on any replica,
// and by this replica's own until their sandboxes are gone. A task goes to
// the live replica with the fewest tasks that offers its runtime (this one
// when none does: its start then fails saying so), recorded in its
// task_starting under its version; one given to this replica starts at
// once, one given to another starts when that one sees it (pickup).
//
// A task on a named workspace starts here, on the leader, and only while
// no other task (on any replica) and no session of this replica writes
// the workspace: one writer per workspace (task.Writers).
func (s *Scheduler) fill(ctx context.Context) {
	// Run calls fill at every event of every task. With no task waiting
	// it has nothing to give, and it does not take assigning: Admit,
	// which only tries the lock, would find it held and queue its task,
	// and in a burst of spawns the queue then has the rest wait for fill
	// and a task_starting commit of their own. A task queued after this
	// look is an event, which runs fill again.
	if s.tasks.Waiting(slices.Values([]string(nil))) == 0 {
		return
	}
	s.assigning.Lock()
	defer s.assigning.Unlock()
	self := s.opts.Members.Self()
	occupied, load, busy := s.occupancy()
	if occupied >= s.opts.MaxConcurrent {
		return
	}
	live := s.opts.Members.Live()
	queued := s.tasks.SelectLive(func(t *task.Task) bool { return t.Status == task.Queued })
	// The tasks' task_starting are recorded at once, not one after the
	// other: the store commits appends that wait together in one
	// transaction and one fsync, and a burst of spawns that missed Admit
	// would otherwise start one commit apart.
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, t := range queued {
		if occupied >= s.opts.MaxConcurrent || ctx.Err() != nil {
			return
		}
		to := self
		if t.Workspace != "" {
			if busy[t.Workspace] {
				continue
			}
			if _, ok := s.opts.Writers.Acquire(t.Workspace, t.ID); !ok {
				continue
			}
		} else {
			to = leastBusy(live, load, t.Runtime, self)
		}
		// Its slot is held from here; one whose record fails or finds
		// it no longer queued (a cancel) frees it for the next fill.
		occupied++
		load[to]++
		if t.Workspace != "" {
			busy[t.Workspace] = true
		}
		wg.Go(func() {
			nt, err := s.tasks.Update(ctx, t.ID, func(t task.Task) ([]eventstore.Proposed, error) {
				if t.Status != task.Queued {
					return nil, projection.ErrNoChange
				}
				return []eventstore.Proposed{projection.NewEvent(task.EventStarting, task.StartingOn{Replica: to}, ActorScheduler)}, nil
			})
			if err != nil {
				if ctx.Err() == nil {
					s.log.Warn("cannot claim task", logkey.TaskID, t.ID, logkey.Error, err)
				}
				s.releaseWorkspace(t)
				s.wake()
				return
			}
			if nt.Status != task.Starting || nt.Replica != to {
				s.releaseWorkspace(t)
				s.wake()
				return
			}
			if to == self {
				s.startClaimed(ctx, nt)
			}
		})
	}
}

// occupancy is how many of the cluster's slots are held (see fill), the
// tasks starting or running on each replica, and the workspaces a task
// writes.
func (s *Scheduler) occupancy() (occupied int, load map[string]int, busy map[string]bool) {
	active := s.tasks.SelectLive(func(t *task.Task) bool { return t.Status == task.Starting || t.Status == task.Running })
	load, busy = map[string]int{}, map[string]bool{}
	s.mu.Lock()
	defer s.mu.Unlock()
	occupied = len(s.running) + s.admitted + s.orphans
	for _, t := range active {
		load[t.Replica]++
		if !s.running[t.ID] {
			occupied++
		}
		if t.Workspace != "" {
			busy[t.Workspace] = true
		}
	}
	return occupied, load, busy
}

// Admit is asked by a task's spawn, before its first events are recorded,
// whether the task can be given a replica at once, as fill would give it
// one a moment later: this replica has reconciled and leads, no task waits
// in the queue, a slot is free and fill is not running. Then Admit returns the
// task_starting to record in the spawn's own commit, after task_queued,
// and holds the slot until done is called (once that commit is applied or
// has failed). The task then waits for one commit fewer before its
// sandbox is created: the log after the spawn's commit reads as it would
// after fill's (queued, then starting on a replica), so a crash after it
// leaves what a crash after fill's commit leaves, and the start-up
// reconciliation finds the same. A task on a named workspace, which must
// first hold the workspace, is left to fill.
func (s *Scheduler) Admit(spec task.Spec) (starting eventstore.Proposed, done func(), ok bool) {
	select {
	case <-s.reconciled: // as fill, which runs only once Run has reconciled
	default:
		return eventstore.Proposed{}, nil, false
	}
	if spec.Workspace != "" || !s.leading.Load() || !s.assigning.TryLock() {
		return eventstore.Proposed{}, nil, false
	}
	defer s.assigning.Unlock()
	if s.tasks.Waiting(slices.Values([]string(nil))) > 0 {
		return eventstore.Proposed{}, nil, false
	}
	occupied, load, _ := s.occupancy()
	if occupied >= s.opts.MaxConcurrent {
		return eventstore.Proposed{}, nil, false
	}
	to := leastBusy(s.opts.Members.Live(), load, spec.Runtime, s.opts.Members.Self())
	s.mu.Lock()
	s.admitted++
	s.mu.Unlock()
	done = func() {
		s.mu.Lock()
		s.admitted--
		s.mu.Unlock()
		s.wake()
	}
	return projection.NewEvent(task.EventStarting, task.StartingOn{Replica: to}, ActorScheduler), done, true
}

// leastBusy is the live replica with the fewest tasks in load that offers
// runtime, self first among equals, then by id; self when none offers it.
func leastBusy(live map[string]cluster.Replica, load map[string]int, runtime, self string) string {
	best, bestLoad := "", 0
	for _, id := range slices.Sorted(maps.Keys(live)) {
		if !slices.Contains(live[id].Runtimes, runtime) {
			continue
		}
		n := load[id]
		if best == "" || n < bestLoad || n == bestLoad && id == self {
			best, bestLoad = id, n
		}
	}
	if best == "" {
		return self
	}
	return best
}

// pickup starts the tasks the leader gave this replica that it does not
// start yet.
func (s *Scheduler) pickup(ctx context.Context) {
	self := s.opts.Members.Self()
	for _, t := range s.tasks.SelectLive(func(t *task.Task) bool { return t.Status == task.Starting && t.Replica == self }) {
		if ctx.Err() != nil {
			return
		}
		s.startClaimed(ctx, t)
	}
}

// startClaimed starts t, a task given to this replica, unless it runs
// already.
func (s *Scheduler) startClaimed(ctx context.Context, t task.Task) {
	if !s.claim(t.ID) {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.release(t.ID)
		s.start(ctx, t)
	}()
}

func (s *Scheduler) claim(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running[id] {
		return false
	}
	s.running[id] = true
	return true
}

func (s *Scheduler) release(id string) {
	s.mu.Lock()
	delete(s.running, id)
	s.mu.Unlock()
	if t, err := s.tasks.Get(id); err == nil {
		s.releaseWorkspace(t)
	}
	s.wake()
}

// holdWorkspace makes task t the writer of its workspace, if it has one,
// for what reconciliation found of it (its sandbox, resumed or an
// orphan), which writes there whether or not another holds it: that is
// logged.
func (s *Scheduler) holdWorkspace(t task.Task) {
	if t.Workspace == "" {
		return
	}
	if holder, ok := s.opts.Writers.Acquire(t.Workspace, t.ID); !ok {
		s.log.Warn("a sandbox found at a restart finds its task's workspace held by another", logkey.TaskID, t.ID, "workspace", t.Workspace, "holder", holder)
	}
}

// releaseWorkspace gives up t's hold on its workspace, if it has one.
func (s *Scheduler) releaseWorkspace(t task.Task) {
	if t.Workspace != "" {
		s.opts.Writers.Release(t.Workspace, t.ID)
	}
}

// orphanStops is how many orphan sandboxes a start-up stops at once.
const orphanStops = 8

// stopAndDestroy kills sandbox id at once and removes what is left of it,
// for a sandbox no task will have: an orphan, or one whose start could not
// be recorded. Failures are logged; reconciliation tries again, as it
// does when ctx ends first.
func stopAndDestroy(ctx context.Context, rt sandbox.Runtime, id string, log *slog.Logger) {
	if err := rt.Stop(ctx, id, 0); err != nil {
		if ctx.Err() != nil {
			return
		}
		log.Warn("cannot stop sandbox", logkey.SandboxID, id, logkey.Error, err)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		log.Warn("cannot destroy sandbox", logkey.SandboxID, id, logkey.Error, err)
	}
}

// resumeHolding runs fn, a task's start or supervision resumed at
// reconciliation, holding the task's slot and its workspace as the
// scheduler's own runs do.
func (s *Scheduler) resumeHolding(t task.Task, fn func()) {
	s.holdWorkspace(t)
	s.claim(t.ID)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.release(t.ID)
		fn()
	}()
}

// destroy destroys task taskID's sandbox id after the task's end. A
// failure is logged and, as what the task left may not be where its owner
// expects it (a workspace quarantined), recorded on the task's stream.
// One not quarantined is tried again in the background while Run runs
// (destroyAgain); after that, the next start's reconciliation finds the
// sandbox of an ended task and destroys it.
func (s *Scheduler) destroy(ctx context.Context, rt sandbox.Runtime, taskID, id string) {
	err := rt.Destroy(ctx, id)
	if err == nil {
		return
	}
	s.log.Warn("cannot destroy sandbox", logkey.TaskID, taskID, logkey.SandboxID, id, logkey.Error, err)
	s.record(ctx, taskID, projection.NewEvent(task.EventSandboxDestroyFailed, task.SandboxDestroyFailed{
		SandboxName: id, Error: err.Error(), Quarantined: errors.Is(err, sandbox.ErrQuarantined),
	}, ActorScheduler))
	if errors.Is(err, sandbox.ErrQuarantined) || s.life == nil || s.life.Err() != nil {
		return
	}
	s.wg.Go(func() { s.destroyAgain(rt, taskID, id) })
}

// destroyAgain destroys sandbox id, whose first destroy failed, after
// DestroyRetry, then twice as long after each failure (at most 5
// minutes), until one succeeds, which is recorded, or Run's context ends.
// A sandbox quarantined meanwhile is recorded and left to an operator.
func (s *Scheduler) destroyAgain(rt sandbox.Runtime, taskID, id string) {
	ctx := s.life
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(s.opts.DestroyRetry<<min(n-1, 16), 5*time.Minute)):
		}
		err := rt.Destroy(ctx, id)
		switch {
		case err == nil:
			s.log.Info("sandbox destroyed after a failed destroy", logkey.TaskID, taskID, logkey.SandboxID, id, "attempts", n+1)
			s.record(ctx, taskID, projection.NewEvent(task.EventSandboxDestroyed, task.SandboxDestroyed{SandboxName: id, Attempts: n + 1}, ActorScheduler))
			return
		case ctx.Err() != nil:
			return
		case errors.Is(err, sandbox.ErrQuarantined):
			s.log.Warn("cannot destroy sandbox", logkey.TaskID, taskID, logkey.SandboxID, id, logkey.Error, err)
			s.record(ctx, taskID, projection.NewEvent(task.EventSandboxDestroyFailed, task.SandboxDestroyFailed{SandboxName: id, Error: err.Error(), Quarantined: true}, ActorScheduler))
			return
		}
		s.log.Warn("cannot destroy sandbox yet", logkey.TaskID, taskID, logkey.SandboxID, id, "attempts", n+1, logkey.Error, err)
	}
}

// record appends ev, a record of what became of a task's sandbox, to the
// task's stream; a failure is logged.
func (s *Scheduler) record(ctx context.Context, taskID string, ev eventstore.Proposed) {
	if _, err := s.store.Append(context.WithoutCancel(ctx), task.StreamID(taskID), eventstore.AnyVersion, ev); err != nil {
		s.log.Warn("cannot record what became of a task's sandbox", logkey.TaskID, taskID, "event", ev.Type, logkey.Error, err)
	}
}

// start creates the task's sandbox and supervises it.
func (s *Scheduler) start(ctx context.Context, t task.Task) {
	log := s.log.With(logkey.TaskID, t.ID, logkey.CorrelationID, t.CorrelationID)
	rt, ok := s.opts.Runtimes[t.Runtime]
	if !ok {
		s.completeRetrying(ctx, t.ID, failed(fmt.Sprintf("runtime %q is not available on this server", t.Runtime), "start"))
		return
	}
	spec, err := s.opts.Runner.Prepare(ctx, t)
	if err != nil {
		s.completeRetrying(ctx, t.ID, failed("prepare sandbox: "+err.Error(), "start"))
		return
	}
	if s.opts.Quota != nil {
		if err := s.opts.Quota.Limit(ctx, t); err != nil {
			log.Warn("task directory quota not enforced by the kernel; polled only", logkey.Error, err)
		}
	}
	var h *sandbox.Handle
	for attempt := 0; ; attempt++ {
		h, err = rt.Create(ctx, spec)
		if err == nil || !errdefs.Retryable(err) || attempt == 4 || ctx.Err() != nil {
			break
		}
		log.Warn("sandbox create failed, retrying", logkey.Error, err)
		select {
		case <-time.After(time.Duration(200<<attempt) * time.Millisecond):
		case <-ctx.Done():
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return // shutting down; reconciliation finds the task again
		}
		s.completeRetrying(ctx, t.ID, failed("start sandbox: "+err.Error(), "start"))
		s.releaseQuota(ctx, t)
		return
	}
	s.crash(sandbox.CrashCreated)
	handle, _ := json.Marshal(h)
	// A store out of reach for a moment (a database restarting) is waited
	// out: the sandbox runs, and its worker's report waits for the start.
	var started task.Task
	for n := 0; ; n++ {
		started, err = s.tasks.Update(ctx, t.ID, func(cur task.Task) ([]eventstore.Proposed, error) {
			if cur.Status != task.Starting || cur.Replica != t.Replica {
				return nil, projection.ErrNoChange // completed by webhook, cancelled or adopted meanwhile
			}
			return []eventstore.Proposed{projection.NewEvent(task.EventStarted, task.Started{SandboxName: h.ID, Handle: handle}, ActorScheduler)}, nil
		})
		if err == nil || !errdefs.Retryable(err) || ctx.Err() != nil {
			break
		}
		log.Warn("cannot record task start yet; trying again", logkey.Error, err)
		select {
		case <-time.After(s.retryDelay(n)):
		case <-ctx.Done():
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return // shutting down; reconciliation finds the task and its sandbox
		}
		// Unrecorded, the start leaves the task starting with no one
		// watching its sandbox: stop it, and end the task.
		log.Error("cannot record task start; stopping its sandbox", logkey.Error, err)
		stopAndDestroy(ctx, rt, h.ID, log)
		s.completeRetrying(ctx, t.ID, failed("record the sandbox's start: "+err.Error(), "start"))
		s.releaseQuota(ctx, t)
		return
	}
	t = started
	s.crash(sandbox.CrashStarted)
	log.Info("task started", logkey.SandboxID, h.ID, logkey.Runtime, t.Runtime)
	s.supervise(ctx, t, rt, h.ID)
}

// crash calls Options.Crash at point, if set.
func (s *Scheduler) crash(point string) {
	if s.opts.Crash != nil {
		s.opts.Crash(point)
	}
}

// supervise waits for the sandbox to exit, enforcing the timeout, cancel
// and the disk quota; the quota is watched until the sandbox is gone.
func (s *Scheduler) supervise(ctx context.Context, t task.Task, rt sandbox.Runtime, sandboxID string) {
	log := s.log.With(logkey.TaskID, t.ID, logkey.CorrelationID, t.CorrelationID, logkey.SandboxID, sandboxID)
	type waited struct {
		st  sandbox.ExitStatus
		err error
	}
	wctx, stopWait := context.WithCancel(ctx)
	defer stopWait()
	exited := make(chan waited, 1)
	go func() {
		st, err := rt.Wait(wctx, sandboxID)
		exited <- waited{st, err}
	}()

	// The timeout runs from the start; a task reattached while still
	// "starting" counts from its last change, not from now.
	started := t.UpdatedAt
	if t.StartedAt != nil {
		started = *t.StartedAt
	}
	timeout := time.NewTimer(t.Timeout() - s.opts.Now().Sub(started))
	defer timeout.Stop()
	var exitDeadline <-chan time.Time // set once the task ended before its sandbox
	var quotaTimer *time.Timer
	var quotaDue <-chan time.Time
	if s.opts.Quota != nil {
		quotaTimer = time.NewTimer(0)
		defer quotaTimer.Stop()
		quotaDue = quotaTimer.C
	}
	st := &stopper{rt: rt, id: sandboxID, log: log}
	defer st.wait()

	// An end the store refused (a full disk) is kept and tried again; the
	// sandbox, whose state holds the exit status, stays until it is
	// recorded, so a restart meanwhile still finds it.
	var unrecorded *task.Completed
	var retry <-chan time.Time
	retries := 0
	end := func(c task.Completed) {
		if s.complete(ctx, t.ID, c) {
			unrecorded, retry, retries = nil, nil, 0
			return
		}
		unrecorded, retry = &c, time.After(s.retryDelay(retries))
		retries++
	}
	gone := false // the sandbox exited
	finish := func(cur task.Task) {
		s.crash(sandbox.CrashEnded)
		st.wait()
		s.destroy(ctx, rt, t.ID, sandboxID)
		s.opts.Runner.Released(ctx, cur)
		s.releaseQuota(ctx, cur)
	}
	// shutdown is a stop of the server meanwhile: the sandbox of a task
	// still running is left for the next server to reattach; one whose
	// task has ended (its worker winding down, or a stop under way) is of
	// no one's, and goes now rather than with the next server's start.
	shutdown := func() {
		cur, err := s.tasks.Get(t.ID)
		if err != nil || !cur.Status.Terminal() || unrecorded != nil {
			return
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		st.cancelStop()
		if err := rt.Stop(dctx, sandboxID, 0); err != nil {
			log.Warn("cannot stop an ended task's sandbox at shutdown", logkey.Error, err)
		}
		s.destroy(dctx, rt, t.ID, sandboxID)
		s.opts.Runner.Released(dctx, cur)
		s.releaseQuota(dctx, cur)
	}

	for {
		changed := s.tasks.TaskChanged(t.ID) // nil once it has ended
		cur, err := s.tasks.Get(t.ID)
		if err != nil {
			return
		}
		if cur.Replica != t.Replica && !cur.Status.Terminal() {
			// Another replica adopted the task: this one's lease lapsed
			// (cut from the store for a TTL). The task and its sandbox are
			// the adopter's now.
			log.Warn("task adopted by another replica; no longer watching it", "replica", cur.Replica)
			st.cancelStop()
			return
		}
		switch {
		case cur.Status.Terminal() && exitDeadline == nil && !st.started:
			exitDeadline = time.After(s.opts.ExitGrace)
		case cur.CancelRequested && !cur.Status.Terminal() && unrecorded == nil:
			// Record the end first, then stop: the worker reports its own
			// end when it is stopped, and that report must find the task
			// already ended as cancelled, not end it as failed.
			end(task.Completed{Status: task.Cancelled, ErrorMessage: "cancelled", Reason: "cancel"})
			st.stop(ctx, "cancel", s.opts.StopGrace)
			if unrecorded == nil {
				continue
			}
		}
		select {
		case w := <-exited:
			if ctx.Err() != nil {
				shutdown() // a running task's sandbox is the next server's
				return
			}
			exited, gone = nil, true
			var exit *sandbox.ExitStatus
			if w.err == nil {
				exit = &w.st
			} else {
				log.Warn("lost track of sandbox", logkey.Error, w.err)
			}
			if cur, err := s.tasks.Get(t.ID); err == nil && !cur.Status.Terminal() {
				s.crash(sandbox.CrashExited)
				switch qerr := s.overQuota(ctx, cur); {
				case unrecorded != nil:
					end(*unrecorded) // decided before the exit: a timeout, a cancel
				case qerr != nil:
					end(failed(qerr.Error(), quotaReason(qerr)))
				default:
					end(s.opts.Runner.Collect(ctx, cur, exit))
				}
			}
			if unrecorded == nil {
				finish(cur)
				return
			}
		case <-retry:
			end(*unrecorded)
			if unrecorded == nil && gone {
				finish(cur)
				return
			}
		case <-timeout.C:
			if !cur.Status.Terminal() {
				msg := fmt.Sprintf("timed out after %s", t.Timeout())
				end(task.Completed{Status: task.Timeout, ErrorMessage: msg, Reason: "timeout"})
				st.stop(ctx, "timeout", s.opts.StopGrace)
			}
		case <-quotaDue:
			next, err := s.opts.Quota.Check(ctx, cur)
			if err == nil {
				quotaTimer.Reset(next)
				break
			}
			if cur.Status.Terminal() {
				log.Warn("sandbox went over its disk quota after its task ended", logkey.Error, err)
			} else {
				end(failed(err.Error(), quotaReason(err)))
			}
			st.stop(ctx, "quota", 0) // nothing left to save: every write counts
			quotaDue = nil
		case <-exitDeadline:
			st.stop(ctx, "ended", s.opts.StopGrace)
		case <-changed:
		case <-ctx.Done():
			shutdown()
			return
		}
	}
}

// overQuota is the quota's last look at a task whose sandbox exited: a
// worker that stopped at a write the kernel refused (EDQUOT) ends with the
// quota's error, not with its own.
func (s *Scheduler) overQuota(ctx context.Context, t task.Task) error {
	if s.opts.Quota == nil {
		return nil
	}
	_, err := s.opts.Quota.Check(ctx, t)
	return err
}

// quotaReason is the reason a task stopped by its quota ends with: "disk"
// when the data root ran out of space, else "quota".
func quotaReason(err error) string {
	if errors.Is(err, errdefs.ErrNoSpace) {
		return "disk"
	}
	return "quota"
}

// releaseQuota tells the quota a task's sandbox is gone.
func (s *Scheduler) releaseQuota(ctx context.Context, t task.Task) {
	if s.opts.Quota != nil {
		s.opts.Quota.Release(ctx, t)
	}
}

// stopper stops one sandbox in the background, so that its supervisor
// keeps watching it (its disk quota above all) while it winds down. Only
// the supervisor's goroutine calls stop; a kill (grace 0) cuts a graceful
// stop short.
type stopper struct {
	rt  sandbox.Runtime
	id  string
	log *slog.Logger

	started bool // a stop was asked for
	killing bool // the last one has no grace
	cancel  context.CancelFunc
	done    chan struct{}
}

// stop stops the sandbox with grace unless a stop at least as quick is
// under way.
func (st *stopper) stop(ctx context.Context, why string, grace time.Duration) {
	if st.killing || (st.started && grace > 0) {
		return
	}
	if st.started {
		st.cancel()
		<-st.done
	}
	st.started, st.killing = true, grace == 0
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	st.cancel, st.done = cancel, done
	go func() {
		defer close(done)
		defer cancel()
		if err := st.rt.Stop(sctx, st.id, grace); err != nil && sctx.Err() == nil {
			st.log.Warn("cannot stop sandbox", "why", why, logkey.Error, err)
		}
	}()
}

// wait waits for the stop under way, if any, to return.
func (st *stopper) wait() {
	if st.started {
		<-st.done
	}
}

// cancelStop ends the stop under way, if any, and waits for it to return.
func (st *stopper) cancelStop() {
	if st.started {
		st.cancel()
		<-st.done
	}
}

// complete records a task's terminal event unless it already ended, and
// reports whether the task has ended. false: the store refused the event
// (a full disk) or ctx ended; the caller keeps c and tries again.
func (s *Scheduler) complete(ctx context.Context, id string, c task.Completed) bool {
	recorded := false
	t, err := s.tasks.Update(ctx, id, func(t task.Task) ([]eventstore.Proposed, error) {
		recorded = false
		if t.Status.Terminal() {
			return nil, projection.ErrNoChange
		}
		recorded = true
		return []eventstore.Proposed{projection.NewEvent(task.EventCompleted, c, ActorScheduler)}, nil
	})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("cannot record task completion; keeping it to try again", logkey.TaskID, id, logkey.Error, err)
		}
		return false
	}
	if recorded {
		s.logEnded(ctx, t, c)
	}
	return true
}

// logEnded logs the end c the scheduler recorded for task t.
func (s *Scheduler) logEnded(ctx context.Context, t task.Task, c task.Completed) {
	lvl := slog.LevelInfo
	if c.Status == task.Failed {
		lvl = slog.LevelWarn
	}
	s.log.Log(ctx, lvl, "task ended", logkey.TaskID, t.ID, logkey.CorrelationID, t.CorrelationID, logkey.Status, c.Status, "reason", c.Reason, "error_message", c.ErrorMessage)
}

// completeRetrying is complete, tried again with backoff until the store
// takes the event or ctx ends: for a task with no sandbox to watch
// meanwhile.
func (s *Scheduler) completeRetrying(ctx context.Context, id string, c task.Completed) {
	for n := 0; !s.complete(ctx, id, c); n++ {
		select {
		case <-time.After(s.retryDelay(n)):
		case <-ctx.Done():
			return
		}
	}
}

// retryDelay is how long to wait before the n-th new try (from 0) to
// record an end the store refused: RecordRetry doubled each time, at most
// 30 s.
func (s *Scheduler) retryDelay(n int) time.Duration {
	return min(s.opts.RecordRetry<<min(n, 16), 30*time.Second)
}

func failed(msg, reason string) task.Completed {
	return task.Completed{Status: task.Failed, ErrorMessage: msg, Reason: reason}
}

// Reconcile compares three views after a restart — the events, the
// sandboxes the runtimes report, and (through Collect) the task directories
// — and records what it did: it adopts the tasks no live replica holds
// (alone on a store: every task starting or running, as the server that
// ran them is gone), reattaching to a running task's sandbox or ending a
// task whose sandbox is gone with its status.json or as lost, and has
// the sandboxes no task owns stopped in the background (stopOrphan).
func (s *Scheduler) Reconcile(ctx context.Context) error {
	// What reconciliation records is caused by the start; the tasks it
	// reattaches go on under their own causes.
	sys := eventstore.Begin(ctx, "start")
	if err := s.opts.Runner.Reconcile(sys); err != nil {
		return err
	}
	var summary Reconciled
	if err := s.adopt(ctx, &summary); err != nil {
		return err
	}
	listed := s.listSandboxes(ctx)
	// A sandbox is an orphan when no task starting or running has it; the
	// events are read up to now first, so that a task another replica
	// started after this one's projection was built is not taken for none.
	if err := s.tasks.Sync(ctx); err != nil {
		return err
	}
	stops := make(chan struct{}, orphanStops)
	for id, l := range listed {
		if st, _, ok := s.tasks.Status(id); !ok || st != task.Starting && st != task.Running {
			s.stopOrphan(ctx, sys, id, l, stops)
			summary.Orphans++
		}
	}
	ev := projection.NewEvent(task.EventReconciled, summary, ActorReconciler)
	if _, err := s.store.Append(sys, task.SystemStream, eventstore.AnyVersion, ev); err != nil {
		return fmt.Errorf("record reconciliation: %w", err)
	}
	s.log.Info("reconciled", "reattached", summary.Reattached, "restarted", summary.Restarted, "ended", summary.Ended, "orphans", summary.Orphans)
	return nil
}

// stopOrphan stops and destroys sandbox l of task id, which no task
// starting or running has, in the background, at most cap(stops) at once,
// and records sandbox_orphan_stopped once it is gone. The server serves
// meanwhile: a stop waits for the sandbox's end, and a pod on a node that
// is down ends only once the node is removed. Until then the orphan holds
// a slot, as a task's sandbox does (not counted in Running: it runs no
// task), and the workspace its task wrote, so that no task starts there
// while it may still write. A stop cut short by the server's end is the
// next start's to do again.
func (s *Scheduler) stopOrphan(ctx, sys context.Context, id string, l listedSandbox, stops chan struct{}) {
	t, err := s.tasks.Get(id)
	if err != nil {
		t = task.Task{ID: id} // no events: its workspace, if any, is not known
	}
	s.holdWorkspace(t)
	s.mu.Lock()
	s.orphans++
	s.mu.Unlock()
	s.wg.Go(func() {
		defer func() {
			s.mu.Lock()
			s.orphans--
			s.mu.Unlock()
			s.releaseWorkspace(t)
			s.wake()
		}()
		select {
		case stops <- struct{}{}:
			defer func() { <-stops }()
		case <-ctx.Done():
			return
		}
		stopAndDestroy(ctx, l.rt, l.h.ID, s.log)
		if ctx.Err() != nil {
			return
		}
		s.log.Info("orphan sandbox stopped", logkey.SandboxID, l.h.ID, logkey.Runtime, l.name)
		ev := projection.NewEvent(task.EventOrphanStopped, map[string]string{"sandbox_name": l.h.ID, "runtime": l.name, "task_id": id}, ActorReconciler)
		if _, err := s.store.Append(sys, task.SystemStream, eventstore.AnyVersion, ev); err != nil {
			s.log.Warn("cannot record a stopped orphan sandbox", logkey.SandboxID, l.h.ID, logkey.Error, err)
		}
	})
}

// listSandboxes lists the tasks' sandboxes every runtime reports, by task
// id.
func (s *Scheduler) listSandboxes(ctx context.Context) map[string]listedSandbox {
	listed := map[string]listedSandbox{}
	for name, rt := range s.opts.Runtimes {
		hs, err := rt.List(ctx, map[string]string{sandbox.LabelManaged: "true"})
		s.mu.Lock()
		last, failed := s.listFailed[name]
		switch {
		case err != nil && (!failed || last != err.Error()):
			s.log.Warn("cannot list sandboxes", logkey.Runtime, name, logkey.Error, err)
			s.listFailed[name] = err.Error()
		case err == nil && failed:
			s.log.Info("sandboxes listed again", logkey.Runtime, name)
			delete(s.listFailed, name)
		}
		s.mu.Unlock()
		if err != nil {
			continue
		}
		for _, h := range hs {
			id := h.Labels[sandbox.LabelTaskID]
			if id == "" {
				continue // not a task's (a session's: the session manager keeps those)
			}
			listed[id] = listedSandbox{rt: rt, name: name, h: h}
		}
	}
	return listed
}

// adopt takes over the tasks starting or running whose replica holds no
// lease, once this replica's own lease has held for a TTL
// (cluster.Members.Steady): each is recorded task_adopted under its
// version, so one survivor adopts it, and then reattached, started again
// or ended as reattach decides. sum, if not nil, counts what was done.
func (s *Scheduler) adopt(ctx context.Context, sum *Reconciled) error {
	m := s.opts.Members
	if !m.Steady() {
		return nil
	}
	self, live := m.Self(), m.Live()
	candidates := s.tasks.SelectLive(func(t *task.Task) bool {
		_, alive := live[t.Replica]
		return (t.Status == task.Starting || t.Status == task.Running) && t.Replica != self && !alive
	})
	// A replica the last renewal did not list may have joined since:
	// only its lease's lapse makes it gone.
	var orphaned []task.Task
	for _, t := range candidates {
		if _, alive := m.Alive(t.Replica); !alive {
			orphaned = append(orphaned, t)
		}
	}
	if len(orphaned) == 0 {
		return nil
	}
	listed := s.listSandboxes(ctx)
	for _, t := range orphaned {
		reason := fmt.Sprintf("replica %s holds no lease: it stopped, restarted or was lost", t.Replica)
		if t.Replica == "" {
			reason = "its server is gone (it started before replicas were recorded)"
		}
		nt, err := s.tasks.Update(ctx, t.ID, func(cur task.Task) ([]eventstore.Proposed, error) {
			if cur.Status != task.Starting && cur.Status != task.Running || cur.Replica != t.Replica {
				return nil, projection.ErrNoChange // ended, or another adopted it first
			}
			return []eventstore.Proposed{projection.NewEvent(task.EventAdopted, task.Adopted{Replica: self, From: t.Replica, Reason: reason}, ActorReconciler)}, nil
		})
		if err != nil {
			return fmt.Errorf("adopt task %s: %w", t.ID, err)
		}
		if nt.Replica != self || nt.Status.Terminal() {
			continue
		}
		if t.Replica != "" {
			s.log.Info("task adopted", logkey.TaskID, t.ID, "from", t.Replica)
		}
		s.crash(sandbox.CrashAdopted)
		s.opts.Runner.Adopt(ctx, nt)
		o, err := s.reattach(ctx, nt, listed[t.ID])
		if err != nil {
			return err
		}
		if sum == nil {
			continue
		}
		switch o {
		case reattached:
			sum.Reattached++
		case restarted:
			sum.Restarted++
		default:
			sum.Ended++
		}
	}
	return nil
}

// restart starts again a task that reconciliation found starting, whose
// worker never had its start (reattach): it destroys what is left of the
// task's sandbox id (name, or "" when none was found), records
// task_start_retried, and starts the task as fill does, in the slot it
// held before the restart. A sandbox that cannot be destroyed (its
// directories not given back whole) ends the task failed instead: a
// second sandbox over them is no safer.
func (s *Scheduler) restart(ctx context.Context, t task.Task, rt sandbox.Runtime, id, name, why string) (outcome, error) {
	log := s.log.With(logkey.TaskID, t.ID, logkey.CorrelationID, t.CorrelationID)
	if err := rt.Destroy(ctx, id); err != nil {
		log.Warn("cannot destroy what is left of a sandbox that never started", logkey.SandboxID, id, logkey.Error, err)
		s.complete(ctx, t.ID, failed("destroy the sandbox that never started, to start the task again: "+err.Error(), "start"))
		s.releaseQuota(ctx, t)
		return ended, nil
	}
	nt, err := s.tasks.Update(ctx, t.ID, func(cur task.Task) ([]eventstore.Proposed, error) {
		if cur.Status != task.Starting {
			return nil, projection.ErrNoChange // ended meanwhile (a cancel)
		}
		return []eventstore.Proposed{projection.NewEvent(task.EventStartRetried, task.StartRetried{SandboxName: name, Reason: why}, ActorReconciler)}, nil
	})
	if err != nil {
		return ended, fmt.Errorf("record the new start of task %s: %w", t.ID, err)
	}
	if nt.Status != task.Starting {
		s.releaseQuota(ctx, nt)
		return ended, nil
	}
	log.Info("task never started before the restart; starting it again", "reason", why)
	s.resumeHolding(nt, func() { s.start(ctx, nt) })
	return restarted, nil
}

// Reconciled is the payload of the system event that closes a start-up
// reconciliation: how many active tasks were reattached, started again
// (their start had not reached their worker) or ended, and how many
// sandboxes no task owned were found, to be stopped in the background
// (each recorded sandbox_orphan_stopped once gone).
type Reconciled struct {
	Reattached int `json:"reattached"`
	Restarted  int `json:"restarted"`
	Ended      int `json:"ended"`
	Orphans    int `json:"orphans"`
}

// outcome is what reconciliation did with an active task.
type outcome int

const (
	ended outcome = iota
	reattached
	restarted
)

type listedSandbox struct {
	rt   sandbox.Runtime
	name string
	h    sandbox.Handle
}

// resume supervises the recovered sandbox h of an active task again. A
// task caught between its sandbox's start and the record of it is recorded
// started first, so its log has every step; a task whose worker finished
// while the server was down is recorded ended at once, in the same commit.
//
// Its report (status.json) is read before that commit: a worker that
// reports once the reattach is recorded reaches the task through its
// webhook, and never also through this read, so its task ends on the one
// or the other, whichever came first, and a client that waits for the
// reattach before it lets the worker finish knows which.
func (s *Scheduler) resume(ctx context.Context, t task.Task, rt sandbox.Runtime, h *sandbox.Handle) error {
	handle, _ := json.Marshal(h)
	c, reported := s.opts.Runner.Reported(ctx, t)
	ended := false
	nt, err := s.tasks.Update(ctx, t.ID, func(cur task.Task) ([]eventstore.Proposed, error) {
		ended = false
		if cur.Status.Terminal() {
			return nil, projection.ErrNoChange // ended meanwhile (a cancel)
		}
		var evs []eventstore.Proposed
		if cur.Status == task.Starting {
			evs = append(evs, projection.NewEvent(task.EventStarted, task.Started{SandboxName: h.ID, Handle: handle}, ActorReconciler))
		}
		evs = append(evs, projection.NewEvent(task.EventReattached, task.Reattached{SandboxName: h.ID}, ActorReconciler))
		if reported {
			// supervise then stops the sandbox.
			evs, ended = append(evs, projection.NewEvent(task.EventCompleted, c, ActorScheduler)), true
		}
		return evs, nil
	})
	if err != nil {
		return fmt.Errorf("record reattach of task %s: %w", t.ID, err)
	}
	s.log.Info("task reattached", logkey.TaskID, t.ID, logkey.SandboxID, h.ID)
	if ended {
		s.logEnded(ctx, nt, c)
	}
	// t is the task as it was before: a task reattached while starting
	// keeps its timeout counting from then, not from now.
	s.resumeHolding(t, func() { s.supervise(ctx, t, rt, h.ID) })
	return nil
}

// reattach resumes supervising an active task after a restart, starts
// again one whose start never reached its worker, or ends it. It reports
// whether it reattached or started the task again.
//
// A task still starting (no task_started recorded) whose worker never had
// its start ran nothing: no sandbox was found for it, or the one found
// ended without its command (ExitStatus.NotStarted: a warm sandbox handed
// over but never sent its start, a launcher never let go). What is left
// of that sandbox is destroyed and the task starts again, once. A task
// whose worker had its start is always reattached, and ends with what its
// worker reports; one with no sandbox and no report ends lost.
func (s *Scheduler) reattach(ctx context.Context, t task.Task, l listedSandbox) (outcome, error) {
	rt := s.opts.Runtimes[t.Runtime]
	var h *sandbox.Handle
	switch {
	case rt == nil:
	case len(t.Handle) > 0:
		h = new(sandbox.Handle)
		if err := json.Unmarshal(t.Handle, h); err != nil {
			h = nil
		}
	case l.rt != nil:
		h = &l.h
	}
	found := false // a sandbox of the task's is there
	if h != nil {
		err := rt.Recover(ctx, h)
		if err == nil {
			found = true
			if t.Status == task.Starting {
				if st, err := rt.Status(ctx, h.ID); err == nil && st.Exit != nil && st.Exit.NotStarted {
					return s.restart(ctx, t, rt, h.ID, h.ID, st.Exit.Message)
				}
			}
			return reattached, s.resume(ctx, t, rt, h)
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			found = true // there, but not usable: not known not to have run
			s.log.Warn("cannot recover sandbox", logkey.TaskID, t.ID, logkey.Error, err)
		}
	}
	if rt != nil && t.Status == task.Starting && !found {
		if _, reported := s.opts.Runner.Reported(ctx, t); !reported {
			// Named after its task: whatever a crash left of a sandbox
			// that never ran (its cgroups, a half-made state dir) goes
			// before the task starts again.
			return s.restart(ctx, t, rt, t.ID, "", "the server restarted before the task's sandbox was started")
		}
	}
	c := s.opts.Runner.Collect(ctx, t, nil)
	s.complete(ctx, t.ID, c)
	if rt != nil {
		// The sandbox is named after its task: whatever a crash left of it
		// (its cgroups, a half-made state dir) goes, handle or not.
		id := t.ID
		if h != nil {
			id = h.ID
		}
		s.destroy(ctx, rt, t.ID, id)
		s.opts.Runner.Released(ctx, t)
	}
	s.releaseQuota(ctx, t)
	return ended, nil
}
