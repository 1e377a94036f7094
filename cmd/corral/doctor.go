package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/corral-dev/corral/internal/app"
	"github.com/corral-dev/corral/internal/config"
)

func cmdDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lo config.LoadOptions
	lo.RegisterFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	cfg, err := config.Load(lo)
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	checks := app.Doctor(ctx, cfg, slog.New(slog.DiscardHandler))
	if *asJSON {
		return printJSON(stdout, checks)
	}
	bad := false
	for _, c := range checks {
		mark := "ok  "
		if !c.OK {
			mark = "no  "
			if c.Required {
				mark, bad = "FAIL", true
			}
		}
		fmt.Fprintf(stdout, "%s %-45s %s\n", mark, c.Name, c.Detail)
		if c.Fix != "" && !c.OK {
			fmt.Fprintf(stdout, "     %-45s fix: %s\n", "", c.Fix)
		}
	}
	if bad {
		return exitError(1)
	}
	return nil
}
