package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/worker"
)

// cmdWorker is the entrypoint inside a sandbox: corral worker run-task.
// It reads no configuration; everything comes from its arguments and the
// environment the runtime set.
func cmdWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "run-task" {
		return fmt.Errorf("usage: corral worker run-task --prompt FILE --task-id ID --webhook URL [--agent NAME] [-- CMD ARGS...]: %w", errdefs.ErrInvalidArgument)
	}
	opts, err := worker.ParseArgs(args[1:], os.Environ())
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("task_id", opts.TaskID)
	if code := worker.Run(ctx, opts, log); code != 0 {
		return exitError(code)
	}
	return nil
}
