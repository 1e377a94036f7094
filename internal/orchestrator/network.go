package orchestrator

import (
	"context"
	"fmt"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// checkNetwork checks a network policy and a task's own allowlist, naming
// the request's fields for them.
func (o *Orchestrator) checkNetwork(network string, allow []string, networkField, allowField string) error {
	return service.CheckNetwork(o.opts.Networks, o.opts.CheckAllow, network, allow, networkField, allowField)
}

// SetNetwork implements service.Tasks: it records the task's new network
// policy (task_network_changed, under its version) and has this server's
// egress follow it before it answers; the other servers' follow the log.
func (o *Orchestrator) SetNetwork(ctx context.Context, req service.NetworkRequest) (task.Task, error) {
	if err := task.CheckID(req.TaskID); err != nil {
		return task.Task{}, err
	}
	if _, err := o.tasks.Lookup(ctx, req.TaskID); err != nil {
		return task.Task{}, err
	}
	actor := service.ActorFrom(ctx)
	t, err := o.tasks.Update(ctx, req.TaskID, func(t task.Task) ([]eventstore.Proposed, error) {
		if t.Status.Terminal() {
			return nil, fmt.Errorf("task %s already ended with status %s: %w", t.ID, t.Status, errdefs.ErrConflict)
		}
		if err := o.checkNetwork(req.Network, req.Allow, "network", "allow"); err != nil {
			return nil, err
		}
		if why := o.opts.NoEgress[t.Runtime]; why != "" && req.Network != task.NetworkNone {
			return nil, fmt.Errorf("network %s on the %s runtime: %s; only none: %w", req.Network, t.Runtime, why, errdefs.ErrFailedPrecondition)
		}
		// A sandbox made without the proxy has no way to it.
		if t.Network == task.NetworkNone && req.Network != task.NetworkNone && t.Status != task.Pending && t.Status != task.Queued {
			return nil, fmt.Errorf("task %s started with network none: its sandbox has no way to the egress proxy: %w", t.ID, errdefs.ErrConflict)
		}
		return []eventstore.Proposed{projection.NewEvent(task.EventNetworkChanged, task.NetworkChanged{Network: req.Network, Allow: req.Allow}, actor)}, nil
	})
	if err != nil {
		return t, err
	}
	if o.opts.NetworkChanged != nil {
		o.opts.NetworkChanged(t)
	}
	return t, nil
}
