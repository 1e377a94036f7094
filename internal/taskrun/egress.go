package taskrun

import (
	"context"
	"fmt"
	"maps"
	"slices"
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
	// Open starts the proxy of task id under policy p, or keeps the one
	// that runs, and returns the host directory holding its socket. It is
	// idempotent, and after a restart it listens again in the directory a
	// running sandbox has mounted.
	Open(id string, p EgressPolicy) (dir string, err error)
	// Update gives task id's proxy policy p from now on: new connections
	// meet it, and open ones it does not allow are closed before it
	// returns. A task whose proxy does not run here is errdefs.ErrNotFound.
	Update(id string, p EgressPolicy) error
	// Dir is the host directory Open makes for task id, without making it.
	Dir(id string) string
	// Close stops the task's proxy and removes its directory. Closing a
	// task without one does nothing.
	Close(id string) error
	// Tasks lists the tasks that have a directory, listening or not (a
	// stopped server leaves the directories for its successor).
	Tasks() ([]string, error)
	// SandboxEnv is what the sandbox of a task under p gets in its
	// environment for its egress (workerproto.EnvEgressCA, the
	// placeholders of its credential rules' variables).
	SandboxEnv(p EgressPolicy) []string
	// Forwards are the loopback host:port addresses the allowlist names,
	// which a task's worker forwards through its proxy
	// (egress.LoopbackForwards).
	Forwards() []string
}

// EgressPolicy is what a task's proxy lets through: its network policy
// ("allowlist" or "open", or "none" for nothing), its own allowlist (nil:
// the server's), and the model APIs of its agent, relayed with their keys.
type EgressPolicy struct {
	Network string
	Allow   []string
	Models  []workerproto.ModelAPI
	// Credentials name the credential rules given on request that the
	// task asked for (those for every task apply anyway).
	Credentials []string
}

// egressPolicy is t's.
func (o *Runner) egressPolicy(t task.Task) EgressPolicy {
	return EgressPolicy{Network: t.Network, Allow: t.NetworkAllow, Models: o.opts.Agents[t.Agent].Models, Credentials: t.Credentials}
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
	var swept time.Time
	sweep := time.NewTimer(0)
	defer sweep.Stop()
	for {
		changed := o.tasks.Changed()
		// A policy changed on another server (or by one whose call did
		// not reach this proxy) is followed at once; the sweep waits.
		o.followPolicies()
		select {
		case <-changed:
			if wait := egressSweepPause - time.Since(swept); wait > 0 {
				sweep.Reset(wait)
				continue
			}
		case <-sweep.C:
		case <-tick.C:
		case <-ctx.Done():
			return nil
		}
		o.sweepEgress()
		swept = time.Now()
	}
}

// ApplyEgress gives t's proxy, if it runs here, t's policy now (a
// network change recorded a moment ago).
func (o *Runner) ApplyEgress(t task.Task) {
	if o.opts.Egress == nil {
		return
	}
	p := o.egressPolicy(t)
	key := policyKey(p)
	o.egressMu.Lock()
	defer o.egressMu.Unlock()
	applied, open := o.egressApplied[t.ID]
	if !open || applied == key {
		return
	}
	if err := o.opts.Egress.Update(t.ID, p); err != nil {
		o.log.Warn("cannot change a task's egress policy", logkey.TaskID, t.ID, logkey.Error, err)
		return
	}
	o.egressApplied[t.ID] = key
	o.log.Info("egress policy followed", logkey.TaskID, t.ID, "network", p.Network, "allow", len(p.Allow))
}

// followPolicies applies to each proxy opened here its task's policy, if
// it changed.
func (o *Runner) followPolicies() {
	o.egressMu.Lock()
	ids := slices.Collect(maps.Keys(o.egressApplied))
	o.egressMu.Unlock()
	for _, id := range ids {
		if t, err := o.tasks.Get(id); err == nil && !t.Status.Terminal() {
			o.ApplyEgress(t)
		}
	}
}

// openEgress opens t's proxy under its policy and remembers the policy
// applied.
func (o *Runner) openEgress(t task.Task) (string, error) {
	p := o.egressPolicy(t)
	dir, err := o.opts.Egress.Open(t.ID, p)
	if err != nil {
		return "", err
	}
	o.egressMu.Lock()
	if _, ok := o.egressApplied[t.ID]; !ok {
		o.egressApplied[t.ID] = policyKey(p)
	}
	o.egressMu.Unlock()
	return dir, nil
}

// closeEgress closes t's proxy and forgets it.
func (o *Runner) closeEgress(id string) error {
	o.egressMu.Lock()
	delete(o.egressApplied, id)
	o.egressMu.Unlock()
	return o.opts.Egress.Close(id)
}

// policyKey tells two policies apart (an empty allowlist from none).
func policyKey(p EgressPolicy) string {
	return fmt.Sprintf("%s|%t|%q|%d", p.Network, p.Allow == nil, p.Allow, len(p.Models))
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
		if err := o.closeEgress(id); err != nil {
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

// OpenEgress opens the egress proxy of t, which has network, under its
// policy, or keeps the one that runs.
func (o *Runner) OpenEgress(t task.Task) error {
	_, err := o.openEgress(t)
	return err
}
