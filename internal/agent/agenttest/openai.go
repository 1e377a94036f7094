package agenttest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// OpenAIRequest is what the OpenAI endpoint recorded of one request; its
// key is the bearer token.
type OpenAIRequest struct {
	Request
	// Tools are the names of the tools offered.
	Tools []string
	// Input is the number of items in the request's input.
	Input int
	// LastOutput is the output of the last function_call_output item in
	// the input (what the CLI's tool gave back to the model), as JSON,
	// clipped to 2 KiB: "" if there is none.
	LastOutput string
	// WebSocket says the request came as a response.create message over a
	// WebSocket (GET .../responses upgraded), not as a POST. Such a request
	// may continue the connection's previous response (previous_response_id),
	// when Input counts only the items added since.
	WebSocket bool
	// Prewarm says the request was a response.create with "generate":
	// false, with which Codex readies a WebSocket before the turn's first
	// request: it is answered with a completed response without output, and
	// is never main.
	Prewarm bool
}

// OpenAIOptions configure an OpenAI endpoint; a reply's ToolCall Input is
// sent as the call's JSON arguments.
type OpenAIOptions = Options[OpenAIRequest]

// OpenAI is a scripted OpenAI Responses API on loopback: POST
// /v1/responses, streamed as server-sent events, and the same over a
// WebSocket (GET /v1/responses upgraded; openai_ws.go). Its URL is
// http://ADDR/v1, for OPENAI_BASE_URL.
type OpenAI struct {
	endpoint[OpenAIRequest]
}

// MustOpenAI starts an OpenAI endpoint, stopped when tb ends.
func MustOpenAI(tb testing.TB, opts OpenAIOptions) *OpenAI {
	tb.Helper()
	o := &OpenAI{}
	o.start(tb, "openai", opts, "/v1", o.serve)
	return o
}

// responsesBody is the part of a Responses request the endpoint reads.
type responsesBody struct {
	Model  string            `json:"model"`
	Stream bool              `json:"stream"`
	Input  []json.RawMessage `json:"input"`
	Tools  []struct {
		Type string `json:"type"`
		Name string `json:"name"`
	} `json:"tools"`
	// Type is a WebSocket message's type ("response.create"); a POST's
	// body has none.
	Type string `json:"type"`
	// Generate false asks for no output: a WebSocket's prewarm.
	Generate *bool `json:"generate"`
}

func (o *OpenAI) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/models") {
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{}, "models": []any{}})
		return
	}
	if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/responses") {
		o.serveWebSocket(w, r)
		return
	}
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/responses") {
		w.WriteHeader(http.StatusNotFound)
		return
	}
	var body responsesBody
	readBody(r, &body)
	req := o.responsesRequest(r, body)
	status, reply, n := o.answer(&req, &req.Request, req.Main)
	if status != 0 {
		writeOpenAIError(w, status)
		return
	}
	responseEvents(body.Model, reply, n, eventStream(w))
}

// bearerKey is the key r carries as a bearer token, "" if none.
func bearerKey(r *http.Request) string {
	key, bearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !bearer {
		return ""
	}
	return key
}

// responsesRequest is what the endpoint records of a Responses request r with
// body (a POST's body, or a response.create message of r's WebSocket).
func (o *OpenAI) responsesRequest(r *http.Request, body responsesBody) OpenAIRequest {
	req := OpenAIRequest{
		Request: newRequest(r, body.Model, body.Stream, len(body.Tools) > 0, o.keyOK(bearerKey(r))),
		Input:   len(body.Input),
	}
	for _, raw := range body.Input {
		var item struct {
			Type   string          `json:"type"`
			Output json.RawMessage `json:"output"`
		}
		if json.Unmarshal(raw, &item) == nil && item.Type == "function_call_output" {
			req.LastOutput = string(item.Output[:min(len(item.Output), 2048)])
		}
	}
	for _, t := range body.Tools {
		req.Tools = append(req.Tools, t.Name)
	}
	return req
}

// responseEvents sends reply, the n-th response, as the Responses API
// streams it, to event (server-sent events, or a WebSocket's messages):
// response.created, per output item added/delta/done, response.completed.
func responseEvents(model string, reply Reply, n int, event func(typ string, data map[string]any)) {
	in, out := reply.tokens()
	seq := 0
	send := func(typ string, data map[string]any) {
		data["sequence_number"] = seq
		seq++
		event(typ, data)
	}
	id := fmt.Sprintf("resp_%02d", n)
	resp := map[string]any{"id": id, "object": "response", "created_at": time.Now().Unix(), "model": model, "status": "in_progress", "output": []any{}}
	send("response.created", map[string]any{"response": resp})
	items := []any{}
	if reply.Text != "" {
		msgID := fmt.Sprintf("msg_%02d", n)
		item := map[string]any{"type": "message", "id": msgID, "role": "assistant", "status": "in_progress", "content": []any{}}
		idx := len(items)
		send("response.output_item.added", map[string]any{"output_index": idx, "item": item})
		send("response.content_part.added", map[string]any{"item_id": msgID, "output_index": idx, "content_index": 0, "part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
		send("response.output_text.delta", map[string]any{"item_id": msgID, "output_index": idx, "content_index": 0, "delta": reply.Text})
		send("response.output_text.done", map[string]any{"item_id": msgID, "output_index": idx, "content_index": 0, "text": reply.Text})
		part := map[string]any{"type": "output_text", "text": reply.Text, "annotations": []any{}}
		send("response.content_part.done", map[string]any{"item_id": msgID, "output_index": idx, "content_index": 0, "part": part})
		done := map[string]any{"type": "message", "id": msgID, "role": "assistant", "status": "completed", "content": []any{part}}
		send("response.output_item.done", map[string]any{"output_index": idx, "item": done})
		items = append(items, done)
	}
	if reply.Tool != nil {
		args, _ := json.Marshal(reply.Tool.input())
		fcID := fmt.Sprintf("fc_%02d", n)
		callID := fmt.Sprintf("call_%02d", n)
		idx := len(items)
		item := map[string]any{"type": "function_call", "id": fcID, "call_id": callID, "name": reply.Tool.Name, "arguments": "", "status": "in_progress"}
		send("response.output_item.added", map[string]any{"output_index": idx, "item": item})
		send("response.function_call_arguments.delta", map[string]any{"item_id": fcID, "output_index": idx, "delta": string(args)})
		send("response.function_call_arguments.done", map[string]any{"item_id": fcID, "output_index": idx, "arguments": string(args)})
		done := map[string]any{"type": "function_call", "id": fcID, "call_id": callID, "name": reply.Tool.Name, "arguments": string(args), "status": "completed"}
		send("response.output_item.done", map[string]any{"output_index": idx, "item": done})
		items = append(items, done)
	}
	resp["status"] = "completed"
	resp["output"] = items
	resp["usage"] = map[string]any{
		"input_tokens": in, "input_tokens_details": map[string]any{"cached_tokens": 0},
		"output_tokens": out, "output_tokens_details": map[string]any{"reasoning_tokens": 0},
		"total_tokens": in + out,
	}
	send("response.completed", map[string]any{"response": resp})
}

// writeOpenAIError answers with status and the API's error body.
func writeOpenAIError(w http.ResponseWriter, status int) {
	if status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "0")
	}
	writeJSON(w, status, map[string]any{"error": openAIError(status)})
}

// openAIError is the API's error object for an answer with status.
func openAIError(status int) map[string]any {
	typ, code, msg := "server_error", "server_error", "The server had an error while processing your request."
	switch status {
	case http.StatusUnauthorized:
		typ, code, msg = "invalid_request_error", "invalid_api_key", "Incorrect API key provided."
	case http.StatusTooManyRequests:
		typ, code, msg = "rate_limit_exceeded", "rate_limit_exceeded", "Rate limit reached for requests."
	}
	return map[string]any{"message": msg, "type": typ, "param": nil, "code": code}
}
