package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storecopy"
)

const storeUsage = "corral store copy --to postgres|sqlite [--config FILE] [--data DIR] [--batch N]"

// progressEvery is how often a copy under way says how far it is.
const progressEvery = 2 * time.Second

// cmdStore is `corral store copy`: the event log from the data root's
// SQLite file into the PostgreSQL database the configuration names
// (--to postgres), or back (--to sqlite), checked event for event
// (package storecopy). The configuration is the server's: its data root,
// and its connection string, which only store.driver postgres may have,
// so it names PostgreSQL in both directions (the one the server is moving
// to, or moving from).
func cmdStore(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: %s: %w", storeUsage, errdefs.ErrInvalidArgument)
	}
	if isHelp(args[0]) {
		fmt.Fprintln(stdout, "usage: "+storeUsage)
		return nil
	}
	if args[0] != "copy" {
		return fmt.Errorf("unknown store command %q; usage: %s: %w", args[0], storeUsage, errdefs.ErrInvalidArgument)
	}
	fs := flag.NewFlagSet("store copy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s\n\n", storeUsage)
		fmt.Fprintln(stderr, "Copies the event log (all the server records; files stay in the data root) between the data root's corral.db and the PostgreSQL database of store.dsn_file (or CORRAL_STORE_DSN): --to postgres from the first into the second, --to sqlite back. Stop the server first; the source is only read. The target must hold no events, or the start of this same log from a copy that stopped (run again, it goes on from there). Every event is compared field for field once copied.")
		fmt.Fprintln(stderr)
		fs.PrintDefaults()
	}
	var lo config.LoadOptions
	lo.RegisterClientFlags(fs)
	fs.Func("data", "data root directory (default ./corral-data)", func(s string) error { lo.Flags.Data = &s; return nil })
	to := fs.String("to", "", "the store to copy into: postgres or sqlite (the other is the source)")
	batch := fs.Int("batch", storecopy.DefaultBatch, "events per transaction")
	if err := parseNoArgs(fs, args[1:]); err != nil {
		return err
	}
	var from string
	switch *to {
	case storecopy.Postgres:
		from = storecopy.SQLite
	case storecopy.SQLite:
		from = storecopy.Postgres
	default:
		return fmt.Errorf("--to must be postgres or sqlite; usage: %s: %w", storeUsage, errdefs.ErrInvalidArgument)
	}
	if *batch < 1 {
		return fmt.Errorf("--batch must be at least 1: %w", errdefs.ErrInvalidArgument)
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
		storecopy.Options{Batch: *batch, Progress: func(done, total int64) {
			if time.Since(last) >= progressEvery {
				last = time.Now()
				fmt.Fprintf(stderr, "copied the log up to position %d of %d\n", done, total)
			}
		}})
	if err != nil {
		return fmt.Errorf("copy the event log from %s to %s: %w", from, *to, err)
	}
	printCopy(stdout, r, *to)
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
