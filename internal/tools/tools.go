// Package tools is Corral's tool catalogue: every tool's name, description,
// JSON schema and handler, shared by the MCP server and the HTTP function
// API (GET /api/tools, POST /api/tools/{name}). Names, parameters and
// defaults follow the seeds (seed 000 "New Tools"), plus Corral's own
// spawn_worker fields (SPEC §2). A tool joins the catalogue when it works.
package tools

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/strictjson"
	"github.com/corral-dev/corral/internal/workspace"
)

// Tool is one callable tool.
type Tool struct {
	Name        string
	Description string
	// Effect says what calling the tool does: reads, writes or runs code
	// (MCP annotations, GET /api/tools).
	Effect Effect
	// Schema is the JSON schema of the arguments object.
	Schema json.RawMessage
	// Call runs the tool with its JSON arguments.
	Call func(ctx context.Context, args json.RawMessage) (any, error)
}

// Effect is what a tool does to the world.
type Effect string

// Effects. Reads changes nothing; Writes changes Corral's state (files,
// attachments, documents, a task's cancellation); Runs runs code in a
// sandbox, which may reach the network the server allows.
const (
	Reads  Effect = "reads"
	Writes Effect = "writes"
	Runs   Effect = "runs"
)

// effects are the tools' Effects by name; every tool has one (tested).
var effects = map[string]Effect{
	"spawn_worker": Runs, "code_execute": Runs, "workspace_exec": Runs, "spawn_workspace_task": Runs,
	"resume_session": Runs, "fork_session": Runs, "suspend_session": Writes,
	"read_task_result": Reads, "list_worker_tasks": Reads, "read_workspace": Reads, "list_workspace": Reads,
	"search_documents": Reads, "list_skills": Reads, "get_skill": Reads,
	"cancel_worker_task": Writes, "write_workspace": Writes, "create_attachment_from_workspace": Writes,
	"ingest_from_workspace": Writes, "export_notes_to_workspace": Writes, "create_skill": Writes,
}

// Catalogue is the list of tools over one Service.
type Catalogue struct {
	tools []Tool
	index map[string]int
}

// Limits are the server's limits a schema states. Zero fields take the
// seed's values, which are also the server's defaults.
type Limits struct {
	DefaultTimeoutMinutes int // 30
	MaxTimeoutMinutes     int // 120
	// NoCodeExecute leaves code_execute out of the catalogue: the server
	// runs none (execution.enabled false).
	NoCodeExecute bool
}

// New returns the catalogue of tools over svc, its schemas stating lim.
// Tools of a domain svc lacks (Sessions nil) answer service.ErrSessionsOff.
func New(svc service.Set, lim Limits) *Catalogue {
	if lim.DefaultTimeoutMinutes <= 0 {
		lim.DefaultTimeoutMinutes = 30
	}
	if lim.MaxTimeoutMinutes <= 0 {
		lim.MaxTimeoutMinutes = 120
	}
	c := &Catalogue{index: map[string]int{}}
	for _, t := range []Tool{
		spawnWorker(svc.Tasks, lim), readTaskResult(svc.Tasks), listWorkerTasks(svc.Tasks), cancelWorkerTask(svc.Tasks),
		readWorkspace(svc.Library), writeWorkspace(svc.Library), listWorkspace(svc.Library),
		createAttachmentFromWorkspace(svc.Library),
		ingestFromWorkspace(svc.Library), exportNotesToWorkspace(svc.Library), searchDocuments(svc.Library),
		listSkills(svc.Library), getSkill(svc.Library), createSkill(svc.Library),
		codeExecute(svc.Tasks), workspaceExec(svc.Sessions), suspendSession(svc.Sessions), resumeSession(svc.Sessions), forkSession(svc.Sessions),
		spawnWorkspaceTask(svc),
	} {
		if t.Name == "code_execute" && lim.NoCodeExecute {
			continue
		}
		t.Effect = effects[t.Name]
		c.index[t.Name] = len(c.tools)
		c.tools = append(c.tools, t)
	}
	return c
}

// All returns every tool, in catalogue order.
func (c *Catalogue) All() []Tool { return c.tools }

// Call runs the named tool. An unknown name is ErrNotFound; arguments that
// do not decode are ErrInvalidArgument.
func (c *Catalogue) Call(ctx context.Context, name string, args json.RawMessage) (any, error) {
	i, ok := c.index[name]
	if !ok {
		return nil, fmt.Errorf("no tool %q: %w", name, errdefs.ErrNotFound)
	}
	if len(bytes.TrimSpace(args)) == 0 {
		args = json.RawMessage("{}")
	}
	return c.tools[i].Call(ctx, args)
}

// Function is a tool in the OpenAI function-calling format.
type Function struct {
	Type     string       `json:"type"`
	Function FunctionSpec `json:"function"`
}

// FunctionSpec is the inner part of Function.
type FunctionSpec struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

// Functions returns the catalogue as OpenAI-style function definitions.
func (c *Catalogue) Functions() []Function {
	out := make([]Function, len(c.tools))
	for i, t := range c.tools {
		out[i] = Function{Type: "function", Function: FunctionSpec{Name: t.Name, Description: t.Description, Parameters: t.Schema}}
	}
	return out
}

// decoded is a tool's Call that decodes its arguments, strictly, into a
// Req and gives them to method of svc (a method expression, so that svc
// is looked at only when the tool is called).
func decoded[S, Req, Res any](svc S, method func(S, context.Context, Req) (Res, error)) func(context.Context, json.RawMessage) (any, error) {
	return func(ctx context.Context, args json.RawMessage) (any, error) {
		var req Req
		if err := strictjson.Decode(args, &req); err != nil {
			return nil, err
		}
		return method(svc, ctx, req)
	}
}

// checkPath refuses a path workspace.Clean refuses (one that leaves
// shared/, is absolute or is too long) before it reaches the service, with
// the orchestrator's own error, whichever Library the catalogue is over.
// os.Root in the orchestrator stays the enforcement; a name that may not be
// created is refused by the write itself (workspace.CheckName).
func checkPath(p string) error {
	if _, err := workspace.Clean(p); err != nil {
		return &errdefs.FieldError{Field: "path", Err: err}
	}
	return nil
}

func spawnWorker(tasks service.Tasks, lim Limits) Tool {
	return Tool{
		Name: "spawn_worker",
		Description: `Spawn an AI coder worker (Claude Code, Gemini CLI, Codex, opencode, or a plain command) to complete
a complex task that requires general-purpose computing capabilities like running Python,
shell commands, or file manipulation.

Use this when:
- Task requires running Python/shell scripts
- Task needs file I/O beyond notes/documents
- Task involves complex data processing or visualization
- Task would take many tool calls to complete manually

Do NOT use this for:
- Simple queries answerable with existing tools
- Quick one-off operations

The worker runs in an isolated sandbox with:
- Read access to /workspace/shared/ (persistent files)
- Write access to its task directory (/task; results go to /task/output/)
- No network unless the task's network policy allows it

You will be notified when the worker completes.
Use read_task_result(task_id) to retrieve the output; it can also wait for the end.`,
		Schema: withRuntimes(fmt.Sprintf(spawnSchema, lim.DefaultTimeoutMinutes, lim.MaxTimeoutMinutes)),
		Call: func(ctx context.Context, args json.RawMessage) (any, error) {
			var req service.SpawnRequest
			if err := strictjson.Decode(args, &req); err != nil {
				return nil, err
			}
			t, existing, err := tasks.Spawn(ctx, req)
			if err != nil {
				return nil, err
			}
			return map[string]any{"task_id": t.ID, "status": t.Status, "existing": existing}, nil
		},
	}
}

func readTaskResult(tasks service.Tasks) Tool {
	return Tool{
		Name:        "read_task_result",
		Description: "Read the result of a completed worker task. Call this after being notified that a worker has completed, or pass wait_seconds to wait for it to end. The answer has the status, summary, error, output files and, when asked, their contents; a long file is cut with a note saying where the whole file is.",
		Schema: json.RawMessage(`{"type":"object","properties":{
"task_id":{"type":"string","description":"The task ID returned by spawn_worker."},
"include_file_contents":{"type":"array","items":{"type":"string"},"description":"List of output file names to include content for. For large files, consider reading them separately."},
"wait_seconds":{"type":"integer","minimum":0,"maximum":600,"default":0,"description":"Wait up to this many seconds for the task to end before answering."}},
"required":["task_id"],"additionalProperties":false}`),
		Call: func(ctx context.Context, args json.RawMessage) (any, error) {
			var a struct {
				TaskID              string   `json:"task_id"`
				IncludeFileContents []string `json:"include_file_contents"`
				WaitSeconds         int      `json:"wait_seconds"`
			}
			if err := strictjson.Decode(args, &a); err != nil {
				return nil, err
			}
			if a.WaitSeconds < 0 || a.WaitSeconds > 600 {
				return nil, errdefs.Field("wait_seconds", "must be between 0 and 600")
			}
			res, err := tasks.Result(ctx, service.ResultRequest{TaskID: a.TaskID, IncludeFileContents: a.IncludeFileContents, Wait: time.Duration(a.WaitSeconds) * time.Second})
			if err != nil {
				return nil, err
			}
			fitContents(&res, a.IncludeFileContents, MaxResultContentBytes)
			return res, nil
		},
	}
}

func listWorkerTasks(tasks service.Tasks) Tool {
	return Tool{
		Name:        "list_worker_tasks",
		Description: "List worker tasks, newest first, optionally only those of one conversation, one workspace or in one status.",
		Schema: json.RawMessage(`{"type":"object","properties":{
"conversation_id":{"type":"string","description":"Only tasks spawned for this conversation."},
"workspace":{"type":"string","description":"Only tasks in this named workspace."},
"status":{"type":"string","enum":["pending","queued","starting","running","success","failed","timeout","cancelled"],"description":"Only tasks in this status."},
"limit":{"type":"integer","minimum":1,"maximum":500,"default":50,"description":"At most this many tasks."},
"cursor":{"type":"string","description":"next_cursor from the previous page."}},"additionalProperties":false}`),
		Call: decoded(tasks, service.Tasks.List),
	}
}

func cancelWorkerTask(tasks service.Tasks) Tool {
	return Tool{
		Name:        "cancel_worker_task",
		Description: "Cancel a worker task that has not ended: a queued task never starts, a running one is stopped with everything it started.",
		Schema: json.RawMessage(`{"type":"object","properties":{
"task_id":{"type":"string","description":"The task ID returned by spawn_worker."}},"required":["task_id"],"additionalProperties":false}`),
		Call: func(ctx context.Context, args json.RawMessage) (any, error) {
			var a struct {
				TaskID string `json:"task_id"`
			}
			if err := strictjson.Decode(args, &a); err != nil {
				return nil, err
			}
			return tasks.Cancel(ctx, a.TaskID)
		},
	}
}

func readWorkspace(lib service.Library) Tool {
	return Tool{
		Name:        "read_workspace",
		Description: "Read a file from /workspace/shared/. Use this to access persistent files like scripts, data, or worker outputs that were saved to shared.",
		Schema: json.RawMessage(`{"type":"object","properties":{
"path":{"type":"string","description":"Path relative to /workspace/shared/, e.g., 'scripts/analyze.py'"}},"required":["path"],"additionalProperties":false}`),
		Call: func(ctx context.Context, args json.RawMessage) (any, error) {
			var a struct {
				Path string `json:"path"`
			}
			if err := strictjson.Decode(args, &a); err != nil {
				return nil, err
			}
			if err := checkPath(a.Path); err != nil {
				return nil, err
			}
			f, err := lib.ReadWorkspace(ctx, a.Path)
			if err != nil {
				return nil, err
			}
			if f.Truncated {
				f.Note = fmt.Sprintf("content cut at %d of %d bytes; the whole file: GET /api/workspace/%s", contentBytes(f), f.Size, f.Path)
			}
			return f, nil
		},
	}
}

func writeWorkspace(lib service.Library) Tool {
	return Tool{
		Name:        "write_workspace",
		Description: "Write a file to /workspace/shared/. Use this to store data for workers to access, or to save scripts/outputs for future use.",
		Schema: json.RawMessage(`{"type":"object","properties":{
"path":{"type":"string","description":"Path relative to /workspace/shared/, e.g., 'data/input.csv'"},
"content":{"type":"string","description":"Content to write to the file."}},"required":["path","content"],"additionalProperties":false}`),
		Call: func(ctx context.Context, args json.RawMessage) (any, error) {
			var a struct {
				Path    string  `json:"path"`
				Content *string `json:"content"`
			}
			if err := strictjson.Decode(args, &a); err != nil {
				return nil, err
			}
			if a.Content == nil {
				return nil, errdefs.Field("content", "is required")
			}
			if err := checkPath(a.Path); err != nil {
				return nil, err
			}
			return lib.WriteWorkspace(ctx, a.Path, []byte(*a.Content))
		},
	}
}

func listWorkspace(lib service.Library) Tool {
	return Tool{
		Name:        "list_workspace",
		Description: "List files and directories in /workspace/shared/.",
		Schema: json.RawMessage(`{"type":"object","properties":{
"path":{"type":"string","default":"","description":"Path relative to /workspace/shared/. Empty string for root."},
"recursive":{"type":"boolean","default":false,"description":"If true, list files recursively."}},"additionalProperties":false}`),
		Call: func(ctx context.Context, args json.RawMessage) (any, error) {
			var a struct {
				Path      string `json:"path"`
				Recursive bool   `json:"recursive"`
			}
			if err := strictjson.Decode(args, &a); err != nil {
				return nil, err
			}
			if err := checkPath(a.Path); err != nil {
				return nil, err
			}
			ents, err := lib.ListWorkspace(ctx, a.Path, a.Recursive)
			if err != nil {
				return nil, err
			}
			return map[string]any{"path": a.Path, "entries": ents}, nil
		},
	}
}

// withRuntimes is schema with RUNTIMES made the JSON list of the
// runtimes' names (rtkind.Kinds).
func withRuntimes(schema string) json.RawMessage {
	names, _ := json.Marshal(rtkind.Names())
	return json.RawMessage(strings.ReplaceAll(schema, "RUNTIMES", string(names)))
}

const spawnSchema = `{"type":"object","properties":{
"task_description":{"type":"string","description":"Detailed description of what the worker should accomplish. Be specific about expected outputs and success criteria."},
"context_files":{"type":"array","items":{"type":"string"},"description":"List of files from /workspace/shared/ to copy to the task directory. Use paths relative to shared/, e.g., 'data/input.csv'."},
"shared_files":{"type":"array","items":{"type":"string"},"description":"Files from /workspace/shared/ to include in the task's context/, e.g. 'scripts/resize_images.py' (the same as context_files; both lists are taken)."},
"attachment_ids":{"type":"array","items":{"type":"string"},"description":"Attachment IDs to make available to the worker. They are copied into the task's context directory under their original names."},
"save_to_shared":{"type":"boolean","default":false,"description":"If true, copy successful output files to /workspace/shared/ for future reuse."},
"document_ids":{"type":"array","items":{"type":"string"},"description":"Document IDs (from search results) to include. They are copied into the task's context directory."},
"note_query":{"type":"string","description":"Search query to find notes to export as markdown files into the task's context/notes/ (at most 20, best first)."},
"model":{"type":"string","enum":["claude","gemini"],"default":"claude","description":"Which AI coder to use. Claude Code recommended for most tasks."},
"agent":{"type":"string","enum":["claude","gemini","codex","opencode","command"],"description":"The agent to run, for the agents model does not name; when given, it wins over model."},
"command":{"type":"array","items":{"type":"string"},"description":"For agent 'command': the argv to run in /task, with the task description on stdin."},
"timeout_minutes":{"type":"integer","default":%d,"minimum":1,"maximum":%d,"description":"Maximum execution time in minutes."},
"runtime":{"type":"string","enum":RUNTIMES,"description":"Where the worker runs; defaults to the server's runtime."},
"image":{"type":"string","description":"Container image, for the docker and kubernetes runtimes."},
"network":{"type":"string","enum":["none","allowlist","open"],"description":"The worker's network policy."},
"network_allow":{"type":"array","items":{"type":"string"},"maxItems":256,"description":"The worker's own egress allowlist (host, host:port, *.suffix) in the place of the server's: within it unless the server lets tasks add hosts."},
"credentials":{"type":"array","items":{"type":"string"},"maxItems":32,"description":"Names of the server's egress credential rules given on request: the proxy adds their headers to the worker's HTTPS requests for their hosts; the worker never holds the secrets."},
"resources":{"type":"object","properties":{"memory_limit":{"type":"string","description":"e.g. 512Mi, 2Gi"},"cpu_limit":{"type":"string","description":"e.g. 2, 500m"},"pids_limit":{"type":"integer","minimum":32,"maximum":1048576,"description":"processes and threads, the sandbox's own included"}},"additionalProperties":false,"description":"Overrides of the sandbox's limits."},
"conversation_id":{"type":"string","description":"The conversation that asked, for reporting back."},
"interface_type":{"type":"string","description":"The interface the conversation is on (chat, telegram, ...)."},
"user_name":{"type":"string","description":"Who asked."},
"labels":{"type":"object","additionalProperties":{"type":"string"},"description":"Free-form labels."},
"idempotency_key":{"type":"string","description":"Spawning twice with the same key returns the first task instead of a second one."},
"follow_up_of":{"type":"string","description":"The task_id of an ended task to continue: its output files are copied into /task/context/previous/, and Claude Code resumes its session."},
"session_id":{"type":"string","description":"A running session (POST /api/sessions) the agent runs every command in: its own shell tool is off and workspace_exec, bound to the session, is its way to run anything. claude only."},
"workspace":{"type":"string","description":"A named workspace (POST /api/workspaces) the agent works in, read-write, as its working directory; tasks on one workspace run one at a time."},
"origin_workspace":{"type":"string","description":"The workspace the asking conversation works in, recorded with the report of a workspace task's end."},
"origin_conversation":{"type":"string","description":"The conversation a workspace task's end is reported to (default conversation_id)."}},
"required":["task_description"],"additionalProperties":false}`

// MaxResultContentBytes bounds the file contents one read_task_result
// answer carries, all files together: the answer goes into a model's
// context, where 256 KiB is already some 64k tokens. The orchestrator cuts
// each file at its read limit (256 KiB by default); this cuts the set.
const MaxResultContentBytes = 256 << 10

// fitContents cuts res's file contents, in the order they were asked for,
// so that together they stay within max bytes, and points every cut file at
// the API route that serves it whole.
func fitContents(res *service.Result, order []string, max int) {
	left := max
	for _, name := range order {
		f, ok := res.FileContents[name]
		if !ok || f.Content == "" {
			continue
		}
		if len(f.Content) > left {
			f.Content = cut(f.Content, f.Encoding, left)
			f.Truncated = true
		}
		left -= len(f.Content)
		if f.Truncated {
			f.Note = fmt.Sprintf("content cut at %d of %d bytes; the whole file: GET /api/tasks/%s/files/%s", contentBytes(f), f.Size, res.ID, f.Path)
		}
		res.FileContents[name] = f
	}
}

// cut shortens content to at most n bytes without splitting a UTF-8
// sequence or a base64 quantum.
func cut(content, encoding string, n int) string {
	if n <= 0 {
		return ""
	}
	if encoding == "base64" {
		return content[:n/4*4]
	}
	for n > 0 && !utf8.RuneStart(content[n]) {
		n--
	}
	return content[:n]
}

// contentBytes is how many bytes of the file the content holds.
func contentBytes(f service.File) int {
	if f.Encoding == "base64" {
		return base64.StdEncoding.DecodedLen(len(f.Content)) - strings.Count(f.Content[max(0, len(f.Content)-2):], "=")
	}
	return len(f.Content)
}
