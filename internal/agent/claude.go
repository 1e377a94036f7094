package agent

import (
	"bytes"
	"encoding/json"
	"strings"
)

// claudeAdapter runs Claude Code headless:
//
//	claude -p --output-format stream-json --verbose --dangerously-skip-permissions [--model M]
//
// with the prompt on stdin. Permission prompts are skipped because the
// sandbox, not Claude Code, is the security boundary; nobody is there to
// answer them. stdout is one JSON object per line (see claudeLine).
type claudeAdapter struct{}

func (claudeAdapter) Prepare(inv Invocation) (Process, error) {
	bin := inv.Binary
	if bin == "" {
		bin = "claude"
	}
	args := []string{bin, "-p", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions"}
	if inv.Model != "" {
		args = append(args, "--model", inv.Model)
	}
	p := Process{
		Args:        append(args, inv.ExtraArgs...),
		Env:         append([]string(nil), inv.Env...),
		Transcript:  "agent.jsonl",
		InstallHint: "npm install -g @anthropic-ai/claude-code",
	}
	stdin(&p, inv)
	return p, nil
}

func (claudeAdapter) NewParser(onProgress func(Progress)) Parser {
	if onProgress == nil {
		onProgress = func(Progress) {}
	}
	c := &claudeParser{progress: onProgress}
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
			Type  string          `json:"type"`
			Text  string          `json:"text"`
			Name  string          `json:"name"`
			Input json.RawMessage `json:"input"`
		} `json:"content"`
	} `json:"message"`
	IsError  bool            `json:"is_error"`
	Result   string          `json:"result"`
	Errors   json.RawMessage `json:"errors"`
	NumTurns int             `json:"num_turns"`
	CostUSD  float64         `json:"total_cost_usd"`
}

type claudeParser struct {
	progress func(Progress)
	lines    lineSplitter
	res      Result
	// lastText is the last assistant text, the summary if no result line
	// ever comes (the agent was killed).
	lastText string
}

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
				c.progress(Progress{Kind: ProgressToolUse, Tool: Truncate(part.Name, 128), Input: inputSummary(part.Input)})
			}
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
	sub := l.Subtype
	if sub == "" || sub == "success" {
		sub = "error"
	}
	msg = oneLine(msg)
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
