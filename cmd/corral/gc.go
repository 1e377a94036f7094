package main

import (
	"context"
	"fmt"
	"io"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/termsafe"
)

// cmdGC is `corral gc [--dry-run]`: a retention sweep now.
func cmdGC(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, cf := clientFlagSet("gc", stderr)
	dry := fs.Bool("dry-run", false, "only show what would be removed")
	if _, err := parse(fs, args); err != nil {
		return flagError(err)
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	rep, err := c.GC(ctx, service.GCRequest{DryRun: *dry})
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(stdout, rep)
	}
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
	if len(rep.Failed) > 0 {
		return exitError(1)
	}
	return nil
}
