// Command corral is Corral's one binary: the server (corral serve), the CLI
// client for people and scripts, the MCP server, and the entrypoint that
// runs inside every sandbox (corral worker run-task).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/corral-dev/corral/internal/app"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/termsafe"
)

const usage = `corral — hand tasks to AI coding agents in sandboxes

Usage:
  corral serve [--config FILE] [--listen ADDR] [--data DIR]   run the server
  corral run "task" [--follow] [--agent NAME] [--context FILE] [--attach FILE] [-- CMD ARGS...]
                                                   spawn a task (CMD runs it with the command agent)
  corral tasks [--status S] [--limit N]            list tasks
  corral result ID [--wait 30s]                    show a task's result
  corral logs [-f] ID                              show (and follow) a task's transcript
  corral cancel ID                                 cancel a task
  corral ws ls [PATH] | cat PATH | put PATH [FILE] the shared workspace
  corral skills [ls] | show NAME | create ...      the skills in shared/skills/ (create --help for more)
  corral tools                                     the tool catalogue as function definitions
  corral attachments get ID [-o FILE] | put FILE...  download or upload attachments
  corral gc [--dry-run]                            remove ended tasks' directories and unused attachments past retention
  corral mcp [--server URL]                        the tools over MCP on stdio (starts a server if none runs)
  corral doctor                                    what works on this machine, and what is missing
  corral bench [--n N] [--concurrency C]           measure task overhead against bare bubblewrap
  corral version                                   this binary's version and build
  corral worker run-task ...                       (inside a sandbox) run one task's agent

Client commands reach the server at --server (default: http://LISTEN from the
configuration) with the token in CORRAL_API_TOKEN; --json prints JSON.

What a worker wrote (summaries, errors, file names and contents, logs,
progress) is printed with control characters and escape sequences shown
escaped (\x1b, \u009b) and odd names quoted, so that it cannot act on the
terminal. ws cat and attachments get -o - write a file's exact bytes to a
pipe or a file, and escape them only when stdout is a terminal.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches a subcommand and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmds := map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"serve":       cmdServe,
		"run":         cmdRun,
		"tasks":       cmdTasks,
		"result":      cmdResult,
		"logs":        cmdLogs,
		"cancel":      cmdCancel,
		"ws":          cmdWorkspace,
		"tools":       cmdTools,
		"doctor":      cmdDoctor,
		"bench":       cmdBench,
		"worker":      cmdWorker,
		"mcp":         cmdMCP,
		"skills":      cmdSkills,
		"attachments": cmdAttachments,
		"gc":          cmdGC,
		"version":     cmdVersion,
	}
	f, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "corral: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	err := f(ctx, args[1:], stdout, stderr)
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return int(ee)
	case errors.Is(err, errdefs.ErrInvalidArgument):
		fmt.Fprintf(stderr, "corral %s: %s\n", args[0], termsafe.Text(err.Error()))
		return 2
	default:
		fmt.Fprintf(stderr, "corral %s: %s\n", args[0], termsafe.Text(err.Error()))
		return 1
	}
}

// flagError is how a command ends when its flags do not parse: 0 after -h
// or --help (the flag set has printed its usage), else 2.
func flagError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return exitError(0)
	}
	return exitError(2)
}

// exitError ends the process with a code and no message.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit %d", int(e)) }

func cmdVersion(_ context.Context, args []string, stdout, _ io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("version takes no arguments: %w", errdefs.ErrInvalidArgument)
	}
	fmt.Fprintln(stdout, "corral", app.Version())
	return nil
}
