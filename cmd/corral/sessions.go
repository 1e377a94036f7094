package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/termsafe"
)

// cmdSessions is corral sessions [ls] | create | rm ID | suspend ID | resume ID | fork ID [-n N].
func cmdSessions(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, args, fs, cf := subcommand("sessions", args, stderr)
	var req service.CreateSessionRequest
	fs.StringVar(&req.Runtime, "runtime", "", "create: the runtime (default: the server's)")
	fs.StringVar(&req.Image, "image", "", "create: the image (docker)")
	idle := fs.Duration("idle", 0, "create: end the session after this long without a command (default: the server's)")
	life := fs.Duration("lifetime", 0, "create: end the session after this long (default: the server's)")
	var labels multiFlag
	fs.Var(&labels, "label", "create: KEY=VALUE (repeat for more)")
	forks := fs.Int("n", 1, "fork: how many sessions to make")
	pos, c, err := cf.parse(fs, args)
	if err != nil {
		return err
	}
	switch sub {
	case "ls", "list":
		ss, err := c.ListSessions(ctx)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(stdout, ss)
		}
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SESSION\tSTATUS\tRUNTIME\tIMAGE\tEXECS\tCREATED")
		for _, s := range ss {
			status := s.Status
			if s.EndReason != "" {
				status += " (" + s.EndReason + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", s.ID, termsafe.Line(status), s.Runtime, termsafe.Line(s.Image), s.Execs, s.CreatedAt.Local().Format("2006-01-02 15:04"))
		}
		return tw.Flush()
	case "create":
		req.IdleTimeout, req.MaxLifetime = int(idle.Seconds()), int(life.Seconds())
		for _, l := range labels {
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				return fmt.Errorf("--label %q: want KEY=VALUE: %w", l, errdefs.ErrInvalidArgument)
			}
			if req.Labels == nil {
				req.Labels = map[string]string{}
			}
			req.Labels[k] = v
		}
		created, err := c.CreateSession(ctx, req)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(stdout, created)
		}
		fmt.Fprintf(stdout, "%s\ntoken %s (shown once: it runs commands in this session and nothing else)\n", created.SessionID, created.Token)
		return nil
	case "rm", "delete":
		if len(pos) != 1 {
			return fmt.Errorf("give one session id: %w", errdefs.ErrInvalidArgument)
		}
		s, err := c.DeleteSession(ctx, pos[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s %s\n", s.ID, s.Status)
		return nil
	case "suspend", "resume":
		if len(pos) != 1 {
			return fmt.Errorf("give one session id: %w", errdefs.ErrInvalidArgument)
		}
		if sub == "resume" {
			s, err := c.Sessions().Resume(ctx, pos[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "%s %s\n", s.ID, s.Status)
			return nil
		}
		r, err := c.Sessions().Suspend(ctx, pos[0])
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(stdout, r)
		}
		fmt.Fprintf(stdout, "%s %s: %s\n", r.Session.ID, r.Session.Status, r.Note)
		return nil
	case "fork":
		if len(pos) != 1 {
			return fmt.Errorf("give one session id: %w", errdefs.ErrInvalidArgument)
		}
		r, err := c.Sessions().Fork(ctx, pos[0], *forks)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(stdout, r)
		}
		for _, f := range r.Forks {
			fmt.Fprintf(stdout, "%s token %s\n", f.SessionID, f.Token)
		}
		fmt.Fprintf(stdout, "%d files, %d bytes copied to each (tokens shown once): %s\n", r.Files, r.Bytes, r.Note)
		return nil
	}
	return fmt.Errorf("unknown sessions command %q (ls, create, rm, suspend, resume, fork): %w", sub, errdefs.ErrInvalidArgument)
}

// cmdExec is corral exec SESSION -- CMD ARGS: the command's output
// streams as it comes (escaped on a terminal), and corral exits with its
// code. -i passes stdin to the command.
func cmdExec(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, cf := clientFlagSet("exec", stderr)
	stdin := fs.Bool("i", false, "pass stdin to the command (read whole before it starts)")
	cwd := fs.String("cwd", "", "the directory inside the session (default "+service.SessionDir+")")
	timeout := fs.Duration("timeout", 0, "stop the command after this long (exit code 124)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: corral exec [-i] [--cwd DIR] [--timeout D] SESSION -- CMD ARGS...")
		fs.PrintDefaults()
	}
	pos, err := parse(fs, args)
	if err != nil {
		return flagError(err)
	}
	if len(pos) < 2 {
		return fmt.Errorf("give a session id and the command after --: %w", errdefs.ErrInvalidArgument)
	}
	argv, _ := json.Marshal(pos[1:])
	body := httpapi.ExecBody{Command: argv, Cwd: *cwd, TimeoutSeconds: int((*timeout + time.Second - 1) / time.Second)}
	if *stdin {
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
	out, errw := termsafe.ForTerminal(stdout), termsafe.ForTerminal(stderr)
	end, err := c.ExecSession(ctx, pos[0], body, func(ch httpapi.ExecChunk) error {
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
	return exitError(1)
}
