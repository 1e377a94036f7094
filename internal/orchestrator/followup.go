package orchestrator

import (
	"fmt"
	"os"
	"path"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

// followUpDir is where a follow-up finds the previous task's output.
const followUpDir = "context/previous"

// followUp checks follow_up_of and returns the task it continues. A
// follow-up that names no agent (nor a command) takes the previous task's.
func (o *Orchestrator) followUp(req *service.SpawnRequest) (task.Task, error) {
	if err := task.CheckID(req.FollowUpOf); err != nil {
		return task.Task{}, &errdefs.FieldError{Field: "follow_up_of", Err: err}
	}
	prev, err := o.tasks.Get(req.FollowUpOf)
	if err != nil {
		return task.Task{}, &errdefs.FieldError{Field: "follow_up_of", Err: err}
	}
	if !prev.Status.Terminal() {
		return task.Task{}, &errdefs.FieldError{Field: "follow_up_of", Err: fmt.Errorf("task %s has not ended (it is %s): %w", prev.ID, prev.Status, errdefs.ErrFailedPrecondition)}
	}
	if req.Agent == "" && req.Model == "" && len(req.Command) == 0 {
		req.Agent = prev.Agent
	}
	return prev, nil
}

// copyFollowUp brings the previous task's output into context/previous/
// and, for the same agent, its HOME (where Claude Code keeps the session
// that --resume continues), within what is left of the context budget.
// Symbolic links are skipped, never followed. Nothing is synced: the spawn
// makes the task's directory durable.
func (o *Orchestrator) copyFollowUp(dir *os.Root, prev task.Task, agent string) error {
	src, err := o.data.OpenTask(prev.ID)
	if err != nil {
		return &errdefs.FieldError{Field: "follow_up_of", Err: fmt.Errorf("the directory of task %s is gone (retention?): %w", prev.ID, err)}
	}
	defer src.Close()
	trees := []struct{ from, to string }{{"output", followUpDir}}
	if agent == prev.Agent {
		trees = append(trees, struct{ from, to string }{workerproto.HomeDir, workerproto.HomeDir})
	}
	budget := o.lib.ContextLeft(dir)
	for _, tr := range trees {
		files, _, err := workspace.ListFiles(src, tr.from)
		if err != nil {
			continue // an empty or missing tree
		}
		for _, f := range files {
			n, err := workspace.CopyFileNoSync(src, path.Join(tr.from, f.Name), dir, path.Join(tr.to, f.Name), budget)
			if err != nil {
				return &errdefs.FieldError{Field: "follow_up_of", Err: fmt.Errorf("copy %s of task %s: %w", path.Join(tr.from, f.Name), prev.ID, err)}
			}
			budget -= n
		}
	}
	return nil
}
