package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/termsafe"
)

// execOnceCmd runs code_execute: the command after -- (its words joined
// with spaces, run with sh -c) once in a fresh sandbox. It prints the
// command's stdout and stderr (escaped on a terminal), then the output
// files' attachment ids on stderr, and exits with the command's exit code.
func execOnceCmd() *cobra.Command {
	var (
		req     service.ExecRequest
		network string
	)
	cmd := &cobra.Command{
		Use:   "exec-once [flags] -- CMD...",
		Short: "Run a command once in a fresh sandbox (code_execute); exit with its code",
		Long: `Run a command once with sh -c in a fresh sandbox (code_execute) and print its
output; the files it writes to /workspace/output/ become attachments.
corral exits with the command's exit code (1 when it ended without one).

--network names the sandbox's network, as run's does. code_execute offers
two: none (the default: loopback only), and default, the server's own
policy for tasks (egress.mode), when the server allows it
(execution.network_enabled).`,
		Example: `  corral exec-once -- 'uname -a; ls /workspace'
  corral exec-once --runtime docker --image python:3.12-slim --attach ATTACHMENT_ID -- python3 /workspace/input/chart.py`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("give the command after --")
			}
			return nil
		},
	}
	cf := clientCmd(cmd)
	out := outputFlags(cmd, objectFormats)
	f := cmd.Flags()
	f.StringVar(&req.Image, "image", "", "image to run in (docker; default: the server's execution.default_image)")
	f.StringVar(&req.Runtime, "runtime", "", "sandbox runtime (default: the server's)")
	f.StringVar(&req.WorkingDir, "workdir", "", "directory to start in (default /workspace)")
	f.IntVar(&req.TimeoutSeconds, "timeout", 0, "limit in seconds, at most 300 (default: the server's, 60)")
	f.StringVar(&network, "network", task.NetworkNone, "the command's network: none, or default for the server's egress.mode")
	f.StringArrayVar(&req.AttachmentIDs, "attach", nil, "an attachment id to place in /workspace/input/ (repeatable)")
	f.StringArrayVar(&req.ContextFiles, "context", nil, "a shared workspace file to copy into /workspace/input/ (repeatable)")
	completeRuntimes(cmd)
	cmd.RegisterFlagCompletionFunc("network", cobra.FixedCompletions(execNetworks, cobra.ShellCompDirectiveNoFileComp))
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
		switch network {
		case task.NetworkNone:
		case execNetworkDefault:
			req.Network = true
		default:
			return usagef("--network %q: code_execute runs with %s (the server's egress.mode)", network, strings.Join(execNetworks, " or "))
		}
		format, err := out.get()
		if err != nil {
			return err
		}
		req.Command = strings.Join(args, " ")
		c, err := cf.client()
		if err != nil {
			return err
		}
		res, err := c.Execute(cmd.Context(), req)
		if err != nil {
			return err
		}
		if err := printAs(stdout, format, res, func() error { return printExec(stdout, stderr, res) }); err != nil {
			return err
		}
		switch {
		case res.Success:
			return nil
		case res.ExitCode != nil && *res.ExitCode > 0 && *res.ExitCode < 256:
			return exitError(*res.ExitCode)
		}
		return exitError(exitFailure)
	}
	return cmd
}

// execNetworkDefault is exec-once --network's name for the server's own
// network policy, the one code_execute gives a command that asks for the
// network.
const execNetworkDefault = "default"

var execNetworks = []string{task.NetworkNone, execNetworkDefault}

// printExec prints a code_execute call's output, and on stderr what
// became of its files.
func printExec(stdout, stderr io.Writer, res service.ExecResult) error {
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
	return nil
}
