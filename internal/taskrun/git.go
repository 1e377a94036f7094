package taskrun

import (
	"context"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workspace"
)

// snapshotGit keeps what a workspace task's repository runs (its hooks,
// its .git/config) before the task's sandbox starts, for Released.
func (o *Runner) snapshotGit(t task.Task, pr workspace.Project) error {
	root, err := o.opts.Projects.Open(pr)
	if err != nil {
		return err
	}
	defer root.Close()
	return o.data.SaveGitSnapshot(t.ID, root)
}

// Released looks, once a task's sandbox is gone, at what the task left in
// its workspace's repository for the workspace's owner to run at their
// next git command: the hooks it created or changed lose their execute
// bits (unless allowed), and what it found is recorded on the task's
// stream (workspace_git_checked), which the result shows.
func (o *Runner) Released(ctx context.Context, t task.Task) {
	if t.Workspace == "" {
		return
	}
	pr, err := o.opts.Projects.Resolve(t.Workspace)
	if err != nil {
		return
	}
	root, err := o.opts.Projects.Open(pr)
	if err != nil {
		return
	}
	defer root.Close()
	found, ok, err := o.data.CheckSavedGit(t.ID, root, o.opts.AllowHooks)
	if err != nil {
		o.log.Warn("cannot disable the hooks a task left in its workspace", logkey.TaskID, t.ID, logkey.Error, err)
	}
	if !ok || len(found.Hooks)+len(found.Config) == 0 {
		return
	}
	o.log.Warn("a task left git hooks or configuration that run programs in its workspace", logkey.TaskID, t.ID,
		"hooks", found.Hooks, "config", found.Config, "hooks_disabled", !o.opts.AllowHooks)
	ev := projection.NewEvent(task.EventWorkspaceGit, task.WorkspaceGit{
		Hooks: found.Hooks, HooksDisabled: len(found.Hooks) > 0 && !o.opts.AllowHooks && err == nil, Config: found.Config,
	}, "corral/taskrun")
	if _, err := o.store.Append(context.WithoutCancel(ctx), task.StreamID(t.ID), eventstore.AnyVersion, ev); err != nil {
		o.log.Warn("cannot record what a task left in its workspace's repository", logkey.TaskID, t.ID, logkey.Error, err)
	}
}
