package agent

import (
	"bytes"
	"encoding/json"
	"strings"
)

// opencodeAdapter runs opencode headless:
//
//	opencode run --format json --auto [--model provider/model]
//
// with the prompt on stdin. --auto approves every permission the
// configuration does not deny: the sandbox, not opencode, is the boundary.
// Providers are opencode's own, configured by the environment
// (agents.opencode.env): OPENAI_API_KEY with OPENAI_BASE_URL for the
// openai provider, ANTHROPIC_API_KEY for anthropic, or a whole
// configuration in OPENCODE_CONFIG_CONTENT. The model is provider/model
// (openai/gpt-5).
type opencodeAdapter struct{}

// opencodeDefaultEnv keeps opencode from reaching for the network beyond
// the model in a fresh HOME: no update check, no models.dev fetch (the
// bundled list is used), no language-server or default-plugin downloads.
// agents.opencode.env overrides each.
var opencodeDefaultEnv = []string{
	"OPENCODE_DISABLE_AUTOUPDATE=1",
	"OPENCODE_DISABLE_MODELS_FETCH=1",
	"OPENCODE_DISABLE_LSP_DOWNLOAD=1",
	"OPENCODE_DISABLE_DEFAULT_PLUGINS=1",
	"OPENCODE_DISABLE_SHARE=1",
	"NO_COLOR=1",
}

func (opencodeAdapter) Prepare(inv Invocation) (Process, error) {
	if err := noSession("opencode", inv); err != nil {
		return Process{}, err
	}
	bin := inv.Binary
	if bin == "" {
		bin = "opencode"
	}
	args := []string{bin, "run", "--format", "json", "--auto"}
	if inv.Model != "" {
		args = append(args, "--model", inv.Model)
	}
	p := Process{
		Args:        append(args, inv.ExtraArgs...),
		Env:         append([]string(nil), inv.Env...),
		DefaultEnv:  append([]string(nil), opencodeDefaultEnv...),
		Transcript:  "agent.jsonl",
		InstallHint: "npm install -g opencode-ai",
	}
	stdin(&p, inv)
	return p, nil
}

// Credentials: a provider's key, or a whole configuration with its own.
func (opencodeAdapter) Credentials() Credentials {
	// The AI SDK's Anthropic provider reads ANTHROPIC_BASE_URL, whose
	// default path is /v1.
	return Credentials{AnyOf: []string{"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENCODE_CONFIG_CONTENT"}, BaseURL: "OPENAI_BASE_URL", Keys: []Key{
		openAIKey,
		{Var: "ANTHROPIC_API_KEY", Header: "X-Api-Key", BaseURL: "ANTHROPIC_BASE_URL", Default: "https://api.anthropic.com/v1"},
	}}
}

func (opencodeAdapter) NewParser(onProgress func(Progress)) Parser {
	if onProgress == nil {
		onProgress = func(Progress) {}
	}
	o := &opencodeParser{progress: onProgress}
	o.lines = lineSplitter{max: maxLineBytes, fn: o.line}
	return o
}

// opencodeLine is the part of a --format json line the parser reads. Lines
// look like:
//
//	{"type":"step_start","sessionID":"ses_…","part":{"type":"step-start",…}}
//	{"type":"text","sessionID":"…","part":{"type":"text","text":"…"}}
//	{"type":"tool_use","part":{"type":"tool","tool":"bash","callID":"…",
//	 "state":{"status":"completed"|"error","input":{…},"output":"…","error":"…"}}}
//	{"type":"step_finish","part":{"reason":"tool-calls"|"stop",
//	 "tokens":{"input":100,"output":20,"reasoning":0,"cache":{"read":0,"write":0}},"cost":0.0003}}
//	{"type":"error","error":{"name":"APIError","data":{"message":"…","statusCode":401,…}}}
//
// Unknown types and fields are ignored.
type opencodeLine struct {
	Type      string `json:"type"`
	SessionID string `json:"sessionID"`
	Part      struct {
		Text   string `json:"text"`
		Tool   string `json:"tool"`
		Reason string `json:"reason"`
		State  struct {
			Status string          `json:"status"`
			Input  json.RawMessage `json:"input"`
			Output string          `json:"output"`
			Error  string          `json:"error"`
			// Metadata.Exit is the bash tool's exit status.
			Metadata struct {
				Exit *int `json:"exit"`
			} `json:"metadata"`
		} `json:"state"`
		Tokens *struct {
			Input     int64 `json:"input"`
			Output    int64 `json:"output"`
			Reasoning int64 `json:"reasoning"`
			Cache     struct {
				Read  int64 `json:"read"`
				Write int64 `json:"write"`
			} `json:"cache"`
		} `json:"tokens"`
		Cost float64 `json:"cost"`
	} `json:"part"`
	Error *struct {
		Name string `json:"name"`
		Data struct {
			Message    string `json:"message"`
			StatusCode int    `json:"statusCode"`
		} `json:"data"`
	} `json:"error"`
}

type opencodeParser struct {
	progress func(Progress)
	lines    lineSplitter
	res      Result
	lastText string
	started  bool
}

func (o *opencodeParser) Write(p []byte) (int, error) {
	o.lines.Write(p)
	return len(p), nil
}

func (o *opencodeParser) Result() Result {
	o.lines.flush()
	r := o.res
	r.Summary = o.lastText
	return r
}

func (o *opencodeParser) line(b []byte, long bool) {
	b = bytes.TrimSpace(b)
	if long || len(b) == 0 || b[0] != '{' {
		return
	}
	var l opencodeLine
	if err := json.Unmarshal(b, &l); err != nil {
		return
	}
	if l.SessionID != "" && o.res.SessionID == "" {
		o.res.SessionID = l.SessionID
	}
	switch l.Type {
	case "step_start":
		if !o.started {
			o.started = true
			o.progress(Progress{Kind: ProgressInit})
		}
	case "text":
		if s := strings.TrimSpace(l.Part.Text); s != "" {
			o.lastText = Truncate(s, MaxSummaryBytes)
			o.progress(Progress{Kind: ProgressText, Text: Truncate(s, MaxProgressBytes)})
		}
	case "tool_use":
		tool := Truncate(l.Part.Tool, 128)
		o.res.Turns++
		o.progress(Progress{Kind: ProgressToolUse, Tool: tool, Input: inputSummary(l.Part.State.Input)})
		p := Progress{Kind: ProgressToolResult, Tool: tool, Status: "ok", Text: Truncate(l.Part.State.Output, MaxProgressBytes)}
		if st := l.Part.State; st.Status == "error" {
			p.Status, p.Text = "error", Truncate(oneLine(st.Error), MaxProgressBytes)
		} else if st.Metadata.Exit != nil && *st.Metadata.Exit != 0 {
			p.Status = "error"
		}
		o.progress(p)
	case "step_finish":
		if t := l.Part.Tokens; t != nil {
			o.res.Usage.InputTokens += t.Input
			o.res.Usage.OutputTokens += t.Output + t.Reasoning
			o.res.Usage.CacheReadTokens += t.Cache.Read
			o.res.Usage.CacheCreationTokens += t.Cache.Write
		}
		o.res.CostUSD += l.Part.Cost
		if l.Part.Reason != "tool-calls" {
			o.res.Done = true
			o.progress(Progress{Kind: ProgressResult, Text: Truncate(o.lastText, MaxProgressBytes)})
		}
	case "error":
		o.res.Error = opencodeError(l)
	}
}

// opencodeError makes one line of an error event: what the HTTP status
// means, when the error is the provider's, and the message.
func opencodeError(l opencodeLine) string {
	if l.Error == nil {
		return "opencode: error"
	}
	msg := oneLine(l.Error.Data.Message)
	if msg == "" {
		msg = l.Error.Name
	}
	if code := l.Error.Data.StatusCode; code >= 400 {
		why := endpointStatusWhy(code, "the provider's API key in agents.opencode.env")
		return Truncate("opencode: "+why+": "+msg, MaxErrorBytes)
	}
	return Truncate("opencode: "+msg, MaxErrorBytes)
}
