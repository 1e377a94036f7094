package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// claudeAdapter runs Claude Code headless:
//
//	claude -p --output-format stream-json --verbose --dangerously-skip-permissions
//	  [--model M] [--append-system-prompt P] [--resume SESSION]
//
// with the prompt on stdin. Permission prompts are skipped because the
// sandbox, not Claude Code, is the security boundary; nobody is there to
// answer them (the CLI refuses the flag as root, and the sandbox runs it as
// uid 1000). stdout is one JSON object per line (see claudeLine).
//
// HOME is Invocation.Home when set: Claude Code keeps its settings and its
// sessions (HOME/.claude/projects/-task/<session>.jsonl) there, and a
// follow-up task resumes a session only if that directory came along.
type claudeAdapter struct{}

// claudeDefaultEnv runs the CLI unattended in a fresh HOME: no auto-update,
// no telemetry, error reporting or other traffic than the model's, and
// fewer retries than the CLI's 10 (about 3.5 minutes of backoff, spent
// also on a 401): three retries ride out a brief 429 or 5xx in about 4 s,
// and a bad key fails in seconds. Each is a default: agents.claude.env in
// the configuration overrides it.
var claudeDefaultEnv = []string{
	"DISABLE_AUTOUPDATER=1",
	"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
	"DISABLE_TELEMETRY=1",
	"DISABLE_ERROR_REPORTING=1",
	"CLAUDE_CODE_MAX_RETRIES=3",
}

func (claudeAdapter) Prepare(inv Invocation) (Process, error) {
	bin := inv.Binary
	if bin == "" {
		bin = "claude"
	}
	args := []string{bin, "-p", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions"}
	if inv.Model != "" {
		args = append(args, "--model", inv.Model)
	}
	if inv.SystemPrompt != "" {
		args = append(args, "--append-system-prompt", inv.SystemPrompt)
	}
	if inv.Resume != "" {
		args = append(args, "--resume", inv.Resume)
	} else if inv.Continue {
		args = append(args, "--continue")
	}
	if inv.SessionMCP != "" {
		// Only the session's server, and no shell of the CLI's own: every
		// command goes through mcp__corral__workspace_exec.
		args = append(args, "--mcp-config", inv.SessionMCP, "--strict-mcp-config", "--disallowedTools", "Bash")
	}
	p := Process{
		Args:        append(args, inv.ExtraArgs...),
		Env:         append([]string(nil), inv.Env...),
		DefaultEnv:  append([]string(nil), claudeDefaultEnv...),
		Transcript:  "agent.jsonl",
		InstallHint: "npm install -g @anthropic-ai/claude-code",
	}
	if inv.Home != "" {
		p.Env = append(p.Env, "HOME="+inv.Home)
	}
	if inv.SessionMCP != "" {
		// The CLI connects its MCP servers in the background unless told
		// not to, and its first request can go out before the session's
		// server is in: with Bash denied, the agent then has no way to
		// run a command (seen on a loaded host: TestClaudeThroughSession's
		// first request offered WaitForMcpServers and no workspace_exec).
		p.Env = append(p.Env, "MCP_CONNECTION_NONBLOCKING=0")
	}
	stdin(&p, inv)
	return p, nil
}

// Credentials: an API key, a bearer token for a gateway, or a Claude
// subscription's OAuth token (claude setup-token).
func (claudeAdapter) Credentials() Credentials {
	const base, api = "ANTHROPIC_BASE_URL", "https://api.anthropic.com"
	return Credentials{AnyOf: []string{"ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"}, BaseURL: base, Keys: []Key{
		{Var: "ANTHROPIC_API_KEY", Header: "X-Api-Key", BaseURL: base, Default: api},
		{Var: "ANTHROPIC_AUTH_TOKEN", Header: "Authorization", Bearer: true, BaseURL: base, Default: api},
		{Var: "CLAUDE_CODE_OAUTH_TOKEN", Header: "Authorization", Bearer: true, BaseURL: base, Default: api},
	}}
}

func (claudeAdapter) NewParser(onProgress func(Progress)) Parser {
	if onProgress == nil {
		onProgress = func(Progress) {}
	}
	c := &claudeParser{progress: onProgress, tools: make(map[string]string)}
	c.lines = lineSplitter{max: maxLineBytes, fn: c.line}
	return c
}

// claudeLine is the part of a stream-json line the parser reads. Lines look
// like:
//
//	{"type":"system","subtype":"init","session_id":"…","model":"…",…}
//	{"type":"assistant","message":{"content":[{"type":"text","text":"…"},{"type":"tool_use","name":"Bash","input":{…}}]},…}
//	{"type":"user","message":{"content":[{"type":"tool_result",…}]},…}
//	{"type":"result","subtype":"success"|"error_…","is_error":false,"result":"…","errors":["…"],
//	 "session_id":"…","num_turns":3,"total_cost_usd":0.01,"usage":{…}}
//
// Unknown types and fields are ignored.
type claudeLine struct {
	Type      string `json:"type"`
	Subtype   string `json:"subtype"`
	SessionID string `json:"session_id"`
	Model     string `json:"model"`
	Message   struct {
		Content []struct {
			Type      string          `json:"type"`
			Text      string          `json:"text"`
			ID        string          `json:"id"`
			Name      string          `json:"name"`
			Input     json.RawMessage `json:"input"`
			ToolUseID string          `json:"tool_use_id"`
			IsError   bool            `json:"is_error"`
			Content   json.RawMessage `json:"content"`
		} `json:"content"`
	} `json:"message"`
	IsError        bool            `json:"is_error"`
	APIErrorStatus int             `json:"api_error_status"`
	Result         string          `json:"result"`
	Errors         json.RawMessage `json:"errors"`
	NumTurns       int             `json:"num_turns"`
	CostUSD        float64         `json:"total_cost_usd"`
	Usage          struct {
		InputTokens         int64 `json:"input_tokens"`
		OutputTokens        int64 `json:"output_tokens"`
		CacheReadTokens     int64 `json:"cache_read_input_tokens"`
		CacheCreationTokens int64 `json:"cache_creation_input_tokens"`
	} `json:"usage"`
}

type claudeParser struct {
	progress func(Progress)
	lines    lineSplitter
	res      Result
	// lastText is the last assistant text, the summary if no result line
	// ever comes (the agent was killed).
	lastText string
	// tools maps a tool_use id to its tool's name, for the result's
	// progress item; bounded by maxTools.
	tools map[string]string
}

// maxTools bounds the tool_use ids a parser remembers.
const maxTools = 4096

func (c *claudeParser) Write(p []byte) (int, error) {
	c.lines.Write(p)
	return len(p), nil
}

func (c *claudeParser) Result() Result {
	c.lines.flush()
	r := c.res
	if !r.Done && r.Summary == "" {
		r.Summary = c.lastText
	}
	return r
}

func (c *claudeParser) line(b []byte, long bool) {
	b = bytes.TrimSpace(b)
	if long || len(b) == 0 || b[0] != '{' {
		return // an overlong line, or not JSON (a stray print): not ours to read
	}
	var l claudeLine
	if err := json.Unmarshal(b, &l); err != nil {
		return
	}
	switch l.Type {
	case "system":
		if l.Subtype == "init" {
			if l.SessionID != "" {
				c.res.SessionID = l.SessionID
			}
			c.progress(Progress{Kind: ProgressInit, Text: Truncate(l.Model, MaxProgressBytes)})
		}
	case "assistant":
		for _, part := range l.Message.Content {
			switch part.Type {
			case "text":
				if strings.TrimSpace(part.Text) == "" {
					continue
				}
				c.lastText = Truncate(strings.TrimSpace(part.Text), MaxSummaryBytes)
				c.progress(Progress{Kind: ProgressText, Text: Truncate(part.Text, MaxProgressBytes)})
			case "tool_use":
				name := Truncate(part.Name, 128)
				if part.ID != "" && len(c.tools) < maxTools {
					c.tools[part.ID] = name
				}
				c.progress(Progress{Kind: ProgressToolUse, Tool: name, Input: inputSummary(part.Input)})
			}
		}
	case "user":
		for _, part := range l.Message.Content {
			if part.Type != "tool_result" {
				continue
			}
			status := "ok"
			if part.IsError {
				status = "error"
			}
			c.progress(Progress{Kind: ProgressToolResult, Tool: c.tools[part.ToolUseID], Status: status, Text: Truncate(oneLine(contentText(part.Content)), MaxProgressBytes)})
			delete(c.tools, part.ToolUseID)
		}
	case "result":
		if c.res.Done {
			// Some Claude Code versions print a spurious second result
			// (error_during_execution with no turns) after the real one.
			return
		}
		c.res.Done = true
		if l.SessionID != "" {
			c.res.SessionID = l.SessionID
		}
		c.res.CostUSD, c.res.Turns = l.CostUSD, l.NumTurns
		c.res.Usage = Usage{
			InputTokens:         l.Usage.InputTokens,
			OutputTokens:        l.Usage.OutputTokens,
			CacheReadTokens:     l.Usage.CacheReadTokens,
			CacheCreationTokens: l.Usage.CacheCreationTokens,
		}
		c.res.Summary = Truncate(strings.TrimSpace(l.Result), MaxSummaryBytes)
		if l.IsError || strings.HasPrefix(l.Subtype, "error") {
			c.res.Error = claudeError(l)
		}
		c.progress(Progress{Kind: ProgressResult, Text: Truncate(l.Result, MaxProgressBytes)})
	}
}

// claudeError makes one line of a failed result: the errors array, else the
// result text, else the subtype.
func claudeError(l claudeLine) string {
	var msgs []string
	var list []any
	if json.Unmarshal(l.Errors, &list) == nil {
		for _, e := range list {
			switch e := e.(type) {
			case string:
				msgs = append(msgs, e)
			case map[string]any:
				if m, ok := e["message"].(string); ok {
					msgs = append(msgs, m)
				}
			}
		}
	}
	msg := strings.Join(msgs, "; ")
	if strings.TrimSpace(msg) == "" {
		msg = l.Result
	}
	msg = oneLine(msg)
	if why := httpStatusWhy(l.APIErrorStatus); why != "" {
		// The CLI's own text ("API Error: Request rejected (429) · …")
		// follows what happened, in words a person reads at a glance.
		return Truncate("claude: "+why+": "+msg, MaxErrorBytes)
	}
	sub := l.Subtype
	if sub == "" || sub == "success" {
		sub = "error"
	}
	if msg == "" {
		return "claude: " + sub
	}
	return Truncate("claude: "+sub+": "+msg, MaxErrorBytes)
}

// inputSummary is a tool input as compact JSON, bounded.
func inputSummary(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return ""
	}
	return Truncate(buf.String(), MaxInputBytes)
}

// httpStatusWhy says what an HTTP status from the model endpoint means, or
// "" for none.
func httpStatusWhy(status int) string {
	switch {
	case status == 0:
		return ""
	case status == 401:
		return "the model endpoint refused the API key (HTTP 401; check ANTHROPIC_API_KEY in agents.claude.env)"
	case status == 403:
		return "the model endpoint denied access (HTTP 403)"
	case status == 429:
		return "the model endpoint is rate limiting (HTTP 429; retries exhausted)"
	case status == 529:
		return "the model endpoint is overloaded (HTTP 529; retries exhausted)"
	case status >= 500:
		return fmt.Sprintf("the model endpoint failed with a server error (HTTP %d; retries exhausted)", status)
	default:
		return fmt.Sprintf("the model endpoint refused the request (HTTP %d)", status)
	}
}

// contentText is a tool result's content as text: a string, or the text of
// its blocks.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []struct {
		Text string `json:"text"`
	}
	json.Unmarshal(raw, &blocks)
	parts := make([]string, 0, len(blocks))
	for _, b := range blocks {
		if b.Text != "" {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, " ")
}
