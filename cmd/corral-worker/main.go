// Command corral-worker is the process a sandbox runs: `corral-worker
// worker run-task|warm|session`, the same as `corral worker ...`, in a
// binary that holds only the worker. It starts in a fraction of the
// corral binary's time and, idle in a warm sandbox, holds a fraction of
// its memory: none of the server's packages are in it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/corral-dev/corral/internal/workercmd"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "worker" {
		fmt.Fprintln(os.Stderr, "usage: corral-worker worker run-task|warm|session ...")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := workercmd.Main(ctx, os.Args[2:], os.Stderr)
	stop()
	os.Exit(code)
}
