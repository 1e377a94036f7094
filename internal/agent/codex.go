package agent

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
)

// codexAdapter runs the Codex CLI headless:
//
//	codex exec --json --dangerously-bypass-approvals-and-sandbox --skip-git-repo-check [--model M] -
//
// with the prompt on stdin ("-"). Codex's own sandbox and approvals are off:
// the Corral sandbox is the boundary, and nobody is there to approve.
//
// Codex takes its endpoint from its configuration, not from the
// environment, and the configured environment (agents.codex.env) is known
// only inside the sandbox; so the process is a shell that, when
// OPENAI_BASE_URL is set, adds a model provider for it (Responses API, key
// from OPENAI_API_KEY) with -c options, then execs the CLI. Without it
// Codex talks to OpenAI with OPENAI_API_KEY.
type codexAdapter struct{}

// codexSetup is the shell run before the CLI: "$@" is the CLI's argv up
// to the prompt argument, which the script adds last. The provider's
// options go right after the subcommand, before the adapter's flags and
// agents.codex.args, whose -c options so come later and win: `-c
// model_providers.corral.supports_websockets=true` there turns on the
// CLI's WebSocket transport to the Responses API, through the relay.
const codexSetup = `if [ -n "$OPENAI_BASE_URL" ]; then
case "$OPENAI_BASE_URL" in *'"'*|*'\'*) echo "codex: OPENAI_BASE_URL must not contain quotes or backslashes" >&2; exit 64;; esac
bin=$1 sub=$2; shift 2
set -- "$bin" "$sub" -c "model_providers.corral={name=\"corral\",base_url=\"$OPENAI_BASE_URL\",env_key=\"OPENAI_API_KEY\",wire_api=\"responses\"}" -c model_provider=corral "$@"
fi
exec "$@" -`

func (codexAdapter) Prepare(inv Invocation) (Process, error) {
	if err := noSession("codex", inv); err != nil {
		return Process{}, err
	}
	bin := inv.Binary
	if bin == "" {
		bin = "codex"
	}
	args := []string{"/bin/sh", "-c", codexSetup, "codex-setup",
		bin, "exec", "--json", "--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check", "--color", "never"}
	if inv.Model != "" {
		args = append(args, "--model", inv.Model)
	}
	p := Process{
		Args:        append(args, inv.ExtraArgs...),
		Env:         append([]string(nil), inv.Env...),
		DefaultEnv:  []string{"NO_COLOR=1"},
		Transcript:  "agent.jsonl",
		InstallHint: "npm install -g @openai/codex",
	}
	stdin(&p, inv)
	return p, nil
}

// openAIKey is an OpenAI API key, whose SDKs' default base URL has /v1.
var openAIKey = Key{Var: "OPENAI_API_KEY", Header: "Authorization", Bearer: true, BaseURL: "OPENAI_BASE_URL", Default: "https://api.openai.com/v1"}

// Credentials: an OpenAI API key, also the key of the endpoint
// OPENAI_BASE_URL names.
func (codexAdapter) Credentials() Credentials {
	return Credentials{AnyOf: []string{"OPENAI_API_KEY"}, BaseURL: "OPENAI_BASE_URL", Keys: []Key{openAIKey}}
}

func (codexAdapter) NewParser(onProgress func(Progress)) Parser {
	if onProgress == nil {
		onProgress = func(Progress) {}
	}
	c := &codexParser{progress: onProgress}
	c.lines = lineSplitter{max: maxLineBytes, fn: c.line}
	return c
}

// codexLine is the part of an exec --json line the parser reads. Lines look
// like:
//
//	{"type":"thread.started","thread_id":"…"}
//	{"type":"turn.started"}
//	{"type":"item.started"|"item.completed","item":{"id":"item_1","type":"agent_message","text":"…"}}
//	{"type":"item.completed","item":{"type":"command_execution","command":"…","aggregated_output":"…","exit_code":0,"status":"completed"}}
//	{"type":"item.completed","item":{"type":"error","message":"…"}}   (a warning)
//	{"type":"error","message":"Reconnecting... 1/5 (…)"}
//	{"type":"turn.completed","usage":{"input_tokens":200,"cached_input_tokens":0,"output_tokens":40,…}}
//	{"type":"turn.failed","error":{"message":"…"}}
//
// Items also are reasoning, file_change, mcp_tool_call, web_search and
// todo_list. Unknown types and fields are ignored.
type codexLine struct {
	Type     string `json:"type"`
	ThreadID string `json:"thread_id"`
	Message  string `json:"message"`
	Item     *struct {
		Type     string          `json:"type"`
		Text     string          `json:"text"`
		Message  string          `json:"message"`
		Command  string          `json:"command"`
		Output   string          `json:"aggregated_output"`
		ExitCode *int            `json:"exit_code"`
		Status   string          `json:"status"`
		Server   string          `json:"server"`
		Tool     string          `json:"tool"`
		Query    string          `json:"query"`
		Changes  json.RawMessage `json:"changes"`
		Args     json.RawMessage `json:"arguments"`
	} `json:"item"`
	Usage *struct {
		InputTokens  int64 `json:"input_tokens"`
		CachedInput  int64 `json:"cached_input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

type codexParser struct {
	progress func(Progress)
	lines    lineSplitter
	res      Result
	lastText string
	lastErr  string // the last top-level error, for a run without turn.failed
}

func (c *codexParser) Write(p []byte) (int, error) {
	c.lines.Write(p)
	return len(p), nil
}

func (c *codexParser) Result() Result {
	c.lines.flush()
	r := c.res
	r.Summary = c.lastText
	if r.Error == "" && !r.Done && c.lastErr != "" {
		r.Error = codexError(c.lastErr)
	}
	return r
}

func (c *codexParser) line(b []byte, long bool) {
	b = bytes.TrimSpace(b)
	if long || len(b) == 0 || b[0] != '{' {
		return
	}
	var l codexLine
	if err := json.Unmarshal(b, &l); err != nil {
		return
	}
	switch l.Type {
	case "thread.started":
		c.res.SessionID = l.ThreadID
		c.progress(Progress{Kind: ProgressInit})
	case "item.started":
		if it := l.Item; it != nil {
			switch it.Type {
			case "command_execution":
				c.res.Turns++
				c.progress(Progress{Kind: ProgressToolUse, Tool: "shell", Input: jsonSummary(map[string]string{"command": it.Command})})
			case "mcp_tool_call":
				c.res.Turns++
				c.progress(Progress{Kind: ProgressToolUse, Tool: Truncate(it.Server+"."+it.Tool, 128), Input: inputSummary(it.Args)})
			}
		}
	case "item.completed":
		it := l.Item
		if it == nil {
			return
		}
		switch it.Type {
		case "agent_message":
			if s := strings.TrimSpace(it.Text); s != "" {
				c.lastText = Truncate(s, MaxSummaryBytes)
				c.progress(Progress{Kind: ProgressText, Text: Truncate(s, MaxProgressBytes)})
			}
		case "command_execution":
			st := "ok"
			if it.Status != "completed" || (it.ExitCode != nil && *it.ExitCode != 0) {
				st = "error"
			}
			c.progress(Progress{Kind: ProgressToolResult, Tool: "shell", Status: st, Text: Truncate(it.Output, MaxProgressBytes)})
		case "mcp_tool_call":
			st := "ok"
			if it.Status != "completed" {
				st = "error"
			}
			c.progress(Progress{Kind: ProgressToolResult, Tool: Truncate(it.Server+"."+it.Tool, 128), Status: st})
		case "file_change":
			c.res.Turns++
			c.progress(Progress{Kind: ProgressToolUse, Tool: "apply_patch", Input: inputSummary(it.Changes)})
			st := "ok"
			if it.Status != "completed" {
				st = "error"
			}
			c.progress(Progress{Kind: ProgressToolResult, Tool: "apply_patch", Status: st})
		case "web_search":
			c.res.Turns++
			c.progress(Progress{Kind: ProgressToolUse, Tool: "web_search", Input: jsonSummary(map[string]string{"query": it.Query})})
		}
	case "error":
		c.lastErr = l.Message
	case "turn.completed":
		c.res.Done = true
		c.res.Error = ""
		if u := l.Usage; u != nil {
			c.res.Usage.InputTokens += u.InputTokens - u.CachedInput
			c.res.Usage.CacheReadTokens += u.CachedInput
			c.res.Usage.OutputTokens += u.OutputTokens
		}
		c.progress(Progress{Kind: ProgressResult, Text: Truncate(c.lastText, MaxProgressBytes)})
	case "turn.failed":
		c.res.Done = true
		msg := c.lastErr
		if l.Error != nil && l.Error.Message != "" {
			msg = l.Error.Message
		}
		c.res.Error = codexError(msg)
	}
}

// codexStatus finds the HTTP status in Codex's error messages:
// "unexpected status 401 Unauthorized: …" and "exceeded retry limit, last
// status: 429 Too Many Requests".
var codexStatus = regexp.MustCompile(`(?:unexpected status|last status:) (\d{3})\b`)

// codexError makes one line of a failed turn. Codex words a 5xx from the
// Responses API as "We're currently experiencing high demand…" without the
// status; that is said as a server error.
func codexError(msg string) string {
	msg = oneLine(msg)
	why := ""
	if m := codexStatus.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.Atoi(m[1])
		why = endpointStatusWhy(n, "OPENAI_API_KEY in agents.codex.env")
	} else if strings.Contains(msg, "experiencing high demand") {
		why = "the model endpoint failed with a server error (retries exhausted)"
	}
	if msg == "" {
		msg = "turn failed"
	}
	if why != "" {
		return Truncate("codex: "+why+": "+msg, MaxErrorBytes)
	}
	return Truncate("codex: "+msg, MaxErrorBytes)
}

// jsonSummary is v as compact JSON, bounded.
func jsonSummary(v any) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return ""
	}
	return Truncate(strings.TrimSpace(buf.String()), MaxInputBytes)
}
