package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storecopy"
)

// progressEvery is how often a copy under way says how far it is.
const progressEvery = 2 * time.Second

// storeCmd is `corral store copy`: the event log from the data root's
// SQLite file into the PostgreSQL database the configuration names
// (--to postgres), or back (--to sqlite), checked event for event
// (package storecopy). The configuration is the server's: its data root,
// and its connection string, which only store.driver postgres may have,
// so it names PostgreSQL in both directions (the one the server is moving
// to, or moving from).
func storeCmd() *cobra.Command {
	return groupCmd("store", "The event log's store", storeCopyCmd())
}

func storeCopyCmd() *cobra.Command {
	var (
		lo    config.LoadOptions
		to    string
		batch int
	)
	cmd := &cobra.Command{
		Use:   "copy --to postgres|sqlite",
		Short: "Copy the event log between SQLite and PostgreSQL, checked event for event",
		Long: `Copies the event log (all the server records; files stay in the data root)
between the data root's corral.db and the PostgreSQL database of
store.dsn_file (or CORRAL_STORE_DSN): --to postgres from the first into the
second, --to sqlite back. Stop the server first; the source is only read.
The target must hold no events, or the start of this same log from a copy
that stopped (run again, it goes on from there). Every event is compared
field for field once copied.`,
		Args: noArgs,
	}
	gfs := flag.NewFlagSet("copy", flag.ContinueOnError)
	lo.RegisterClientFlags(gfs)
	gfs.Func("data", "data root directory (default ./corral-data)", func(s string) error { lo.Flags.Data = &s; return nil })
	cmd.Flags().AddGoFlagSet(gfs)
	cmd.Flags().StringVar(&to, "to", "", "the store to copy into: postgres or sqlite (the other is the source)")
	cmd.Flags().IntVar(&batch, "batch", storecopy.DefaultBatch, "events per transaction")
	cmd.RegisterFlagCompletionFunc("to", cobra.FixedCompletions([]string{storecopy.Postgres, storecopy.SQLite}, cobra.ShellCompDirectiveNoFileComp))
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		return storeCopy(cmd.Context(), lo, to, batch, cmd.OutOrStdout(), cmd.ErrOrStderr())
	}
	return cmd
}

func storeCopy(ctx context.Context, lo config.LoadOptions, to string, batch int, stdout, stderr io.Writer) error {
	var from string
	switch to {
	case storecopy.Postgres:
		from = storecopy.SQLite
	case storecopy.SQLite:
		from = storecopy.Postgres
	default:
		return usagef("--to must be postgres or sqlite")
	}
	if batch < 1 {
		return usagef("--batch must be at least 1")
	}
	cfg, err := config.Load(lo)
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	secrets, err := cfg.Secrets()
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if secrets.StoreDSN == "" {
		way := "into"
		if from == storecopy.Postgres {
			way = "from"
		}
		return fmt.Errorf("no PostgreSQL database to copy %s: set store.driver: postgres with store.dsn_file (or CORRAL_STORE_DSN), as the server on PostgreSQL has them: %w",
			way, errdefs.ErrInvalidArgument)
	}
	root, err := filepath.Abs(cfg.Data)
	if err != nil {
		return fmt.Errorf("data root: %w", err)
	}

	last := time.Now()
	r, err := storecopy.Run(ctx, from, storecopy.Stores{SQLite: filepath.Join(root, "corral.db"), Postgres: secrets.StoreDSN},
		storecopy.Options{Batch: batch, Progress: func(done, total int64) {
			if time.Since(last) >= progressEvery {
				last = time.Now()
				fmt.Fprintf(stderr, "copied the log up to position %d of %d\n", done, total)
			}
		}})
	if err != nil {
		return fmt.Errorf("copy the event log from %s to %s: %w", from, to, err)
	}
	printCopy(stdout, r, to)
	return nil
}

// printCopy says what a copy did, and what to do next.
func printCopy(w io.Writer, r storecopy.Report, to string) {
	fmt.Fprintf(w, "from:      %s\n", r.From)
	fmt.Fprintf(w, "to:        %s\n", r.To)
	fmt.Fprintf(w, "events:    %d in %d streams\n", r.Events, r.Streams)
	if r.Resumed > 0 {
		fmt.Fprintf(w, "resumed:   the target held the log up to position %d already, the same as the source's\n", r.Resumed)
	}
	fmt.Fprintf(w, "copied:    %d events in %s\n", r.Copied, r.Copying.Round(time.Millisecond))
	fmt.Fprintf(w, "verified:  every field of every event, in %s (after %s of checks before copying)\n",
		r.Verifying.Round(time.Millisecond), r.Checking.Round(time.Millisecond))
	fmt.Fprintf(w, "sha256:    %s\n", r.Checksum)
	if r.Truncated > 0 {
		fmt.Fprintf(w, "note:      %d events keep their recorded_at to the microsecond only: PostgreSQL keeps no nanoseconds\n", r.Truncated)
	}
	fmt.Fprintln(w, "The source is as it was.")
	if to == storecopy.Postgres {
		fmt.Fprintln(w, "To run on the copy: corral serve with this configuration (store.driver: postgres).")
	} else {
		fmt.Fprintln(w, "To run on the copy: store.driver: sqlite, without store.dsn_file or CORRAL_STORE_DSN, then corral serve on this data root.")
	}
}
