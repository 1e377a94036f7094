package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/corral-dev/corral/internal/app"
	"github.com/corral-dev/corral/internal/errdefs"
)

// cmdWorker is the entrypoint inside a sandbox: corral worker run-task,
// corral worker warm in a warm one (until a task claims it), or corral
// worker session in a session's.
func cmdWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 1 && args[0] == "session" {
		// A session sandbox's main process, its exec agent: it holds the
		// sandbox up until it is stopped (SIGTERM or SIGINT).
		if code := app.RunSessionAgent(ctx, os.Environ(), stderr); code != 0 {
			return exitError(code)
		}
		return nil
	}
	if len(args) == 1 && args[0] == "warm" {
		// A warm sandbox's main process: it waits for its task.
		if code := app.RunWarm(ctx, stderr); code != 0 {
			return exitError(code)
		}
		return nil
	}
	if len(args) == 0 || args[0] != "run-task" {
		return fmt.Errorf("usage: corral worker run-task --prompt FILE --task-id ID --webhook URL [--agent NAME] [-- CMD ARGS...]: %w", errdefs.ErrInvalidArgument)
	}
	if code := app.RunWorker(ctx, args[1:], os.Environ(), stderr); code != 0 {
		return exitError(code)
	}
	return nil
}
