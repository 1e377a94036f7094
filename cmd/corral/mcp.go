package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/app"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/mcpserver"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/tools"
)

// mcpCmd serves the tool catalogue over MCP on stdin and stdout, for a host
// that starts Corral as a subprocess (Claude Desktop). It talks to the
// server at --server or the configured address; when none answers there
// and --server was not given, it runs an embedded server in this process,
// listening at the configured address like corral serve. stdout carries
// the protocol alone: every log line goes to stderr.
func mcpCmd() *cobra.Command {
	var (
		cf        clientFlags
		sessionID string
	)
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "The tools over MCP on stdio (starts a server if none runs)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runMCP(cmd.Context(), &cf, sessionID, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	serverFlags(cmd, &cf.lo)
	cmd.Flags().StringVar(&cf.server, "server", "", "the server's URL (default http:// and the configured listen address; without it, an embedded server starts if none answers); unix:///path for its unix socket")
	cmd.Flags().StringVar(&sessionID, "session", "", "serve workspace_exec alone, bound to this session (the MCP server of an agent working through a session; needs --server and the session's token in CORRAL_API_TOKEN)")
	return cmd
}

func runMCP(ctx context.Context, cf *clientFlags, sessionID string, stdout, stderr io.Writer) error {
	cfg, err := config.Load(cf.lo)
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	log := newLogger(cfg, stderr)
	client, err := cf.client()
	if err != nil {
		return err
	}
	if sessionID != "" {
		if cf.server == "" {
			return fmt.Errorf("--session needs --server: %w", errdefs.ErrInvalidArgument)
		}
		srv := mcpserver.New(client.Set(), mcpserver.Options{MaxArgumentBytes: cfg.Limits.MaxRequestBytes.Bytes(), Session: sessionID}, log.With("subsystem", "mcp"))
		return srv.ServeStdio(ctx, io.NopCloser(os.Stdin), nopWriteCloser{stdout})
	}
	svc := client.Set()
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	remote, err := client.Tools(pctx)
	cancel()
	// The catalogue lists code_execute only where the server runs it.
	noExec := !cfg.Execution.Enabled
	switch {
	case err == nil:
		log.Info("mcp: using the running corral server")
		noExec = !slices.ContainsFunc(remote, func(f tools.Function) bool { return f.Function.Name == "code_execute" })
	case errors.Is(err, errdefs.ErrUnavailable) && cf.server == "":
		log.Info("mcp: no corral server answers; starting an embedded one", "listen", cfg.Listen, "data", cfg.Data)
		a, err := app.New(ctx, cfg, log, app.Options{})
		if err != nil {
			return fmt.Errorf("start an embedded server: %w", err)
		}
		defer a.Close()
		actx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- a.Run(actx) }()
		defer func() {
			stop()
			if err := <-done; err != nil {
				log.Error("embedded server ended", "err", err)
			}
		}()
		svc = a.Services()
		ctx = service.WithActor(ctx, "mcp-stdio")
	default:
		return fmt.Errorf("reach the corral server: %w", err)
	}
	// The schemas state this configuration's timeouts: the embedded
	// server's own, and a remote server's when both read the same file.
	w := cfg.AIWorker
	srv := mcpserver.New(svc, mcpserver.Options{MaxArgumentBytes: cfg.Limits.MaxRequestBytes.Bytes(),
		Limits: tools.Limits{DefaultTimeoutMinutes: w.DefaultTimeoutMinutes, MaxTimeoutMinutes: w.MaxTimeoutMinutes, NoCodeExecute: noExec}}, log.With("subsystem", "mcp"))
	return srv.ServeStdio(ctx, io.NopCloser(os.Stdin), nopWriteCloser{stdout})
}

// nopWriteCloser keeps the session from closing the process's stdout.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
