// Package agenttest runs scripted model endpoints on loopback, so that tests
// can drive the real agent CLIs (Claude Code, Gemini CLI, Codex, opencode)
// without a real model: each endpoint speaks one provider's wire protocol
// and answers the agent's requests from a script (a tool call, then final
// text), or with an HTTP error, and records what it was asked.
package agenttest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// Reply is one scripted answer of a model endpoint: a tool call or final
// text.
type Reply struct {
	Text string    // assistant text; with Tool, said before the call
	Tool *ToolCall // a call of one of the agent's tools
	// InputTokens and OutputTokens are the usage reported; defaults 100, 20.
	InputTokens, OutputTokens int
}

// ToolCall is a call of the agent's tool Name with Input.
type ToolCall struct {
	Name  string
	Input map[string]any
}

// AnthropicRequest is what the Anthropic endpoint recorded of one request;
// its key is x-api-key or a bearer token.
type AnthropicRequest struct {
	Request
	// Session is the X-Claude-Code-Session-Id header, if any.
	Session string
	// Messages is the number of messages in the request's conversation.
	Messages int
	// System is the request's system prompt, flattened to text.
	System string
	// LastUser is the text of the last user message (tool results included).
	LastUser string
	// Tools are the names of the tools the request offers the model.
	Tools []string
}

// AnthropicOptions configure an Anthropic endpoint.
type AnthropicOptions = Options[AnthropicRequest]

// Anthropic is a scripted Anthropic Messages API (POST /v1/messages, with
// and without "stream": true) on loopback. Its URL is http://ADDR, for
// ANTHROPIC_BASE_URL.
type Anthropic struct {
	endpoint[AnthropicRequest]
}

// MustAnthropic starts an Anthropic endpoint, stopped when tb ends.
func MustAnthropic(tb testing.TB, opts AnthropicOptions) *Anthropic {
	tb.Helper()
	a := &Anthropic{}
	a.start(tb, "anthropic", opts, "", a.serve)
	return a
}

// anthropicBody is the part of a Messages request the endpoint reads.
type anthropicBody struct {
	Model    string            `json:"model"`
	Stream   bool              `json:"stream"`
	Tools    []json.RawMessage `json:"tools"`
	System   json.RawMessage   `json:"system"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

func (a *Anthropic) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, "/v1/messages") {
		// HEAD / and the like: a reachability probe.
		w.WriteHeader(http.StatusOK)
		return
	}
	var body anthropicBody
	readBody(r, &body)
	key := r.Header.Get("x-api-key")
	if key == "" {
		key = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	}
	req := AnthropicRequest{
		Request:  newRequest(r, body.Model, body.Stream, len(body.Tools) > 0, a.keyOK(key)),
		Session:  r.Header.Get("X-Claude-Code-Session-Id"),
		Messages: len(body.Messages),
		System:   flatten(body.System),
	}
	if n := len(body.Messages); n > 0 {
		req.LastUser = flatten(body.Messages[n-1].Content)
	}
	for _, raw := range body.Tools {
		var t struct {
			Name string `json:"name"`
		}
		if json.Unmarshal(raw, &t) == nil {
			req.Tools = append(req.Tools, t.Name)
		}
	}

	count := strings.HasSuffix(r.URL.Path, "/count_tokens")
	status, reply, _ := a.answer(&req, &req.Request, req.Main && !count)
	if status != 0 {
		writeAnthropicError(w, status)
		return
	}
	if count {
		writeJSON(w, http.StatusOK, map[string]any{"input_tokens": 100})
		return
	}
	msg := anthropicMessage(body.Model, reply, req.Reply)
	if !body.Stream {
		writeJSON(w, http.StatusOK, msg)
		return
	}
	streamAnthropic(w, msg)
}

// anthropicMessage is reply as a Messages API response object.
func anthropicMessage(model string, reply Reply, n int) map[string]any {
	in, out := reply.tokens()
	var content []map[string]any
	if reply.Text != "" {
		content = append(content, map[string]any{"type": "text", "text": reply.Text})
	}
	stop := "end_turn"
	if reply.Tool != nil {
		content = append(content, map[string]any{"type": "tool_use", "id": fmt.Sprintf("toolu_%02d", n), "name": reply.Tool.Name, "input": reply.Tool.input()})
		stop = "tool_use"
	}
	if model == "" {
		model = "claude-sonnet-4-5"
	}
	return map[string]any{
		"id": fmt.Sprintf("msg_%02d", n), "type": "message", "role": "assistant", "model": model,
		"content": content, "stop_reason": stop, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": in, "output_tokens": out, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
	}
}

// streamAnthropic writes msg as the Messages API's server-sent events:
// message_start, per content block start/delta/stop, message_delta,
// message_stop.
func streamAnthropic(w http.ResponseWriter, msg map[string]any) {
	send := eventStream(w)
	usage := msg["usage"].(map[string]any)
	start := map[string]any{}
	for k, v := range msg {
		start[k] = v
	}
	start["content"] = []any{}
	start["stop_reason"] = nil
	start["usage"] = map[string]any{"input_tokens": usage["input_tokens"], "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
	send("message_start", map[string]any{"message": start})
	for i, block := range msg["content"].([]map[string]any) {
		switch block["type"] {
		case "text":
			send("content_block_start", map[string]any{"index": i, "content_block": map[string]any{"type": "text", "text": ""}})
			send("content_block_delta", map[string]any{"index": i, "delta": map[string]any{"type": "text_delta", "text": block["text"]}})
		case "tool_use":
			send("content_block_start", map[string]any{"index": i, "content_block": map[string]any{"type": "tool_use", "id": block["id"], "name": block["name"], "input": map[string]any{}}})
			in, _ := json.Marshal(block["input"])
			send("content_block_delta", map[string]any{"index": i, "delta": map[string]any{"type": "input_json_delta", "partial_json": string(in)}})
		}
		send("content_block_stop", map[string]any{"index": i})
	}
	send("message_delta", map[string]any{"delta": map[string]any{"stop_reason": msg["stop_reason"], "stop_sequence": nil}, "usage": map[string]any{"output_tokens": usage["output_tokens"]}})
	send("message_stop", map[string]any{})
}

// writeAnthropicError answers with status and the API's error body.
func writeAnthropicError(w http.ResponseWriter, status int) {
	typ, msg := "api_error", "Internal server error"
	switch status {
	case http.StatusUnauthorized:
		typ, msg = "authentication_error", "invalid x-api-key"
	case http.StatusForbidden:
		typ, msg = "permission_error", "Your API key does not have permission to use the specified resource."
	case http.StatusTooManyRequests:
		typ, msg = "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"
		w.Header().Set("Retry-After", "0")
	case 529:
		typ, msg = "overloaded_error", "Overloaded"
	}
	w.Header().Set("request-id", "req_scripted")
	writeJSON(w, status, map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}})
}

// flatten is a system prompt or message content as text: a string as is,
// an array of blocks as their text (and tool results' content) joined.
func flatten(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []struct {
		Type    string          `json:"type"`
		Text    string          `json:"text"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(raw, &blocks) != nil {
		return ""
	}
	var parts []string
	for _, b := range blocks {
		switch {
		case b.Text != "":
			parts = append(parts, b.Text)
		case len(b.Content) > 0:
			parts = append(parts, flatten(b.Content))
		}
	}
	return strings.Join(parts, "\n")
}
