package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/termsafe"
)

// sessionsLister prints sessions.
var sessionsLister = lister[service.Session]{
	kind:   "session",
	header: []string{"SESSION", "STATUS", "RUNTIME", "IMAGE", "EXECS", "CREATED", "NETWORK", "WORKSPACE", "LAST USED", "FORKED FROM"},
	narrow: 6,
	row: func(s service.Session) []string {
		status := s.Status
		if s.EndReason != "" {
			status += " (" + s.EndReason + ")"
		}
		return []string{s.ID, termsafe.Line(status), s.Runtime, termsafe.Line(s.Image), strconv.Itoa(s.Execs), s.CreatedAt.Local().Format("2006-01-02 15:04"),
			termsafe.Line(s.Network), cell(s.Workspace), s.LastUsedAt.Local().Format("2006-01-02 15:04"), s.ForkedFrom}
	},
	id: func(s service.Session) string { return s.ID },
	version: func(s service.Session) string {
		return s.Status + " " + s.EndReason + " " + strconv.Itoa(s.Execs) + " " + s.LastUsedAt.String()
	},
}

// sessionsCmd is corral sessions: the list (alone or as ls), and the
// commands on one session.
func sessionsCmd() *cobra.Command {
	cmd := sessionsListCmd("sessions")
	cmd.Aliases = []string{"session"}
	cmd.Short = "Long-lived sandboxes: list them (sessions create, rm, get, suspend, resume, fork)"
	ls := sessionsListCmd("ls")
	ls.Aliases = []string{"list"}
	cmd.AddCommand(ls, sessionsCreateCmd(), sessionsGetCmd(),
		sessionIDCmd("rm ID", []string{"delete"}, "End a session and destroy its sandbox", objectFormats, nil, func(cmd *cobra.Command, c *httpapi.Client, id string, out *output) error {
			s, err := c.DeleteSession(cmd.Context(), id)
			if err != nil {
				return err
			}
			return out.print(cmd.OutOrStdout(), s, func() error { return sessionLine(cmd.OutOrStdout(), s) })
		}),
		sessionIDCmd("suspend ID", nil, "Stop a session's sandbox, keeping its files (and its memory where the runtime can)", objectFormats, nil, func(cmd *cobra.Command, c *httpapi.Client, id string, out *output) error {
			r, err := c.Sessions().Suspend(cmd.Context(), id)
			if err != nil {
				return err
			}
			return out.print(cmd.OutOrStdout(), r, func() error {
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s %s: %s\n", r.Session.ID, r.Session.Status, termsafe.Line(r.Note))
				return err
			})
		}),
		sessionIDCmd("resume ID", nil, "Start a suspended session again", objectFormats, nil, func(cmd *cobra.Command, c *httpapi.Client, id string, out *output) error {
			s, err := c.Sessions().Resume(cmd.Context(), id)
			if err != nil {
				return err
			}
			return out.print(cmd.OutOrStdout(), s, func() error { return sessionLine(cmd.OutOrStdout(), s) })
		}),
		sessionsForkCmd(),
	)
	return cmd
}

func sessionLine(w io.Writer, s service.Session) error {
	_, err := fmt.Fprintf(w, "%s %s\n", s.ID, s.Status)
	return err
}

// sessionsListCmd is the list of sessions, filtered here: the server
// gives every one.
func sessionsListCmd(use string) *cobra.Command {
	var runtime, status string
	cmd := &cobra.Command{
		Use:   use,
		Short: "List sessions, newest first",
		Args:  cobra.NoArgs,
	}
	cf := clientCmd(cmd)
	lf := addListFlags(cmd, true)
	cmd.Flags().StringVar(&runtime, "runtime", "", "only sessions on this runtime")
	cmd.Flags().StringVar(&status, "status", "", "only sessions in this status: "+strings.Join(sessionStatuses, ", "))
	completeRuntimes(cmd)
	cmd.RegisterFlagCompletionFunc("status", cobra.FixedCompletions(sessionStatuses, cobra.ShellCompDirectiveNoFileComp))
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if runtime != "" && !slices.Contains(rtkind.Names(), runtime) {
			return usagef("--runtime %q: want one of %s", runtime, strings.Join(rtkind.Names(), ", "))
		}
		if status != "" && !slices.Contains(sessionStatuses, status) {
			return usagef("--status %q: want one of %s", status, strings.Join(sessionStatuses, ", "))
		}
		c, err := cf.client()
		if err != nil {
			return err
		}
		list := func() ([]service.Session, error) {
			all, err := c.ListSessions(cmd.Context())
			var out []service.Session
			for _, s := range all {
				if (runtime == "" || s.Runtime == runtime) && (status == "" || s.Status == status) {
					out = append(out, s)
				}
			}
			return out, err
		}
		ss, err := list()
		if err != nil {
			return err
		}
		if ss == nil {
			ss = []service.Session{}
		}
		return sessionsLister.run(cmd.Context(), cmd.OutOrStdout(), lf, ss, ss, list)
	}
	return cmd
}

var sessionStatuses = []string{service.SessionRunning, service.SessionSuspended, service.SessionEnded}

// sessionIDCmd is a command on one session, whose id it resolves before
// calling fn.
func sessionIDCmd(use string, aliases []string, short string, formats []string, setup func(*cobra.Command), fn func(cmd *cobra.Command, c *httpapi.Client, id string, out *output) error) *cobra.Command {
	cmd := &cobra.Command{Use: use, Aliases: aliases, Short: short, Args: exactArgs(1, "one session id")}
	cf := clientCmd(cmd)
	out := outputFlags(cmd, formats)
	if setup != nil {
		setup(cmd)
	}
	cmd.ValidArgsFunction = firstArg(completeSessions(cf))
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		id, err := resolveSession(cmd.Context(), c, args[0])
		if err != nil {
			return err
		}
		return fn(cmd, c, id, out)
	}
	return cmd
}

func sessionsGetCmd() *cobra.Command {
	return sessionIDCmd("get ID", nil, "One session", listFormats, nil, func(cmd *cobra.Command, c *httpapi.Client, id string, out *output) error {
		s, err := c.GetSession(cmd.Context(), id)
		if err != nil {
			return err
		}
		format, err := out.get()
		if err != nil {
			return err
		}
		return sessionsLister.get(cmd.OutOrStdout(), format, s)
	})
}

func sessionsCreateCmd() *cobra.Command {
	var (
		req        service.CreateSessionRequest
		idle, life time.Duration
		labels     []string
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Start a session; prints its id and its token (shown once)",
		Args:  noArgs,
	}
	cf := clientCmd(cmd)
	out := outputFlags(cmd, objectFormats)
	f := cmd.Flags()
	f.StringVar(&req.Runtime, "runtime", "", "the runtime (default: the server's)")
	f.StringVar(&req.Image, "image", "", "the image (docker, kubernetes)")
	f.DurationVar(&idle, "idle", 0, "end the session after this long without a command (default: the server's)")
	f.DurationVar(&life, "lifetime", 0, "end the session after this long (default: the server's)")
	f.StringArrayVar(&labels, "label", nil, "a label KEY=VALUE (repeatable)")
	completeRuntimes(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		req.IdleTimeout, req.MaxLifetime = int(idle.Seconds()), int(life.Seconds())
		for _, l := range labels {
			k, v, ok := strings.Cut(l, "=")
			if !ok || k == "" {
				return usagef("--label %q: want KEY=VALUE", l)
			}
			if req.Labels == nil {
				req.Labels = map[string]string{}
			}
			req.Labels[k] = v
		}
		c, err := cf.client()
		if err != nil {
			return err
		}
		created, err := c.CreateSession(cmd.Context(), req)
		if err != nil {
			return err
		}
		return out.print(cmd.OutOrStdout(), created, func() error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s\ntoken %s (shown once: it runs commands in this session and nothing else)\n", created.SessionID, created.Token)
			return err
		})
	}
	return cmd
}

func sessionsForkCmd() *cobra.Command {
	var n int
	return sessionIDCmd("fork ID", nil, "Copy a session into new ones; prints their ids and tokens (shown once)", objectFormats, func(cmd *cobra.Command) {
		cmd.Flags().IntVarP(&n, "n", "n", 1, "how many sessions to make")
	}, func(cmd *cobra.Command, c *httpapi.Client, id string, out *output) error {
		r, err := c.Sessions().Fork(cmd.Context(), id, n)
		if err != nil {
			return err
		}
		stdout := cmd.OutOrStdout()
		return out.print(stdout, r, func() error {
			for _, f := range r.Forks {
				fmt.Fprintf(stdout, "%s token %s\n", f.SessionID, f.Token)
			}
			_, err := fmt.Fprintf(stdout, "%d files, %d bytes copied to each (tokens shown once): %s\n", r.Files, r.Bytes, termsafe.Line(r.Note))
			return err
		})
	})
}

// execCmd is corral exec SESSION -- CMD ARGS: the command's output
// streams as it comes (escaped on a terminal), and corral exits with its
// code. -i passes stdin to the command.
func execCmd() *cobra.Command {
	var (
		stdin   bool
		cwd     string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "exec SESSION -- CMD [ARGS...]",
		Short: "Run a command in a session, its output streamed; exit with its code",
		Long: `Run a command in a session, its output streamed as it comes (escaped when
stdout or stderr is a terminal). corral exits with the command's exit code:
124 when --timeout stopped it, 1 when it could not run.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return usagef("give a session id and the command after --")
			}
			return nil
		},
	}
	cf := clientCmd(cmd)
	cmd.Flags().BoolVarP(&stdin, "stdin", "i", false, "pass stdin to the command (read whole before it starts)")
	cmd.Flags().StringVar(&cwd, "cwd", "", "the directory inside the session (default "+service.SessionDir+")")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "stop the command after this long (exit code 124)")
	cmd.ValidArgsFunction = firstArg(completeSessions(cf))
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
		argv, _ := json.Marshal(args[1:])
		body := httpapi.ExecBody{Command: argv, Cwd: cwd, TimeoutSeconds: int((timeout + time.Second - 1) / time.Second)}
		if stdin {
			b, err := io.ReadAll(os.Stdin)
			if err != nil {
				return fileError("read", "stdin", err)
			}
			body.Stdin = string(b)
		}
		c, err := cf.client()
		if err != nil {
			return err
		}
		id, err := resolveSession(cmd.Context(), c, args[0])
		if err != nil {
			return err
		}
		out, errw := termsafe.ForTerminal(stdout), termsafe.ForTerminal(stderr)
		end, err := c.ExecSession(cmd.Context(), id, body, func(ch httpapi.ExecChunk) error {
			w := out
			switch ch.Type {
			case "stderr":
				w = errw
			case "gap":
				fmt.Fprintf(errw, "[corral exec: %d bytes of output not kept]\n", ch.Missing)
				return nil
			}
			_, err := w.Write(ch.Bytes())
			return err
		})
		out.Close()
		errw.Close()
		if err != nil {
			return err
		}
		if end.Error != "" {
			fmt.Fprintf(stderr, "corral exec: %s\n", termsafe.Line(end.Error))
		}
		switch {
		case end.ExitCode == 0:
			return nil
		case end.ExitCode > 0 && end.ExitCode < 256:
			return exitError(end.ExitCode)
		}
		return exitError(exitFailure)
	}
	return cmd
}
