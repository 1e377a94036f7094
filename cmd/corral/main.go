// Command corral is Corral's binary: the server (corral serve), the CLI
// client for people and scripts, the MCP server, and the worker's
// entrypoint (corral worker run-task), which sandboxes run from
// corral-worker, built from the same code without the rest.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"syscall"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/notify"
	"github.com/corral-dev/corral/internal/termsafe"
	"github.com/corral-dev/corral/internal/version"
)

const usage = `corral — hand tasks to AI coding agents in sandboxes

Usage:
  corral serve [--config FILE] [--listen ADDR] [--data DIR] [--runtime R] [--max-concurrent N]
                                                   run the server
  corral run "task" [--follow] [--agent NAME] [--model M] [--context FILE]... [--attach FILE]...
             [--runtime R] [--image IMAGE] [--network none|allowlist|open] [--workspace NAME] [--session ID]
             [--memory 2Gi] [--cpu 2] [--pids N] [--timeout 30m] [--label KEY=VALUE]...
             [--conversation-id ID] [--document ID]... [--note-query Q] [-- CMD ARGS...]
                                                   spawn a task (CMD runs it with the command agent;
                                                   run --help for every flag)
  corral exec-once [--image IMAGE] [--runtime R] [--timeout SECONDS] [--network] [--attach ID]... -- CMD...
                                                   run a command once in a fresh sandbox (code_execute)
                                                   and print its output; output files become attachments
  corral workspaces [ls] | ls NAME [PATH] | create NAME [--git] | cat NAME PATH
                                                   the named workspaces under projects/
  corral sessions [ls] | create [--runtime R] [--image IMAGE] [--idle 30m] | rm ID | suspend ID | resume ID | fork ID [-n N]
                                                   long-lived sandboxes (create prints the session's token)
  corral exec [-i] [--cwd DIR] [--timeout D] SESSION -- CMD ARGS...
                                                   run a command in a session, its output streamed
  corral tasks [--status S] [--limit N] [--conversation-id ID]
                                                   list tasks
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
  corral store copy --to postgres|sqlite [--config FILE] [--data DIR]
                                                   copy the event log from the data root's corral.db into
                                                   PostgreSQL (store.dsn_file), or back, checked event for
                                                   event; with the server stopped
  corral k8s render [--config FILE] [--server-image IMG] [--storage 10Gi] [--storage-class NAME] [--no-secrets]
                                                   the manifests that run the server and its workers in a
                                                   Kubernetes cluster, on stdout (what to edit is at the top)
  corral bench [--n N] [--concurrency C]           measure task overhead against bare bubblewrap
  corral version                                   this binary's version and build
  corral notify-secret                             a new notification signing secret, and how to rotate to it
  corral worker run-task ...                       (inside a sandbox) run one task's agent

Client commands (all but serve, mcp, doctor, store, bench, k8s and worker) take
--server, --config and --json: they reach the server at --server (default:
http://LISTEN from the configuration) with the token in CORRAL_API_TOKEN; --json
prints JSON. The server's own flags (--listen, --data, --runtime,
--max-concurrent) are serve's (store copy takes --data too); a task's runtime,
network and limits are run's. run --follow and logs -f outlive a restart of the
server: they reconnect and go on where they were, for up to 2 minutes without a
server.

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
	if len(args) == 0 || isHelp(args[0]) || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmds := map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"serve":         cmdServe,
		"run":           cmdRun,
		"exec-once":     cmdExecOnce,
		"sessions":      cmdSessions,
		"workspaces":    cmdWorkspaces,
		"exec":          cmdExec,
		"tasks":         cmdTasks,
		"result":        cmdResult,
		"logs":          cmdLogs,
		"cancel":        cmdCancel,
		"ws":            cmdWorkspace,
		"tools":         cmdTools,
		"doctor":        cmdDoctor,
		"bench":         cmdBench,
		"worker":        cmdWorker,
		"mcp":           cmdMCP,
		"skills":        cmdSkills,
		"attachments":   cmdAttachments,
		"gc":            cmdGC,
		"store":         cmdStore,
		"k8s":           cmdK8s,
		"version":       cmdVersion,
		"notify-secret": cmdNotifySecret,
	}
	f, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "corral: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	err := f(ctx, args[1:], stdout, stderr)
	var ee exitError
	if err == nil {
		return 0
	}
	if errors.As(err, &ee) {
		return int(ee)
	}
	fmt.Fprintf(stderr, "corral %s: %s\n", args[0], termsafe.Text(errdefs.Message(err)))
	if errors.Is(err, httpapi.ErrNoServer) {
		fmt.Fprintln(stderr, "start one with `corral serve` (from a checkout, ./scripts/quickstart.sh builds and starts one), or give another's URL with --server")
	}
	if errors.Is(err, errdefs.ErrInvalidArgument) {
		return 2
	}
	return 1
}

// flagError is how a command ends when its flags do not parse: 0 after -h
// or --help (the flag set has printed its usage), else 2.
func flagError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return exitError(0)
	}
	return exitError(2)
}

// parseNoArgs parses args into fs for a command that takes flags only:
// a bad flag or -h ends it as flagError says, and any argument left over
// is refused.
func parseNoArgs(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: %w", fs.Arg(0), errdefs.ErrInvalidArgument)
	}
	return nil
}

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

// exitError ends the process with a code and no message.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit %d", int(e)) }

func cmdVersion(_ context.Context, args []string, stdout, _ io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("version takes no arguments: %w", errdefs.ErrInvalidArgument)
	}
	fmt.Fprintln(stdout, "corral", version.String())
	return nil
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

// cmdNotifySecret prints a new Standard Webhooks secret, and on stderr how
// to rotate to it.
func cmdNotifySecret(_ context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("notify-secret takes no arguments: %w", errdefs.ErrInvalidArgument)
	}
	fmt.Fprintln(stdout, notify.NewSecret())
	fmt.Fprint(stderr, rotationSteps)
	return nil
}

// isHelp reports whether arg asks for a command's usage.
func isHelp(arg string) bool { return arg == "-h" || arg == "--help" }
