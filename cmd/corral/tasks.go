package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/termsafe"
)

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, cf := clientFlagSet("run", stderr)
	var req service.SpawnRequest
	var contexts stringList
	follow := fs.Bool("follow", false, "show progress until the task ends, then its result")
	fs.BoolVar(follow, "f", false, "short for --follow")
	fs.StringVar(&req.Agent, "agent", "", "agent: claude, gemini, codex, opencode or command (default: command with -- CMD, else the server's)")
	fs.StringVar(&req.Model, "model", "", "model name for the agent")
	fs.Func("timeout", "the task's time limit: minutes, or a duration such as 90m or 2h (default: the server's)", func(v string) error {
		n, err := timeoutMinutes(v)
		req.TimeoutMinutes = &n
		return err
	})
	fs.StringVar(&req.Runtime, "runtime", "", "where the worker runs: local, gvisor, docker or kubernetes (default: the server's)")
	fs.StringVar(&req.Image, "image", "", "the container image, for the docker and kubernetes runtimes")
	fs.StringVar(&req.Workspace, "workspace", "", "a named workspace to work in (corral workspaces create NAME)")
	fs.StringVar(&req.SessionID, "session", "", "a session to run every command in (claude only)")
	fs.StringVar(&req.Network, "network", "", "the worker's network: none, allowlist (the server's egress allowlist) or open (default: the server's)")
	var limits service.ResourceRequest
	fs.StringVar(&limits.MemoryLimit, "memory", "", "the sandbox's memory limit, e.g. 512Mi or 2Gi (default: the server's)")
	fs.StringVar(&limits.CPULimit, "cpu", "", "the sandbox's CPU limit, e.g. 2 or 500m (default: the server's)")
	fs.Int64Var(&limits.PidsLimit, "pids", 0, "the sandbox's process limit (default: the server's)")
	labels := map[string]string{}
	fs.Func("label", "a label KEY=VALUE for the task (repeatable)", func(v string) error {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return errors.New("want KEY=VALUE")
		}
		labels[k] = val
		return nil
	})
	fs.StringVar(&req.ConversationID, "conversation-id", "", "the conversation the task belongs to")
	fs.StringVar(&req.IdempotencyKey, "idempotency-key", "", "spawning again with the same key returns the same task")
	fs.StringVar(&req.FollowUpOf, "follow-up-of", "", "continue this ended task: its output in context/previous/, the agent's session resumed")
	fs.Var(&contexts, "context", "a file under shared/ to copy into the task's context/ (repeatable)")
	var attach, docs stringList
	fs.Var(&attach, "attach", "a local file to upload as an attachment into the task's context/ (repeatable)")
	fs.Var(&docs, "document", "a document id (from a search) to copy into the task's context/ (repeatable)")
	fs.StringVar(&req.NoteQuery, "note-query", "", "export the notes this query finds (at most 20) into the task's context/notes/")
	fs.BoolVar(&req.SaveToShared, "save-to-shared", false, "on success, copy the outputs to shared/outputs/ (and scripts to shared/scripts/), after the task's end")
	pos, err := parse(fs, args)
	if err != nil {
		return flagError(err)
	}
	if len(pos) == 0 {
		return fmt.Errorf("give the task description: corral run \"what to do\" [-- CMD ARGS...]: %w", errdefs.ErrInvalidArgument)
	}
	req.TaskDescription, req.Command, req.ContextFiles, req.DocumentIDs = pos[0], pos[1:], contexts, docs
	if limits != (service.ResourceRequest{}) {
		req.Resources = &limits
	}
	if len(labels) > 0 {
		req.Labels = labels
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	c.OnReconnect = reconnecting(stderr)
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
	if !*follow {
		if cf.json {
			return printJSON(stdout, t)
		}
		note := ""
		if existing {
			note = " (existing task for this idempotency key)"
		}
		fmt.Fprintf(stdout, "%s %s%s\n", t.ID, t.Status, note)
		return nil
	}
	if !cf.json {
		fmt.Fprintf(stderr, "task %s queued\n", t.ID)
	}
	err = c.Events(ctx, service.EventsRequest{TaskID: t.ID, Follow: true}, func(e eventstore.Event) error {
		if !cf.json {
			progress(stderr, e)
		}
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
	if err := printResult(stdout, res, cf.json); err != nil {
		return err
	}
	if res.Status != task.Success {
		return exitError(1)
	}
	return nil
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
// escaped for the terminal (termsafe); as JSON, in JSON's own notation.
func printResult(w io.Writer, res service.Result, asJSON bool) error {
	if asJSON {
		return printJSON(w, res)
	}
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

func cmdTasks(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, cf := clientFlagSet("tasks", stderr)
	var req service.ListRequest
	fs.StringVar(&req.Status, "status", "", "only tasks in this status")
	fs.StringVar(&req.ConversationID, "conversation-id", "", "only tasks of this conversation")
	fs.StringVar(&req.ConversationID, "conversation", "", "same as --conversation-id")
	fs.IntVar(&req.Limit, "limit", 20, "at most this many")
	fs.StringVar(&req.Cursor, "cursor", "", "next_cursor of the previous page")
	if _, err := parse(fs, args); err != nil {
		return flagError(err)
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	page, err := c.List(ctx, req)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(stdout, page)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tSTATUS\tAGENT\tCREATED\tDESCRIPTION")
	for _, t := range page.Tasks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.ID, t.Status, t.Agent, t.CreatedAt.Local().Format(time.DateTime), oneLine(t.Description, 50))
	}
	tw.Flush()
	if page.NextCursor != "" {
		fmt.Fprintf(stdout, "more: corral tasks --cursor %s\n", page.NextCursor)
	}
	return nil
}

func cmdResult(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, cf := clientFlagSet("result", stderr)
	wait := fs.Duration("wait", 0, "wait up to this long for the task to end")
	var files stringList
	fs.Var(&files, "file", "include this output file's content, control characters shown escaped (repeatable; --json has the exact text)")
	id, c, err := cf.parseTaskID(fs, args)
	if err != nil {
		return err
	}
	res, err := c.Result(ctx, service.ResultRequest{TaskID: id, Wait: *wait, IncludeFileContents: files})
	if err != nil {
		return err
	}
	return printResult(stdout, res, cf.json)
}

func cmdLogs(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, cf := clientFlagSet("logs", stderr)
	follow := fs.Bool("f", false, "follow the transcript until the task ends")
	fs.BoolVar(follow, "follow", false, "same as -f")
	stream := fs.String("stream", "agent", "agent (the transcript) or stderr; control characters but newline and tab are shown escaped")
	id, c, err := cf.parseTaskID(fs, args)
	if err != nil {
		return err
	}
	c.OnReconnect = reconnecting(stderr)
	out := termsafe.NewWriter(stdout)
	err = c.Logs(ctx, service.LogsRequest{TaskID: id, Follow: *follow, Stream: *stream}, out)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

func cmdCancel(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, cf := clientFlagSet("cancel", stderr)
	id, c, err := cf.parseTaskID(fs, args)
	if err != nil {
		return err
	}
	t, err := c.Cancel(ctx, id)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(stdout, t)
	}
	fmt.Fprintf(stdout, "%s %s\n", t.ID, t.Status)
	return nil
}
