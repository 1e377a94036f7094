package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/termsafe"
)

// cmdExecOnce runs code_execute: the command after -- (its words joined
// with spaces, run with sh -c) once in a fresh sandbox. It prints the
// command's stdout and stderr (escaped on a terminal), then the output
// files' attachment ids on stderr, and exits with the command's exit code.
func cmdExecOnce(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, cf := clientFlagSet("exec-once", stderr)
	var req service.ExecRequest
	fs.StringVar(&req.Image, "image", "", "image to run in (docker; default: the server's execution.default_image)")
	fs.StringVar(&req.Runtime, "runtime", "", "sandbox runtime (default: the server's)")
	fs.StringVar(&req.WorkingDir, "workdir", "", "directory to start in (default /workspace)")
	fs.IntVar(&req.TimeoutSeconds, "timeout", 0, "limit in seconds, at most 300 (default: the server's, 60)")
	fs.BoolVar(&req.Network, "network", false, "give the command the server's egress policy")
	fs.Func("attach", "an attachment id to place in /workspace/input/ (repeatable)", func(s string) error {
		req.AttachmentIDs = append(req.AttachmentIDs, s)
		return nil
	})
	fs.Func("context", "a shared workspace file to copy into /workspace/input/ (repeatable)", func(s string) error {
		req.ContextFiles = append(req.ContextFiles, s)
		return nil
	})
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: corral exec-once [--image IMAGE] [--runtime R] [--timeout SECONDS] [--network] [--attach ID]... [--context FILE]... -- COMMAND...")
		fs.PrintDefaults()
	}
	pos, err := parse(fs, args)
	if err != nil {
		return flagError(err)
	}
	if len(pos) == 0 {
		return fmt.Errorf("give the command after --: %w", errdefs.ErrInvalidArgument)
	}
	req.Command = strings.Join(pos, " ")
	c, err := cf.client()
	if err != nil {
		return err
	}
	res, err := c.Execute(ctx, req)
	if err != nil {
		return err
	}
	if cf.json {
		if err := printJSON(stdout, res); err != nil {
			return err
		}
	} else {
		for _, o := range []struct {
			w    io.Writer
			text string
		}{{stdout, res.Stdout}, {stderr, res.Stderr}} {
			w := termsafe.ForTerminal(o.w)
			io.WriteString(w, o.text)
			w.Close()
		}
		for _, t := range []struct {
			cut  bool
			name string
		}{{res.StdoutTruncated, "stdout"}, {res.StderrTruncated, "stderr"}} {
			if t.cut {
				fmt.Fprintf(stderr, "corral exec-once: %s was cut at the server's execution.max_output_size\n", t.name)
			}
		}
		for _, f := range res.OutputFiles {
			if f.AttachmentID != "" {
				fmt.Fprintf(stderr, "output %s (%d bytes): attachment %s (corral attachments get %s -o FILE)\n", termsafe.Name(f.Name), f.Size, f.AttachmentID, f.AttachmentID)
			} else {
				fmt.Fprintf(stderr, "output %s (%d bytes): %s\n", termsafe.Name(f.Name), f.Size, termsafe.Line(f.Note))
			}
		}
		if !res.Success && res.Error != "" {
			fmt.Fprintf(stderr, "corral exec-once: %s (task %s)\n", termsafe.Line(res.Error), res.TaskID)
		}
	}
	switch {
	case res.Success:
		return nil
	case res.ExitCode != nil && *res.ExitCode > 0 && *res.ExitCode < 256:
		return exitError(*res.ExitCode)
	}
	return exitError(1)
}
