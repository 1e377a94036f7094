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
// or corral worker idle in a session's.
func cmdWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 1 && args[0] == "idle" {
		// A session sandbox's main process: it holds the sandbox up until
		// it is stopped (SIGTERM or SIGINT), and commands run beside it.
		<-ctx.Done()
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
