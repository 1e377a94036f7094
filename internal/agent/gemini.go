package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// geminiAdapter runs Gemini CLI headless:
//
//	gemini -p "" --output-format stream-json --approval-mode yolo [--model M]
//
// with the prompt on stdin (-p's text is appended to stdin's; empty here).
// yolo approves every tool call: the sandbox, not Gemini CLI, is the
// security boundary, and nobody is there to answer prompts.
//
// Gemini CLI reads its authentication method and its privacy and update
// choices only from settings.json, so the process is a shell that writes
// ~/.gemini/settings.json (HOME is the sandbox's private /tmp) unless one
// is there, then execs the CLI. The settings choose API-key authentication
// when GEMINI_API_KEY is set (with GOOGLE_GEMINI_BASE_URL the CLI would
// otherwise pick its "gateway" method, which headless mode refuses), turn
// off usage statistics, telemetry and update checks, and allow 3 attempts
// of a model request rather than 10: the CLI's backoff spends about four
// minutes on a 429 or 5xx before it gives up, 3 attempts ride out a brief
// one in about 15 s (as the claude adapter's 3 retries do). The environment
// turns off Gemini CLI's own sandbox (which yolo would start), trusts the
// task directory and keeps the CLI from relaunching itself.
type geminiAdapter struct{}

// geminiSetup is the shell script run before the CLI: $1 is settings.json
// without an auth method, $2 with API-key authentication; the rest is the
// CLI's argv.
const geminiSetup = `d="${GEMINI_CLI_HOME:-$HOME}/.gemini"
s=$1
if [ -n "$GEMINI_API_KEY" ] && [ "$GOOGLE_GENAI_USE_VERTEXAI" != true ] && [ "$GOOGLE_GENAI_USE_GCA" != true ]; then s=$2; fi
shift 2
if [ ! -e "$d/settings.json" ]; then mkdir -p "$d" && printf '%s\n' "$s" > "$d/settings.json" || exit 70; fi
exec "$@"`

const geminiSettings = `"privacy":{"usageStatisticsEnabled":false},"telemetry":{"enabled":false},` +
	`"general":{"enableAutoUpdate":false,"enableAutoUpdateNotification":false,"maxAttempts":3},"ui":{"hideBanner":true}`

// geminiDefaultEnv are defaults that agents.gemini.env may override.
var geminiDefaultEnv = []string{
	"GEMINI_SANDBOX=false",
	"GEMINI_CLI_TRUST_WORKSPACE=true",
	"GEMINI_CLI_NO_RELAUNCH=true",
	"GEMINI_TELEMETRY_ENABLED=false",
	"NO_COLOR=1",
}

func (geminiAdapter) Prepare(inv Invocation) (Process, error) {
	if err := noSession("gemini", inv); err != nil {
		return Process{}, err
	}
	bin := inv.Binary
	if bin == "" {
		bin = "gemini"
	}
	args := []string{
		"/bin/sh", "-c", geminiSetup, "gemini-setup",
		"{" + geminiSettings + "}",
		`{"security":{"auth":{"selectedType":"gemini-api-key"}},` + geminiSettings + "}",
		bin, "-p", "", "--output-format", "stream-json", "--approval-mode", "yolo",
	}
	if inv.Model != "" {
		args = append(args, "--model", inv.Model)
	}
	p := Process{
		Args:        append(args, inv.ExtraArgs...),
		Env:         append([]string(nil), inv.Env...),
		DefaultEnv:  append([]string(nil), geminiDefaultEnv...),
		Transcript:  "agent.jsonl",
		InstallHint: "npm install -g @google/gemini-cli",
	}
	stdin(&p, inv)
	return p, nil
}

// Credentials: a Gemini API key (GOOGLE_API_KEY for Vertex AI express).
func (geminiAdapter) Credentials() Credentials {
	const base, api = "GOOGLE_GEMINI_BASE_URL", "https://generativelanguage.googleapis.com"
	return Credentials{AnyOf: []string{"GEMINI_API_KEY", "GOOGLE_API_KEY"}, BaseURL: base, Keys: []Key{
		{Var: "GEMINI_API_KEY", Header: "X-Goog-Api-Key", BaseURL: base, Default: api},
		{Var: "GOOGLE_API_KEY", Header: "X-Goog-Api-Key", BaseURL: base, Default: api},
	}}
}

func (geminiAdapter) NewParser(onProgress func(Progress)) Parser {
	if onProgress == nil {
		onProgress = func(Progress) {}
	}
	g := &geminiParser{progress: onProgress, tools: map[string]string{}}
	g.lines = lineSplitter{max: maxLineBytes, fn: g.line}
	return g
}

// geminiLine is the part of a stream-json line the parser reads. Lines look
// like:
//
//	{"type":"init","session_id":"…","model":"gemini-2.5-pro"}
//	{"type":"message","role":"user"|"assistant","content":"…","delta":true}
//	{"type":"tool_use","tool_name":"run_shell_command","tool_id":"…","parameters":{…}}
//	{"type":"tool_result","tool_id":"…","status":"success"|"error","output":"…","error":{…}}
//	{"type":"error","severity":"warning"|"error","message":"…"}
//	{"type":"result","status":"success"|"error","error":{"type":"…","message":"…"},
//	 "stats":{"input_tokens":200,"output_tokens":40,"cached":0,"tool_calls":1,…}}
//
// Assistant messages with delta set are pieces of one message. Unknown types
// and fields are ignored.
type geminiLine struct {
	Type       string          `json:"type"`
	SessionID  string          `json:"session_id"`
	Model      string          `json:"model"`
	Role       string          `json:"role"`
	Content    string          `json:"content"`
	Delta      bool            `json:"delta"`
	ToolName   string          `json:"tool_name"`
	ToolID     string          `json:"tool_id"`
	Parameters json.RawMessage `json:"parameters"`
	Status     string          `json:"status"`
	Output     string          `json:"output"`
	Severity   string          `json:"severity"`
	Message    string          `json:"message"`
	Error      json.RawMessage `json:"error"`
	Stats      *struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
		Cached       int64 `json:"cached"`
		ToolCalls    int   `json:"tool_calls"`
	} `json:"stats"`
}

type geminiParser struct {
	progress func(Progress)
	lines    lineSplitter
	res      Result
	tools    map[string]string // tool id → name, for results
	// text is the assistant message being streamed since the last tool
	// call: the final answer when the result comes.
	text strings.Builder
	// lastErr is the last error line, for a run that ends without a result.
	lastErr string
}

func (g *geminiParser) Write(p []byte) (int, error) {
	g.lines.Write(p)
	return len(p), nil
}

func (g *geminiParser) Result() Result {
	g.lines.flush()
	g.endText()
	r := g.res
	if r.Summary == "" {
		r.Summary = Truncate(strings.TrimSpace(g.text.String()), MaxSummaryBytes)
	}
	if !r.Done && r.Error == "" && g.lastErr != "" {
		r.Error = g.lastErr
	}
	return r
}

// endText reports the assistant message streamed so far, if any, as one
// progress item. The text stays as the candidate final answer.
func (g *geminiParser) endText() {
	if s := strings.TrimSpace(g.text.String()); s != "" && !g.res.Done {
		g.progress(Progress{Kind: ProgressText, Text: Truncate(s, MaxProgressBytes)})
	}
}

func (g *geminiParser) line(b []byte, long bool) {
	b = bytes.TrimSpace(b)
	if long || len(b) == 0 || b[0] != '{' {
		return
	}
	var l geminiLine
	if err := json.Unmarshal(b, &l); err != nil {
		return
	}
	switch l.Type {
	case "init":
		g.res.SessionID = l.SessionID
		g.progress(Progress{Kind: ProgressInit, Text: Truncate(l.Model, MaxProgressBytes)})
	case "message":
		if l.Role != "assistant" {
			return
		}
		if !l.Delta {
			g.text.Reset()
		}
		if g.text.Len() < MaxSummaryBytes {
			g.text.WriteString(l.Content)
		}
	case "tool_use":
		g.endText()
		g.text.Reset()
		g.res.Turns++
		g.tools[l.ToolID] = l.ToolName
		g.progress(Progress{Kind: ProgressToolUse, Tool: Truncate(l.ToolName, 128), Input: inputSummary(l.Parameters)})
	case "tool_result":
		p := Progress{Kind: ProgressToolResult, Tool: Truncate(g.tools[l.ToolID], 128), Status: "ok", Text: Truncate(l.Output, MaxProgressBytes)}
		if l.Status != "success" {
			p.Status = "error"
			if m := geminiErrorMessage(l.Error); m != "" {
				p.Text = Truncate(m, MaxProgressBytes)
			}
		}
		g.progress(p)
	case "error":
		if m := oneLine(l.Message); m != "" && l.Severity == "error" {
			g.lastErr = Truncate("gemini: "+m, MaxErrorBytes)
		}
	case "result":
		if g.res.Done {
			return
		}
		g.endText()
		g.res.Done = true
		g.res.Summary = Truncate(strings.TrimSpace(g.text.String()), MaxSummaryBytes)
		if l.Stats != nil {
			g.res.Usage = Usage{InputTokens: l.Stats.InputTokens - l.Stats.Cached, OutputTokens: l.Stats.OutputTokens, CacheReadTokens: l.Stats.Cached}
		}
		if l.Status != "success" {
			g.res.Error = geminiError(l)
		}
		g.progress(Progress{Kind: ProgressResult, Text: Truncate(g.res.Summary, MaxProgressBytes)})
	}
}

// geminiAPIError finds the JSON error body Gemini CLI quotes in its
// messages: [API Error: {"error":{"code":401,"message":"…","status":"…"}}].
var geminiAPIError = regexp.MustCompile(`\{"error":\{.*\}\}`)

// geminiError makes one line of a failed result: the HTTP status and the
// API's message when the CLI quotes an API error, else the CLI's message.
func geminiError(l geminiLine) string {
	msg := geminiErrorMessage(l.Error)
	if msg == "" {
		msg = "run failed (status " + l.Status + ")"
	}
	return Truncate("gemini: "+msg, MaxErrorBytes)
}

// geminiErrorMessage reads an error object {"type","message"} or a bare
// string, and unwraps a quoted API error.
func geminiErrorMessage(raw json.RawMessage) string {
	var e struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	var s string
	switch {
	case json.Unmarshal(raw, &s) == nil:
		e.Message = s
	case json.Unmarshal(raw, &e) != nil:
		return ""
	}
	msg := e.Message
	if m := geminiAPIError.FindString(msg); m != "" {
		var api struct {
			Error struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
				Status  string `json:"status"`
			} `json:"error"`
		}
		if json.Unmarshal([]byte(m), &api) == nil && api.Error.Code != 0 {
			return endpointStatusWhy(api.Error.Code, "GEMINI_API_KEY in agents.gemini.env") + ": " + oneLine(api.Error.Status+" "+api.Error.Message)
		}
	}
	// After its retries on a 429 the CLI quotes only the API's message and
	// adds its own advice on quotas.
	if strings.Contains(msg, "[API Error:") && strings.Contains(msg, "request a quota increase") {
		return endpointStatusWhy(429, "") + ": " + oneLine(msg)
	}
	return oneLine(msg)
}

// endpointStatusWhy says in words what an HTTP status from a model endpoint
// means; key names where the API key is configured.
func endpointStatusWhy(status int, key string) string {
	switch {
	case status == 401:
		return "the model endpoint refused the API key (HTTP 401; check " + key + ")"
	case status == 403:
		return "the model endpoint denied access (HTTP 403)"
	case status == 429:
		return "the model endpoint is rate limiting (HTTP 429; retries exhausted)"
	case status >= 500:
		return fmt.Sprintf("the model endpoint failed with a server error (HTTP %d; retries exhausted)", status)
	default:
		return fmt.Sprintf("the model endpoint refused the request (HTTP %d)", status)
	}
}
