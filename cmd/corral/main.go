// Command corral is Corral's binary: the server (corral serve), the CLI
// client for people and scripts, the MCP server, and the worker's
// entrypoint (corral worker run-task), which sandboxes run from
// corral-worker, built from the same code without the rest.
//
// The commands are cobra's (docs/cli.md describes them): each has its own
// flags, its help (corral help CMD, CMD --help), and shell completion
// that asks the server for task and session ids.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/app"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/notify"
	"github.com/corral-dev/corral/internal/termsafe"
)

// The exit codes a script can rely on, besides 0 and the code of a command
// that corral runs and follows (run --follow, exec, exec-once), which
// passes through. docs/cli.md lists them.
const (
	// exitFailure: the command failed, or a followed task failed without
	// an exit code of its own.
	exitFailure = 1
	// exitUsage: the command line was wrong (an unknown command or flag, a
	// missing or bad argument), or the server refused a request as
	// invalid.
	exitUsage = 2
	// exitUnreachable: no server answered at the address
	// (EX_UNAVAILABLE of sysexits.h).
	exitUnreachable = 69
	// exitTimeout: a followed task ended at its time limit, as timeout(1)
	// exits.
	exitTimeout = 124
	// exitCancelled: a followed task was cancelled, as a shell reports a
	// command that SIGINT ended.
	exitCancelled = 130
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the command args name and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetIn(os.Stdin)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		return int(ee)
	}
	name := "corral"
	if cmd != nil {
		name = cmd.CommandPath()
	}
	fmt.Fprintf(stderr, "%s: %s\n", name, termsafe.Text(errdefs.Message(err)))
	switch {
	case isUsageError(err):
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", name)
		return exitUsage
	case errors.Is(err, httpapi.ErrNoServer):
		fmt.Fprintln(stderr, "start one with `corral serve` (from a checkout, ./scripts/quickstart.sh builds and starts one), or give another's URL with --server")
		return exitUnreachable
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return exitUsage
	}
	return exitFailure
}

// usageError is a command line corral cannot run: a bad flag, a missing
// or surplus argument. It exits 2, with a pointer to the command's help.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// usagef is a usageError made as fmt.Errorf makes an error.
func usagef(format string, a ...any) error {
	return usageError{fmt.Errorf(format, a...)}
}

// isUsageError reports whether err is a command line corral cannot run:
// a usageError, or cobra's own for an unknown command or argument.
func isUsageError(err error) bool {
	var ue usageError
	return errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown command ")
}

// exitError ends the process with a code and no message.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// fileError is an error about a local file, which it names: messages
// (errdefs.Message) leave out the absolute paths of system calls' errors,
// which on the server are the host's, so the command says which file.
func fileError(verb, name string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return fmt.Errorf("%s %s: %w", verb, termsafe.Name(name), err)
}

// The groups of commands in corral --help.
const (
	groupTasks    = "tasks"
	groupSessions = "sessions"
	groupFiles    = "files"
	groupServer   = "server"
)

const rootLong = `corral hands tasks to AI coding agents in sandboxes.

Client commands reach the server at --server (default: http:// and the
listen address of the configuration) with the token in CORRAL_API_TOKEN.
Lists and gets print a table, or -o json|yaml|wide|name; -q prints ids
only. Wherever a task or session id is taken, a unique prefix of it will do.
run --follow and logs -f outlive a restart of the server: they reconnect
and go on where they were, for up to 2 minutes without a server.

What a worker wrote (summaries, errors, file names and contents, logs,
progress) is printed with control characters and escape sequences shown
escaped (\x1b, \u009b) and odd names quoted, so that it cannot act on the
terminal. ws cat and attachments get -o - write a file's exact bytes to a
pipe or a file, and escape them only when stdout is a terminal.

Exit codes: 0 success; 1 failure; 2 a bad command line or a request the
server refused as invalid; 69 no server at the address. run --follow,
exec and exec-once exit with the task's or the command's own code; a
followed task without one exits 1 failed, 124 timed out, 130 cancelled.
docs/cli.md has the rest.`

// newRoot builds the command tree.
func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "corral",
		Short:         "Hand tasks to AI coding agents in sandboxes",
		Long:          rootLong,
		Version:       app.Version(),
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetVersionTemplate("corral {{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddGroup(
		&cobra.Group{ID: groupTasks, Title: "Tasks:"},
		&cobra.Group{ID: groupSessions, Title: "Sessions:"},
		&cobra.Group{ID: groupFiles, Title: "Files and skills:"},
		&cobra.Group{ID: groupServer, Title: "Running a server:"},
	)
	add := func(group string, cmds ...*cobra.Command) {
		for _, c := range cmds {
			c.GroupID = group
			root.AddCommand(c)
		}
	}
	add(groupTasks, runCmd(), tasksCmd(), resultCmd(), logsCmd(), cancelCmd(), execOnceCmd())
	add(groupSessions, sessionsCmd(), execCmd())
	add(groupFiles, wsCmd(), workspacesCmd(), attachmentsCmd(), skillsCmd(), toolsCmd())
	add(groupServer, serveCmd(), doctorCmd(), gcCmd(), mcpCmd(), storeCmd(), k8sCmd(), benchCmd(), notifySecretCmd(), workerCmd())
	root.AddCommand(versionCmd())
	return root
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "This binary's version and build",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), "corral", app.Version())
			return nil
		},
	}
}

// rotationSteps is how to change the notification secret without a
// delivery the host refuses.
const rotationSteps = `A new notification secret is on stdout. To rotate without a refused delivery:
  1. Write it to a new file (mode 0600). Point notify.previous_secret_file at the
     file that holds the current secret, notify.secret_file at the new one, and
     restart the server: every notification now carries a signature under each.
  2. Give the host the new secret (a Standard Webhooks receiver accepts a message
     when any of its signatures matches).
  3. Remove notify.previous_secret_file and restart.
`

// notifySecretCmd prints a new Standard Webhooks secret, and on stderr how
// to rotate to it.
func notifySecretCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "notify-secret",
		Short: "A new notification signing secret, and how to rotate to it",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), notify.NewSecret())
			fmt.Fprint(cmd.ErrOrStderr(), rotationSteps)
			return nil
		},
	}
}

// noArgs refuses any argument, as a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q", args[0])
	}
	return nil
}

// exactArgs wants n arguments, named in what for the error.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("give %s", what)
		}
		return nil
	}
}

// groupCmd is a command that only holds subcommands: alone, or with an
// argument that names none of them, it is a usage error.
func groupCmd(use, short string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			names := make([]string, 0, len(cmd.Commands()))
			for _, s := range cmd.Commands() {
				if s.IsAvailableCommand() {
					names = append(names, s.Name())
				}
			}
			if len(args) == 0 {
				return usagef("give a command: %s", strings.Join(names, ", "))
			}
			return usagef("unknown %s command %q (%s)", cmd.Name(), args[0], strings.Join(names, ", "))
		},
	}
	c.AddCommand(subs...)
	return c
}
