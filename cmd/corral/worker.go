package main

import (
	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/workercmd"
)

// workerCmd is the worker's entrypoint, `corral worker run-task`, `warm`
// or `session`: the same code corral-worker runs in every sandbox, here
// for an image or a person that runs corral itself. Its arguments are
// workercmd's to parse.
func workerCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "worker run-task|warm|session ...",
		Short:              "(inside a sandbox) run one task's agent",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := workercmd.Main(cmd.Context(), args, cmd.ErrOrStderr()); code != 0 {
				return exitError(code)
			}
			return nil
		},
	}
}
