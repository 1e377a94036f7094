package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/strictjson"
)

func codeExecute(tasks service.Tasks) Tool {
	return Tool{
		Name: "code_execute",
		Description: `Run a shell command once in a fresh, isolated sandbox and get its output back: stdout, stderr,
the exit code, and the files it wrote to /workspace/output/ as attachments you can download or pass on.

The command runs with sh -c in /workspace (or working_dir), where:
- /workspace/input/ holds the attachments and context files you name (read-only)
- /workspace/output/ is collected when the command ends
- /workspace/shared/ is the persistent shared workspace (read-only)
There is no network unless network is true, and then only what the server allows.
It waits for the end (at most timeout_seconds) and is recorded as a task of kind exec.`,
		Schema: withRuntimes(fmt.Sprintf(execSchema, service.MaxExecTimeout)),
		Call:   decoded(tasks, service.Tasks.Execute),
	}
}

const execSchema = `{"type":"object","properties":{
"command":{"type":"string","description":"Shell command, run with sh -c."},
"image":{"type":"string","description":"Image to run in (docker and kubernetes runtimes; must match the server's allowed images). Default: the server's execution.default_image."},
"working_dir":{"type":"string","description":"Absolute directory inside the sandbox to start in. Default /workspace."},
"timeout_seconds":{"type":"integer","minimum":1,"maximum":%d,"description":"Wall-clock limit. Default: the server's execution.timeout (60)."},
"network":{"type":"boolean","default":false,"description":"Give the command the server's egress policy (its allowlist by default)."},
"attachment_ids":{"type":"array","items":{"type":"string"},"description":"Attachments to place in /workspace/input/."},
"context_files":{"type":"array","items":{"type":"string"},"description":"Paths in the shared workspace to copy into /workspace/input/."},
"runtime":{"type":"string","enum":RUNTIMES,"description":"Sandbox runtime. Default: the server's."},
"conversation_id":{"type":"string","description":"The conversation this call belongs to."},
"labels":{"type":"object","additionalProperties":{"type":"string"},"description":"Labels recorded with the call."}},
"required":["command"],"additionalProperties":false}`

func workspaceExec(sessions service.Sessions) Tool {
	return Tool{
		Name: "workspace_exec",
		Description: `Run a shell command (sh -c) in a running session: a long-lived sandbox on the image the session
was created with, whose files stay between commands. Returns the exit code and the output (each stream
cut at 1 MiB, and said so); over MCP the output also arrives as progress notifications while it runs.
Commands start in /workspace/session (the session's own directory) unless cwd says otherwise.`,
		Schema: json.RawMessage(`{"type":"object","properties":{
"session_id":{"type":"string","description":"The session to run in (POST /api/sessions)."},
"command":{"type":"string","description":"Shell command, run with sh -c."},
"cwd":{"type":"string","description":"Absolute directory inside the session. Default /workspace/session."},
"timeout_seconds":{"type":"integer","minimum":0,"maximum":86400,"description":"Stop the command after this long (exit code 124); 0: no limit but the session's."}},
"required":["session_id","command"],"additionalProperties":false}`),
		Call: func(ctx context.Context, args json.RawMessage) (any, error) {
			var req service.SessionExecRequest
			if err := strictjson.Decode(args, &req); err != nil {
				return nil, err
			}
			if sessions == nil {
				return nil, service.ErrSessionsOff
			}
			return sessions.ExecBounded(ctx, req, service.MaxSessionExecOutput, outputFrom(ctx))
		},
	}
}

// The tools that suspend, resume and fork a session, as the HTTP API's
// routes and the CLI's sessions suspend|resume|fork do.

const sessionIDSchema = `"session_id":{"type":"string","description":"The session (POST /api/sessions)."}`

func suspendSession(sessions service.Sessions) Tool {
	return sessionOp(sessions, "suspend_session", `Suspend a running session: its sandbox stops, holding no memory or processes on the host, and its
files, image, network policy and token are kept. Where its runtime keeps memory (gvisor; docker under
runsc) resume_session brings its processes back as they were, running commands going on; elsewhere
only its files come back. The answer's memory_kept and note say which. A command (workspace_exec) on a
suspended session resumes it first.`, func(ctx context.Context, id string) (any, error) { return sessions.Suspend(ctx, id) })
}

func resumeSession(sessions service.Sessions) Tool {
	return sessionOp(sessions, "resume_session", "Resume a suspended session: its sandbox starts again on its files, restored with its memory and processes where the suspend kept them. Answers the session once it runs; a running session is answered as it is.",
		func(ctx context.Context, id string) (any, error) { return sessions.Resume(ctx, id) })
}

// sessionOp is a tool that takes a session's id alone and answers what op
// does to that session.
func sessionOp(sessions service.Sessions, name, description string, op func(ctx context.Context, id string) (any, error)) Tool {
	return Tool{
		Name:        name,
		Description: description,
		Schema:      json.RawMessage(`{"type":"object","properties":{` + sessionIDSchema + `},"required":["session_id"],"additionalProperties":false}`),
		Call: func(ctx context.Context, args json.RawMessage) (any, error) {
			var req service.SessionRequest
			if err := decodeSessionArgs(args, &req, sessions); err != nil {
				return nil, err
			}
			return op(ctx, req.SessionID)
		},
	}
}

func forkSession(sessions service.Sessions) Tool {
	return Tool{
		Name: "fork_session",
		Description: `Make new sessions from a running or suspended one: each with its own id, token (in the answer, shown
once), directory and network proxy, starting from a copy of the source's files and, on gvisor, its
memory and processes (its running commands going on in each fork; the source pauses for the snapshot
only). The answer's memory_kept and note say which.`,
		Schema: json.RawMessage(`{"type":"object","properties":{` + sessionIDSchema + `,
"count":{"type":"integer","minimum":1,"maximum":16,"default":1,"description":"How many sessions to make."}},"required":["session_id"],"additionalProperties":false}`),
		Call: func(ctx context.Context, args json.RawMessage) (any, error) {
			var req service.ForkSessionRequest
			if err := decodeSessionArgs(args, &req, sessions); err != nil {
				return nil, err
			}
			if req.Count == 0 {
				req.Count = 1
			}
			return sessions.Fork(ctx, req.SessionID, req.Count)
		},
	}
}

// decodeSessionArgs decodes a session tool's arguments into req.
func decodeSessionArgs(args json.RawMessage, req any, sessions service.Sessions) error {
	if err := strictjson.Decode(args, req); err != nil {
		return err
	}
	if sessions == nil {
		return service.ErrSessionsOff
	}
	return nil
}

type outputKey struct{}

// WithOutput returns ctx carrying fn, which a tool that runs a command
// calls with each chunk of its output as it comes (the MCP server sends
// them as progress notifications).
func WithOutput(ctx context.Context, fn func(stream string, data []byte)) context.Context {
	return context.WithValue(ctx, outputKey{}, fn)
}

func outputFrom(ctx context.Context) func(string, []byte) {
	fn, _ := ctx.Value(outputKey{}).(func(string, []byte))
	return fn
}

// NewSession returns the catalogue an agent working through session id
// gets: workspace_exec alone, bound to that session (its schema has no
// session_id).
func NewSession(sessions service.Sessions, id string) *Catalogue {
	t := workspaceExec(sessions)
	t.Effect = Runs
	t.Schema = json.RawMessage(`{"type":"object","properties":{
"command":{"type":"string","description":"Shell command, run with sh -c in the session."},
"cwd":{"type":"string","description":"Absolute directory inside the session. Default /workspace/session."},
"timeout_seconds":{"type":"integer","minimum":0,"maximum":86400,"description":"Stop the command after this long (exit code 124)."}},
"required":["command"],"additionalProperties":false}`)
	t.Description = "Run a shell command (sh -c) in the session this task works in: every command runs there, in the session's image, and its files stay between commands. Returns the exit code and the output."
	call := t.Call
	t.Call = func(ctx context.Context, args json.RawMessage) (any, error) {
		var req service.SessionExecRequest
		if err := strictjson.Decode(args, &req); err != nil {
			return nil, err
		}
		if req.SessionID != "" {
			return nil, errdefs.Field("session_id", "is set by the session this task works in")
		}
		req.SessionID = id
		b, _ := json.Marshal(req)
		return call(ctx, b)
	}
	return &Catalogue{tools: []Tool{t}, index: map[string]int{t.Name: 0}}
}

func spawnWorkspaceTask(svc service.Set) Tool {
	return Tool{
		Name: "spawn_workspace_task",
		Description: `Spawn a background AI task in a named workspace: a project directory that outlives the task, created
if it does not exist (with a git repository when init_git is true). The agent works in the workspace as
its working directory; its conversation is kept with the workspace, so the next task there continues it.
Tasks on one workspace run one after another. Use read_task_result(task_id) for the outcome.`,
		Schema: withRuntimes(`{"type":"object","properties":{
"workspace_path":{"type":"string","description":"The workspace: a name (lowercase letters, digits, '.', '_' and '-'), or /workspace/projects/NAME. Will be created if it does not exist."},
"task_description":{"type":"string","description":"Brief human-readable description of the task"},
"query":{"type":"string","description":"The detailed prompt/instructions for the workspace task"},
"context":{"type":"string","description":"Additional context from the current conversation"},
"init_git":{"type":"boolean","description":"If creating a new directory, initialize a git repository. Default: false"},
"agent":{"type":"string","enum":["claude","gemini","codex","opencode","command"],"description":"The agent. Default: the server's."},
"model":{"type":"string","description":"The model the agent uses."},
"command":{"type":"array","items":{"type":"string"},"description":"For the command agent: the argv to run in the workspace."},
"timeout_minutes":{"type":"integer","minimum":1,"description":"Wall-clock limit."},
"runtime":{"type":"string","enum":RUNTIMES,"description":"Sandbox runtime."},
"image":{"type":"string","description":"Image (docker)."},
"network":{"type":"string","enum":["none","allowlist","open"],"description":"Network policy."},
"conversation_id":{"type":"string","description":"The conversation to report back to."},
"labels":{"type":"object","additionalProperties":{"type":"string"},"description":"Labels recorded with the task."},
"origin_workspace":{"type":"string","description":"The workspace this conversation works in, recorded with the report."},
"origin_conversation":{"type":"string","description":"The conversation the task's end is reported to (default conversation_id): a workspace_task_completed or workspace_task_failed event on its stream."}},
"required":["workspace_path","task_description","query"],"additionalProperties":false}`),
		Call: func(ctx context.Context, args json.RawMessage) (any, error) {
			var req service.WorkspaceTaskRequest
			if err := strictjson.Decode(args, &req); err != nil {
				return nil, err
			}
			created := false
			if _, err := svc.Library.CreateProject(ctx, service.CreateProjectRequest{Name: req.WorkspacePath, InitGit: req.InitGit}); err == nil {
				created = true
			} else if !errors.Is(err, errdefs.ErrAlreadyExists) {
				return nil, err
			}
			t, _, err := svc.Tasks.Spawn(ctx, req.Spawn())
			if err != nil {
				return nil, err
			}
			return map[string]any{"task_id": t.ID, "status": t.Status, "workspace": t.Workspace, "workspace_created": created}, nil
		},
	}
}
