package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/termsafe"
)

// gcCmd is `corral gc [--dry-run]`: a retention sweep now.
func gcCmd() *cobra.Command {
	var dry bool
	cmd := &cobra.Command{
		Use:   "gc [--dry-run]",
		Short: "Remove ended tasks' directories and unused attachments past retention",
		Args:  noArgs,
	}
	cf := clientCmd(cmd)
	out := outputFlags(cmd, objectFormats)
	cmd.Flags().BoolVar(&dry, "dry-run", false, "only show what would be removed")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		rep, err := c.GC(cmd.Context(), service.GCRequest{DryRun: dry})
		if err != nil {
			return err
		}
		if err := out.print(cmd.OutOrStdout(), rep, func() error { return printGC(cmd.OutOrStdout(), rep) }); err != nil {
			return err
		}
		if len(rep.Failed) > 0 {
			return exitError(exitFailure)
		}
		return nil
	}
	return cmd
}

func printGC(stdout io.Writer, rep service.GCReport) error {
	verb := "removed"
	if rep.DryRun {
		verb = "would remove"
	}
	for _, it := range append(rep.TaskDirectories, rep.Attachments...) {
		fmt.Fprintf(stdout, "%s %s (%d bytes): %s\n", verb, termsafe.Name(it.Path), it.Bytes, termsafe.Line(it.Reason))
	}
	for _, it := range rep.TaskEvents {
		fmt.Fprintf(stdout, "%s %d events of task %s (%d bytes): %s\n", verb, it.Events, termsafe.Name(it.TaskID), it.Bytes, termsafe.Line(it.Reason))
	}
	for _, it := range rep.Failed {
		fmt.Fprintf(stdout, "failed %s: %s (retried next sweep)\n", termsafe.Name(it.Path), termsafe.Line(it.Error))
	}
	fmt.Fprintf(stdout, "%s %d task directories and %d attachment files, %d bytes, and the events of %d tasks' runs\n",
		verb, len(rep.TaskDirectories), len(rep.Attachments), rep.Bytes, len(rep.TaskEvents))
	return nil
}
