package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/termsafe"
)

func runCmd() *cobra.Command {
	var (
		req            service.SpawnRequest
		limits         service.ResourceRequest
		follow         bool
		labelV, attach []string
	)
	cmd := &cobra.Command{
		Use:   `run "TASK" [flags] [-- CMD ARGS...]`,
		Short: "Spawn a task (CMD runs it with the command agent)",
		Long: `Spawn a task: an agent given the description works on it in a sandbox.
With -- CMD ARGS, the command agent runs CMD instead of an AI agent.

With --follow, progress goes to stderr until the task ends, its result to
stdout, and corral exits with the task's exit code: the agent's or the
command's own when the task records one, else 1 for a failure, 124 for a
timeout, 130 for a cancel.`,
		Example: `  corral run "summarise the CSV" --context data/sales.csv --follow
  corral run "count the rows" --runtime docker --image python:3.13 -- wc -l data.csv`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 || (cmd.ArgsLenAtDash() == 0) {
				return usagef(`give the task description: corral run "what to do" [-- CMD ARGS...]`)
			}
			if d := cmd.ArgsLenAtDash(); d > 1 || (d < 0 && len(args) > 1) {
				return usagef("one task description, then the command after --: corral run \"what to do\" -- CMD ARGS...")
			}
			return nil
		},
	}
	cf := clientCmd(cmd)
	out := outputFlags(cmd, objectFormats)
	f := cmd.Flags()
	f.BoolVarP(&follow, "follow", "f", false, "show progress until the task ends, then its result; exit with the task's exit code")
	f.StringVar(&req.Agent, "agent", "", "agent: claude, gemini, codex, opencode or command (default: command with -- CMD, else the server's)")
	f.StringVar(&req.Model, "model", "", "model name for the agent")
	f.Func("timeout", "the task's time limit: minutes, or a duration such as 90m or 2h (default: the server's)", func(v string) error {
		n, err := timeoutMinutes(v)
		req.TimeoutMinutes = &n
		return err
	})
	f.StringVar(&req.Runtime, "runtime", "", "where the worker runs: "+strings.Join(rtkind.Names(), ", ")+" (default: the server's)")
	f.StringVar(&req.Image, "image", "", "the container image, for the docker and kubernetes runtimes")
	f.StringVar(&req.Workspace, "workspace", "", "a named workspace to work in (corral workspaces create NAME)")
	f.StringVar(&req.SessionID, "session", "", "a session to run every command in (claude only; an id or a unique prefix)")
	f.StringVar(&req.Network, "network", "", "the worker's network: none, allowlist (the server's egress allowlist) or open (default: the server's)")
	f.StringVar(&limits.MemoryLimit, "memory", "", "the sandbox's memory limit, e.g. 512Mi or 2Gi (default: the server's)")
	f.StringVar(&limits.CPULimit, "cpu", "", "the sandbox's CPU limit, e.g. 2 or 500m (default: the server's)")
	f.Int64Var(&limits.PidsLimit, "pids", 0, "the sandbox's process limit (default: the server's)")
	f.StringArrayVar(&labelV, "label", nil, "a label KEY=VALUE for the task (repeatable)")
	f.StringVar(&req.ConversationID, "conversation-id", "", "the conversation the task belongs to")
	f.StringVar(&req.IdempotencyKey, "idempotency-key", "", "spawning again with the same key returns the same task")
	f.StringVar(&req.FollowUpOf, "follow-up-of", "", "continue this ended task (an id or a unique prefix): its output in context/previous/, the agent's session resumed")
	f.StringArrayVar(&req.ContextFiles, "context", nil, "a file under shared/ to copy into the task's context/ (repeatable)")
	f.StringArrayVar(&attach, "attach", nil, "a local file to upload as an attachment into the task's context/ (repeatable)")
	f.StringArrayVar(&req.DocumentIDs, "document", nil, "a document id (from a search) to copy into the task's context/ (repeatable)")
	f.StringVar(&req.NoteQuery, "note-query", "", "export the notes this query finds (at most 20) into the task's context/notes/")
	f.BoolVar(&req.SaveToShared, "save-to-shared", false, "on success, copy the outputs to shared/outputs/ (and scripts to shared/scripts/), after the task's end")
	completeRuntimes(cmd)
	cmd.RegisterFlagCompletionFunc("network", cobra.FixedCompletions(networkModes, cobra.ShellCompDirectiveNoFileComp))
	cmd.RegisterFlagCompletionFunc("agent", cobra.FixedCompletions([]string{task.AgentClaude, task.AgentGemini, task.AgentCodex, task.AgentOpencode, task.AgentCommand}, cobra.ShellCompDirectiveNoFileComp))
	cmd.RegisterFlagCompletionFunc("session", completeSessions(cf))
	cmd.RegisterFlagCompletionFunc("follow-up-of", completeTasks(cf))
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx, stdout, stderr := cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr()
		format, err := out.get()
		if err != nil {
			return err
		}
		for _, l := range labelV {
			k, v, ok := strings.Cut(l, "=")
			if !ok || k == "" {
				return usagef("--label %q: want KEY=VALUE", l)
			}
			if req.Labels == nil {
				req.Labels = map[string]string{}
			}
			req.Labels[k] = v
		}
		req.TaskDescription, req.Command = args[0], args[1:]
		if limits != (service.ResourceRequest{}) {
			req.Resources = &limits
		}
		c, err := cf.client()
		if err != nil {
			return err
		}
		c.OnReconnect = reconnecting(stderr)
		if req.SessionID != "" {
			if req.SessionID, err = resolveSession(ctx, c, req.SessionID); err != nil {
				return err
			}
		}
		if req.FollowUpOf != "" {
			if req.FollowUpOf, err = resolveTask(ctx, c, req.FollowUpOf); err != nil {
				return err
			}
		}
		if len(attach) > 0 {
			atts, err := upload(ctx, c, attach)
			if err != nil {
				return err
			}
			for _, a := range atts {
				req.AttachmentIDs = append(req.AttachmentIDs, a.ID)
			}
		}
		t, existing, err := c.Spawn(ctx, req)
		if err != nil {
			return err
		}
		if !follow {
			return printAs(stdout, format, t, func() error {
				note := ""
				if existing {
					note = " (existing task for this idempotency key)"
				}
				_, err := fmt.Fprintf(stdout, "%s %s%s\n", t.ID, t.Status, note)
				return err
			})
		}
		fmt.Fprintf(stderr, "task %s queued\n", t.ID)
		err = c.Events(ctx, service.EventsRequest{TaskID: t.ID, Follow: true}, func(e eventstore.Event) error {
			progress(stderr, e)
			if e.Type == task.EventCompleted {
				return errDone
			}
			return nil
		})
		if err != nil && !errors.Is(err, errDone) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// The end came on the event stream; the result is read from the
		// server's view of the task, which may apply that event a moment
		// later: wait for it there too.
		res, err := c.Result(ctx, service.ResultRequest{TaskID: t.ID, Wait: time.Minute})
		if err != nil {
			return err
		}
		if err := printAs(stdout, format, res, func() error { return printResult(stdout, res) }); err != nil {
			return err
		}
		if code := taskExitCode(res.Task); code != 0 {
			return exitError(code)
		}
		return nil
	}
	return cmd
}

// networkModes are the values of --network.
var networkModes = []string{task.NetworkNone, task.NetworkAllowlist, task.NetworkOpen}

// taskExitCode is the exit code of corral run --follow for a task that
// ended: 0 for a success; the exit code the task records (the agent's or
// the command's), when it is one a process can exit with; else 124 for a
// timeout, 130 for a cancel and 1 for any other failure.
func taskExitCode(t task.Task) int {
	if t.Status == task.Success {
		return 0
	}
	if t.ExitCode != nil && *t.ExitCode > 0 && *t.ExitCode < 256 {
		return *t.ExitCode
	}
	switch t.Status {
	case task.Timeout:
		return exitTimeout
	case task.Cancelled:
		return exitCancelled
	}
	return exitFailure
}

var errDone = errors.New("done")

// timeoutMinutes reads --timeout: a number of minutes, or a duration in
// whole minutes.
func timeoutMinutes(v string) (int, error) {
	if n, err := strconv.Atoi(v); err == nil {
		return n, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d%time.Minute != 0 {
		return 0, errors.New("want minutes, or a duration in whole minutes such as 90m or 2h")
	}
	return int(d / time.Minute), nil
}

// progress prints one line for an event of a followed task.
func progress(w io.Writer, e eventstore.Event) {
	at := e.RecordedAt.Local().Format("15:04:05")
	switch e.Type {
	case task.EventCreated, task.EventQueued:
	case task.EventStarting:
		fmt.Fprintf(w, "%s starting sandbox\n", at)
	case task.EventStarted:
		fmt.Fprintf(w, "%s running\n", at)
	case task.EventCancelRequested:
		fmt.Fprintf(w, "%s cancel requested\n", at)
	case task.EventReattached:
		fmt.Fprintf(w, "%s server restarted; reattached to the sandbox\n", at)
	case task.EventCompleted:
		fmt.Fprintf(w, "%s ended\n", at)
	case task.EventProgress:
		var p task.Progress
		if json.Unmarshal(e.Data, &p) == nil {
			fmt.Fprintf(w, "%s %s\n", at, oneLine(p.Line(), 160))
			return
		}
		fmt.Fprintf(w, "%s progress %s\n", at, oneLine(string(e.Data), 120))
	default:
		fmt.Fprintf(w, "%s %s %s\n", at, termsafe.Line(e.Type), oneLine(string(e.Data), 120))
	}
}

// printResult prints a task's result with every text the worker chose
// escaped for the terminal (termsafe).
func printResult(w io.Writer, res service.Result) error {
	fmt.Fprintf(w, "task:     %s\nstatus:   %s\n", res.ID, res.Status)
	if res.DurationMS != nil {
		fmt.Fprintf(w, "duration: %.2fs\n", float64(*res.DurationMS)/1000)
	}
	if res.ExitCode != nil {
		fmt.Fprintf(w, "exit:     %d\n", *res.ExitCode)
	}
	if res.ErrorMessage != "" {
		fmt.Fprintf(w, "error:    %s\n", termsafe.Line(res.ErrorMessage))
	}
	if len(res.OutputFiles) > 0 {
		fmt.Fprintln(w, "output:")
		for _, f := range res.OutputFiles {
			fmt.Fprintf(w, "  %-30s %8d  %s\n", termsafe.Name(f.Name), f.Size, termsafe.Line(f.Type))
		}
	}
	if c := res.Changes; c != nil {
		fmt.Fprintln(w, "changes:")
		for _, l := range []struct {
			mark  string
			names []string
		}{{"A", c.Added}, {"M", c.Modified}, {"D", c.Deleted}} {
			for _, n := range l.names {
				fmt.Fprintf(w, "  %s %s\n", l.mark, termsafe.Name(n))
			}
		}
		for _, cm := range c.Commits {
			fmt.Fprintf(w, "  commit %s %s\n", termsafe.Line(cm.Hash), termsafe.Line(cm.Subject))
		}
		if c.Truncated {
			fmt.Fprintln(w, "  (more than the result holds)")
		}
	}
	if res.Summary != "" {
		fmt.Fprintf(w, "summary:\n%s\n", indent(termsafe.Text(res.Summary)))
	}
	for _, name := range slices.Sorted(maps.Keys(res.FileContents)) {
		fmt.Fprintf(w, "--- %s ---\n%s\n", termsafe.Name(name), termsafe.Text(res.FileContents[name].Content))
	}
	return nil
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n  ")
}

// tasksLister prints tasks.
var tasksLister = lister[task.Task]{
	kind:   "task",
	header: []string{"TASK", "STATUS", "AGENT", "CREATED", "DESCRIPTION", "RUNTIME", "EXIT", "DURATION", "WORKSPACE", "CONVERSATION"},
	narrow: 5,
	row: func(t task.Task) []string {
		exit, dur := "", ""
		if t.ExitCode != nil {
			exit = strconv.Itoa(*t.ExitCode)
		}
		if t.DurationMS != nil {
			dur = (time.Duration(*t.DurationMS) * time.Millisecond).Round(time.Second / 10).String()
		}
		return []string{t.ID, string(t.Status), t.Agent, t.CreatedAt.Local().Format(time.DateTime), oneLine(t.Description, 50),
			t.Runtime, exit, dur, cell(t.Workspace), termsafe.Line(t.ConversationID)}
	},
	id:      func(t task.Task) string { return t.ID },
	version: func(t task.Task) string { return strconv.FormatInt(t.Version, 10) },
}

// tasksCmd is corral tasks: the list, and tasks get ID.
func tasksCmd() *cobra.Command {
	var req service.ListRequest
	cmd := &cobra.Command{
		Use:     "tasks",
		Aliases: []string{"task"},
		Short:   "List tasks, newest first (tasks get ID: one task)",
		Args:    cobra.NoArgs,
	}
	cf := clientCmd(cmd)
	lf := addListFlags(cmd, true)
	f := cmd.Flags()
	f.StringVar(&req.Status, "status", "", "only tasks in this status")
	f.StringVar(&req.ConversationID, "conversation-id", "", "only tasks of this conversation")
	f.StringVar(&req.ConversationID, "conversation", "", "same as --conversation-id")
	f.MarkDeprecated("conversation", "use --conversation-id")
	f.StringVar(&req.Workspace, "workspace", "", "only tasks in this named workspace")
	f.IntVar(&req.Limit, "limit", 20, "at most this many")
	f.StringVar(&req.Cursor, "cursor", "", "next_cursor of the previous page")
	cmd.RegisterFlagCompletionFunc("status", cobra.FixedCompletions([]string{
		string(task.Pending), string(task.Queued), string(task.Starting), string(task.Running),
		string(task.Success), string(task.Failed), string(task.Timeout), string(task.Cancelled)}, cobra.ShellCompDirectiveNoFileComp))
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		ctx, stdout := cmd.Context(), cmd.OutOrStdout()
		page, err := c.List(ctx, req)
		if err != nil {
			return err
		}
		if page.NextCursor != "" && !lf.watch {
			// On stderr, where it does not break a pipe of ids or rows.
			fmt.Fprintf(cmd.ErrOrStderr(), "more: corral tasks --cursor %s\n", page.NextCursor)
		}
		return tasksLister.run(ctx, stdout, lf, page, page.Tasks, func() ([]task.Task, error) {
			page, err := c.List(ctx, req)
			return page.Tasks, err
		})
	}
	cmd.AddCommand(taskGetCmd())
	return cmd
}

func taskGetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "One task as the server records it (result ID: its result)",
		Args:  exactArgs(1, "one task id"),
	}
	cf := clientCmd(cmd)
	out := outputFlags(cmd, listFormats)
	cmd.ValidArgsFunction = firstArg(completeTasks(cf))
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		id, err := resolveTask(cmd.Context(), c, args[0])
		if err != nil {
			return err
		}
		t, err := c.Get(cmd.Context(), id)
		if err != nil {
			return err
		}
		format, err := out.get()
		if err != nil {
			return err
		}
		return tasksLister.get(cmd.OutOrStdout(), format, t)
	}
	return cmd
}

// taskIDCmd is a command that takes one task id, which it resolves
// before calling fn.
func taskIDCmd(use, short string, formats []string, setup func(*cobra.Command), fn func(cmd *cobra.Command, c *httpapi.Client, id string, out *output) error) *cobra.Command {
	cmd := &cobra.Command{Use: use, Short: short, Args: exactArgs(1, "one task id")}
	cf := clientCmd(cmd)
	var out *output
	if formats != nil {
		out = outputFlags(cmd, formats)
	}
	if setup != nil {
		setup(cmd)
	}
	cmd.ValidArgsFunction = firstArg(completeTasks(cf))
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		c.OnReconnect = reconnecting(cmd.ErrOrStderr())
		id, err := resolveTask(cmd.Context(), c, args[0])
		if err != nil {
			return err
		}
		return fn(cmd, c, id, out)
	}
	return cmd
}

func resultCmd() *cobra.Command {
	var (
		wait  time.Duration
		files []string
	)
	return taskIDCmd("result ID", "Show a task's result", objectFormats, func(cmd *cobra.Command) {
		cmd.Flags().DurationVar(&wait, "wait", 0, "wait up to this long for the task to end")
		cmd.Flags().StringArrayVar(&files, "file", nil, "include this output file's content, control characters shown escaped (repeatable; -o json has the exact text)")
	}, func(cmd *cobra.Command, c *httpapi.Client, id string, out *output) error {
		res, err := c.Result(cmd.Context(), service.ResultRequest{TaskID: id, Wait: wait, IncludeFileContents: files})
		if err != nil {
			return err
		}
		return out.print(cmd.OutOrStdout(), res, func() error { return printResult(cmd.OutOrStdout(), res) })
	})
}

func logsCmd() *cobra.Command {
	var (
		follow bool
		stream string
	)
	return taskIDCmd("logs ID", "Show (and follow) a task's transcript", nil, func(cmd *cobra.Command) {
		cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the transcript until the task ends")
		cmd.Flags().StringVar(&stream, "stream", "agent", "agent (the transcript) or stderr; control characters but newline and tab are shown escaped")
		cmd.RegisterFlagCompletionFunc("stream", cobra.FixedCompletions([]string{"agent", "stderr"}, cobra.ShellCompDirectiveNoFileComp))
	}, func(cmd *cobra.Command, c *httpapi.Client, id string, _ *output) error {
		w := termsafe.NewWriter(cmd.OutOrStdout())
		err := c.Logs(cmd.Context(), service.LogsRequest{TaskID: id, Follow: follow, Stream: stream}, w)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		return err
	})
}

func cancelCmd() *cobra.Command {
	return taskIDCmd("cancel ID", "Cancel a task", objectFormats, nil, func(cmd *cobra.Command, c *httpapi.Client, id string, out *output) error {
		t, err := c.Cancel(cmd.Context(), id)
		if err != nil {
			return err
		}
		return out.print(cmd.OutOrStdout(), t, func() error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", t.ID, t.Status)
			return err
		})
	})
}
