package taskrun

import (
	"context"
	"time"

	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/session"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workerproto"
)

// Egress runs one egress proxy per task with network allowlist or open,
// each listening on a socket in a host directory of the task's own that
// Prepare mounts into the sandbox. Implementations are safe for concurrent
// use.
type Egress interface {
	// Open starts the proxy of task id for its network policy ("allowlist"
	// or "open") and the model APIs of its agent, which it relays adding
	// their keys, or keeps the one that runs, and returns the host
	// directory holding its socket. It is idempotent, and after a restart
	// it listens again in the directory a running sandbox has mounted.
	Open(id, network string, models []workerproto.ModelAPI) (dir string, err error)
	// Dir is the host directory Open makes for task id, without making it.
	Dir(id string) string
	// Close stops the task's proxy and removes its directory. Closing a
	// task without one does nothing.
	Close(id string) error
	// Tasks lists the tasks that have a directory, listening or not (a
	// stopped server leaves the directories for its successor).
	Tasks() ([]string, error)
	// Forwards are the loopback host:port addresses the allowlist names,
	// which a task's worker forwards through its proxy
	// (egress.LoopbackForwards).
	Forwards() []string
}

// egressSweepPause is the least time between two sweeps of the egress
// proxies: every event (egress events included) wakes the loop, and one
// directory listing per half second is plenty.
const egressSweepPause = 500 * time.Millisecond

// RunEgress keeps the egress proxies in step with the tasks until ctx
// ends: on every change and at least every minute, it closes the proxies
// of tasks that ended or that no event knows. The caller runs it beside
// the scheduler; Prepare opens the proxies of tasks that start, and
// Reconcile those of tasks still running after a restart.
func (o *Runner) RunEgress(ctx context.Context) error {
	if o.opts.Egress == nil {
		return nil
	}
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		changed := o.tasks.Changed()
		o.sweepEgress()
		select {
		case <-changed:
		case <-tick.C:
		case <-ctx.Done():
			return nil
		}
		select {
		case <-time.After(egressSweepPause):
		case <-ctx.Done():
			return nil
		}
	}
}

// sweepEgress closes the proxies of tasks that ended or are unknown. A
// task unknown to the projection is looked for again after reading the
// store up to now: another server on the store may have started it.
func (o *Runner) sweepEgress() {
	ids, err := o.opts.Egress.Tasks()
	if err != nil {
		o.log.Warn("cannot list egress proxies", logkey.Error, err)
		return
	}
	synced := false
	for _, id := range ids {
		if session.ValidID(id) {
			continue // the session manager closes a session's
		}
		st, _, ok := o.tasks.Status(id)
		if !ok && !synced {
			if err := o.tasks.Sync(context.Background()); err != nil {
				o.log.Warn("cannot read the events to sweep the egress proxies", logkey.Error, err)
				return
			}
			synced = true
			st, _, ok = o.tasks.Status(id)
		}
		if ok && !st.Terminal() {
			continue
		}
		if err := o.opts.Egress.Close(id); err != nil {
			o.log.Warn("cannot close egress proxy", logkey.TaskID, id, logkey.Error, err)
		}
	}
}

// Adopt opens the egress proxy of t, a task this server adopts, if it has
// network: its sandbox still runs, and its relay dials the socket afresh
// for each connection (scheduler Runner).
func (o *Runner) Adopt(ctx context.Context, t task.Task) {
	if o.opts.Egress == nil || t.Network == "" || t.Network == task.NetworkNone {
		return
	}
	if err := o.OpenEgress(t); err != nil {
		o.log.Warn("cannot reopen egress proxy", logkey.TaskID, t.ID, logkey.Error, err)
	} else {
		o.log.Info("egress proxy reopened", logkey.TaskID, t.ID)
	}
}

// OpenEgress opens the egress proxy of t, which has network, with the
// model APIs of its agent, or keeps the one that runs.
func (o *Runner) OpenEgress(t task.Task) error {
	_, err := o.opts.Egress.Open(t.ID, t.Network, o.opts.Agents[t.Agent].Models)
	return err
}
