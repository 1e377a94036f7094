package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/corral-dev/corral/internal/app"
	"github.com/corral-dev/corral/internal/config"
)

func cmdServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lo config.LoadOptions
	lo.RegisterFlags(fs)
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	cfg, err := config.Load(lo)
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	log := newLogger(cfg, stderr)
	a, err := app.New(ctx, cfg, log, app.Options{})
	if err != nil {
		return err
	}
	defer a.Close()
	fmt.Fprintf(stdout, "corral serving on http://%s (data %s)\n", a.Addr(), cfg.Data)
	return a.Run(ctx)
}

// newLogger builds the process's logger from the configuration: text for a
// terminal, JSON for a service.
func newLogger(cfg *config.Config, w io.Writer) *slog.Logger {
	var lvl slog.Level
	lvl.UnmarshalText([]byte(cfg.Log.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	if cfg.Log.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	if f, ok := w.(*os.File); ok && f == os.Stderr {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
