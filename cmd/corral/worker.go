package main

import (
	"context"
	"io"

	"github.com/corral-dev/corral/internal/workercmd"
)

// cmdWorker is the worker's entrypoint, `corral worker run-task`, `warm`
// or `session`: the same code corral-worker runs in every sandbox, here
// for an image or a person that runs corral itself.
func cmdWorker(ctx context.Context, args []string, _, stderr io.Writer) error {
	if code := workercmd.Main(ctx, args, stderr); code != 0 {
		return exitError(code)
	}
	return nil
}
