package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/app"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpapi"
)

// doctorServerWait bounds the question to the server: a doctor that hangs
// on a server that does not answer helps nobody.
const doctorServerWait = 10 * time.Second

// doctorReport is corral doctor -o json: the server's answer (or why there
// is none), then this machine's checks.
type doctorReport struct {
	Server      *httpapi.Health `json:"server"`
	ServerURL   string          `json:"server_url"`
	ServerError string          `json:"server_error,omitempty"`
	Local       []app.Check     `json:"local"`
}

// doctorCmd asks the server what works there (GET /api/health), then
// checks this machine with this configuration: what a server started
// here would find.
func doctorCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "What works on the server and on this machine, and what is missing",
		Long: `Ask the server what works there (its runtimes, store, agents: GET
/api/health), then check this machine with this configuration, as a server
started here would find it. Exits 1 when a required check fails on either.`,
		Args: noArgs,
	}
	serverFlags(cmd, &cf.lo)
	cmd.Flags().StringVar(&cf.server, "server", "", "the server's URL (default http:// and the configured listen address)")
	out := outputFlags(cmd, objectFormats)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx, stdout := cmd.Context(), cmd.OutOrStdout()
		format, err := out.get()
		if err != nil {
			return err
		}
		cfg, err := config.Load(cf.lo)
		if err != nil {
			return fmt.Errorf("configuration: %w", err)
		}
		c, err := cf.client()
		if err != nil {
			return err
		}
		var rep doctorReport
		rep.ServerURL = cf.url
		sctx, cancel := context.WithTimeout(ctx, doctorServerWait)
		h, err := c.Health(sctx)
		cancel()
		if err != nil {
			rep.ServerError = errdefs.Message(err)
		} else {
			rep.Server = &h
		}
		rep.Local = app.Doctor(ctx, cfg, slog.New(slog.DiscardHandler))
		bad := rep.Server != nil && failed(rep.Server.Checks) || failed(rep.Local)
		err = printAs(stdout, format, rep, func() error {
			if rep.Server != nil {
				ready := "ready"
				if !h.Ready {
					ready = "starting"
				}
				fmt.Fprintf(stdout, "server %s (corral %s, %s; checked %s):\n", rep.ServerURL, oneLine(h.Version, 60), ready, h.CheckedAt.Local().Format(time.DateTime))
				printChecks(stdout, h.Checks)
				if len(h.Warm) > 0 {
					fmt.Fprintf(stdout, "\nwarm sandboxes on the server:\n")
					if err := printWarm(stdout, h.Warm); err != nil {
						return err
					}
				}
			} else {
				fmt.Fprintf(stdout, "server %s: %s\n", rep.ServerURL, oneLine(rep.ServerError, 200))
			}
			where := "defaults"
			if f := cfg.File(); f != "" {
				where = f
			}
			fmt.Fprintf(stdout, "\nthis machine (configuration: %s, data %s):\n", oneLine(where, 100), oneLine(cfg.Data, 100))
			printChecks(stdout, rep.Local)
			return nil
		})
		if err != nil {
			return err
		}
		if bad {
			return exitError(exitFailure)
		}
		return nil
	}
	return cmd
}

// failed reports whether a required check failed.
func failed(checks []app.Check) bool {
	for _, c := range checks {
		if c.Required && !c.OK {
			return true
		}
	}
	return false
}

// printWarm lists the server's warm pools, as its health page does.
func printWarm(w io.Writer, pools []httpapi.WarmPool) error {
	rows := make([][]string, len(pools))
	for i, p := range pools {
		rows[i] = []string{cell(p.Runtime), cell(p.Shape)}
		for _, n := range []uint64{uint64(p.Ready), uint64(p.Target), p.Claims, p.Misses, p.Started, p.Failed, p.Destroyed} {
			rows[i] = append(rows[i], strconv.FormatUint(n, 10))
		}
	}
	return table(w, []string{"RUNTIME", "SHAPE", "READY", "TARGET", "CLAIMS", "MISSES", "STARTED", "FAILED", "DESTROYED"}, 9, true, rows)
}

func printChecks(w io.Writer, checks []app.Check) {
	for _, c := range checks {
		mark := "ok  "
		if !c.OK {
			mark = "no  "
			if c.Required {
				mark = "FAIL"
			}
		}
		fmt.Fprintf(w, "%s %-45s %s\n", mark, oneLine(c.Name, 45), oneLine(c.Detail, 300))
		if c.Fix != "" && !c.OK {
			fmt.Fprintf(w, "     %-45s fix: %s\n", "", oneLine(c.Fix, 300))
		}
	}
}
