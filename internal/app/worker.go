package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/corral-dev/corral/internal/worker"
)

// RunWorker is `corral worker run-task` inside a sandbox: it reads no
// configuration, only its arguments and the environment the runtime set,
// and returns the process exit code (the agent's).
func RunWorker(ctx context.Context, args, environ []string, stderr io.Writer) int {
	opts, err := worker.ParseArgs(args, environ)
	if err != nil {
		fmt.Fprintf(stderr, "corral worker run-task: %v\n", err)
		return worker.ExitUsage
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("task_id", opts.TaskID)
	return worker.Run(ctx, opts, log)
}
