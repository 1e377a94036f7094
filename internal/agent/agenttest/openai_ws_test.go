package agenttest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"
)

// dialResponses opens the endpoint's Responses WebSocket with key, as
// Codex does.
func dialResponses(ctx context.Context, url, key string) (*websocket.Conn, *http.Response, error) {
	return websocket.Dial(ctx, url+"/responses", &websocket.DialOptions{HTTPHeader: http.Header{
		"Authorization": {"Bearer " + key},
		"Openai-Beta":   {"responses_websockets=2026-02-06"},
	}})
}

// wsEvent is an event the endpoint sent over the WebSocket: its type and
// the whole message.
type wsEvent struct {
	typ, raw string
}

// sendCreate sends msg and reads the events answering it, up to the
// response.completed or error that ends them.
func sendCreate(ctx context.Context, t *testing.T, c *websocket.Conn, msg string) []wsEvent {
	t.Helper()
	if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		t.Fatal(err)
	}
	var evs []wsEvent
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("after %d events: %v", len(evs), err)
		}
		var ev struct {
			Type string `json:"type"`
		}
		if typ != websocket.MessageText || json.Unmarshal(data, &ev) != nil {
			t.Fatalf("message %d is not a JSON text message: %v %q", len(evs), typ, data)
		}
		evs = append(evs, wsEvent{ev.Type, string(data)})
		if ev.Type == "response.completed" || ev.Type == "error" {
			return evs
		}
	}
}

func eventTypes(evs []wsEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.typ)
	}
	return out
}

func eventsText(evs []wsEvent) string {
	var b strings.Builder
	for _, e := range evs {
		b.WriteString(e.raw + "\n")
	}
	return b.String()
}

// sseTypes are the types of a server-sent event stream's events, in
// order.
func sseTypes(stream string) []string {
	var out []string
	for line := range strings.Lines(stream) {
		if typ, ok := strings.CutPrefix(strings.TrimSpace(line), "event: "); ok {
			out = append(out, typ)
		}
	}
	return out
}

// TestOpenAIWebSocket drives the Responses API over a WebSocket as Codex
// does: a wrong key refused on the handshake; a prewarm (generate false)
// answered without output and taking no reply; the script's replies, in
// order, as the same events a POST streams, one per message; a message of
// another type left unanswered.
func TestOpenAIWebSocket(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	call := Reply{Text: "calling", Tool: &ToolCall{Name: "exec_command", Input: map[string]any{"cmd": "ls"}}}
	o := MustOpenAI(t, OpenAIOptions{Key: "k", Replies: []Reply{call, {Text: "done"}}})

	_, resp, err := dialResponses(ctx, o.URL, "wrong")
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong key: %v, %+v; want the handshake refused with 401", err, resp)
	}
	if b, _ := io.ReadAll(resp.Body); !strings.Contains(string(b), "invalid_api_key") {
		t.Errorf("wrong key's answer: %s", b)
	}

	c, _, err := dialResponses(ctx, o.URL, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	tools := `"tools":[{"type":"function","name":"exec_command"}]`
	prewarm := sendCreate(ctx, t, c, `{"type":"response.create","model":"gpt-5","stream":true,"generate":false,"input":[{"role":"user"}],`+tools+`}`)
	if diff := cmp.Diff([]string{"response.created", "response.completed"}, eventTypes(prewarm)); diff != "" {
		t.Errorf("prewarm's events (-want +got):\n%s", diff)
	}
	if last := prewarm[len(prewarm)-1].raw; !strings.Contains(last, `"output":[]`) || !strings.Contains(last, `"status":"completed"`) {
		t.Errorf("prewarm's response.completed: %s", last)
	}

	// Newer clients acknowledge a response; nothing answers that, so the
	// next events read are the next request's.
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"response.processed","response_id":"resp_02"}`)); err != nil {
		t.Fatal(err)
	}
	first := sendCreate(ctx, t, c, `{"type":"response.create","model":"gpt-5","stream":true,"previous_response_id":"resp_02","input":[{"role":"user"}],`+tools+`}`)
	for _, want := range []string{`"delta":"calling"`, `"type":"function_call"`, `"arguments":"{\"cmd\":\"ls\"}"`, `"input_tokens":100`, `"id":"resp_03"`} {
		if !strings.Contains(eventsText(first), want) {
			t.Errorf("first reply lacks %s:\n%s", want, eventsText(first))
		}
	}
	body := `{"model":"gpt-5","stream":true,"input":[{"role":"user"}],` + tools + `}`
	code, stream := scriptPost(t, MustOpenAI(t, OpenAIOptions{Replies: []Reply{call}}).URL+"/responses", "", body, "Authorization")
	if diff := cmp.Diff(sseTypes(stream), eventTypes(first)); code != http.StatusOK || diff != "" {
		t.Errorf("the WebSocket's events differ from a POST's (%d) (-POST +WebSocket):\n%s", code, diff)
	}
	second := sendCreate(ctx, t, c, `{"type":"response.create","model":"gpt-5","stream":true,"previous_response_id":"resp_03","input":[{"type":"function_call_output","call_id":"call_03","output":"exit 0"}],`+tools+`}`)
	if text := eventsText(second); !strings.Contains(text, `"text":"done"`) || strings.Contains(text, "function_call") {
		t.Errorf("second reply:\n%s", text)
	}
	c.Close(websocket.StatusNormalClosure, "")

	type seen struct {
		Main, KeyOK, WebSocket, Prewarm bool
		Reply, Input                    int
		LastOutput                      string
	}
	var got []seen
	for _, r := range o.Requests() {
		if r.KeyOK && (r.Model != "gpt-5" || !r.Stream || len(r.Tools) != 1 || r.Path != "/v1/responses") {
			t.Errorf("request %+v, want gpt-5 streamed with its tool at /v1/responses", r)
		}
		got = append(got, seen{r.Main, r.KeyOK, r.WebSocket, r.Prewarm, r.Reply, r.Input, r.LastOutput})
	}
	want := []seen{
		{WebSocket: true, Reply: -1},
		{KeyOK: true, WebSocket: true, Prewarm: true, Reply: -1, Input: 1},
		{Main: true, KeyOK: true, WebSocket: true, Reply: 0, Input: 1},
		{Main: true, KeyOK: true, WebSocket: true, Reply: 1, Input: 1, LastOutput: `"exit 0"`},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests recorded (-want +got):\n%s", diff)
	}
}

// TestOpenAIWebSocketStatus: an endpoint answering with an error status
// answers each request on the WebSocket with an error event carrying the
// status and the API's error, as the API does once the connection is up.
func TestOpenAIWebSocketStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	o := MustOpenAI(t, OpenAIOptions{Status: http.StatusTooManyRequests})
	c, _, err := dialResponses(ctx, o.URL, "any")
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	evs := sendCreate(ctx, t, c, `{"type":"response.create","model":"gpt-5","stream":true,"input":[],"tools":[{"type":"function","name":"exec_command"}]}`)
	var ev struct {
		Type   string
		Status int
		Error  struct{ Code string }
	}
	if len(evs) != 1 || json.Unmarshal([]byte(evs[0].raw), &ev) != nil || ev.Status != http.StatusTooManyRequests || ev.Error.Code != "rate_limit_exceeded" {
		t.Errorf("events %+v, want one error event with 429 and rate_limit_exceeded", evs)
	}
	if reqs := o.Requests(); len(reqs) != 1 || !reqs[0].WebSocket || reqs[0].Reply != -1 {
		t.Errorf("requests %+v, want the one, unanswered", reqs)
	}
}
