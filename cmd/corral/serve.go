package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/app"
	"github.com/corral-dev/corral/internal/config"
)

func serveCmd() *cobra.Command {
	var lo config.LoadOptions
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the server",
		Long: `Run the server: the HTTP API, the MCP endpoint, the web UI and the workers.
Flags override the configuration file (--config, $CORRAL_CONFIG or
./corral.yaml) and the environment.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(lo)
			if err != nil {
				return fmt.Errorf("configuration: %w", err)
			}
			ctx, stdout := cmd.Context(), cmd.OutOrStdout()
			a, err := app.New(ctx, cfg, newLogger(cfg, cmd.ErrOrStderr()), app.Options{})
			if err != nil {
				return err
			}
			defer a.Close()
			fmt.Fprintf(stdout, "corral serving on http://%s (data %s)\n", a.Addr(), cfg.Data)
			return a.Run(ctx)
		},
	}
	serverFlags(cmd, &lo)
	return cmd
}

// serverFlags registers the configuration's flags, the server's own among
// them (--listen, --data, --runtime, --max-concurrent), on cmd.
func serverFlags(cmd *cobra.Command, lo *config.LoadOptions) {
	gfs := flag.NewFlagSet(cmd.Name(), flag.ContinueOnError)
	lo.RegisterFlags(gfs)
	cmd.Flags().AddGoFlagSet(gfs)
	completeRuntimes(cmd)
}

// newLogger builds the process's logger from the configuration: JSON for
// a service, else text.
func newLogger(cfg *config.Config, w io.Writer) *slog.Logger {
	var lvl slog.Level
	lvl.UnmarshalText([]byte(cfg.Log.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	if cfg.Log.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
