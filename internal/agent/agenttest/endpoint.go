package agenttest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// Request is what every endpoint records of a request; each endpoint's
// own request type adds what its provider's requests carry.
type Request struct {
	At     time.Time
	Path   string // the URL path
	Model  string
	Stream bool
	// Main is set for the agent loop's requests (those that offer tools);
	// a CLI also sends side requests (titles, summaries) without tools.
	Main bool
	// Reply is the index of the scripted reply given, -1 for none.
	Reply int
	// KeyOK says whether the request carried the expected key.
	KeyOK bool
}

// Options configure a scripted endpoint whose requests it records as R.
type Options[R any] struct {
	// Key is the API key the endpoint accepts; a request with another gets
	// 401, with the provider's error body, as the real API does.
	Key string
	// Replies answer the main requests in order; past the end, the last one
	// is repeated.
	Replies []Reply
	// Status, if set, answers every request with this HTTP status and an
	// error body of the provider's shape (401, 429, 500, 529, ...).
	Status int
	// Addr is where to listen; default "127.0.0.1:0".
	Addr string
	// Respond, if set, computes the reply to each main request instead of
	// Replies, for scripts whose next step depends on a tool's result.
	Respond func(R) Reply
}

// endpoint is what the scripted endpoints share: the loopback server, its
// options, the record of requests (of type R) and the position in the
// script.
type endpoint[R any] struct {
	URL  string // http://Addr and the provider's base path, for the agent's base URL
	Addr string // host:port, for an egress allowlist

	opts Options[R]
	// ctx ends when the endpoint stops: connections the server no longer
	// tracks (upgraded to a WebSocket) end with it.
	ctx   context.Context
	mu    sync.Mutex
	next  int
	reqs  []R
	asked []Request // the Request of each of reqs
}

// start listens on opts.Addr (default "127.0.0.1:0") and serves h until tb
// ends; it sets Addr to the address listened on, and URL to it with
// basePath.
func (e *endpoint[R]) start(tb testing.TB, name string, opts Options[R], basePath string, h http.HandlerFunc) {
	tb.Helper()
	e.opts = opts
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatalf("listen for the %s endpoint: %v", name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.ctx = ctx
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	tb.Cleanup(func() {
		srv.Close()
		cancel()
	})
	e.Addr = ln.Addr().String()
	e.URL = "http://" + e.Addr + basePath
}

// newRequest is what every endpoint records of r, with the model asked
// for, whether it streams, whether it is main and whether its key was
// right; no reply given yet.
func newRequest(r *http.Request, model string, stream, main, keyOK bool) Request {
	return Request{At: time.Now(), Path: r.URL.Path, Model: model, Stream: stream, Main: main, Reply: -1, KeyOK: keyOK}
}

// keyOK says whether key is the one the endpoint accepts (any, if none is
// set).
func (e *endpoint[R]) keyOK(key string) bool {
	return e.opts.Key == "" || key == e.opts.Key
}

// Requests returns what the endpoint was asked, in order.
func (e *endpoint[R]) Requests() []R {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]R(nil), e.reqs...)
}

// Asked returns what every request the endpoint was asked carried, in
// order: the part of Requests all endpoints record.
func (e *endpoint[R]) Asked() []Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Request(nil), e.asked...)
}

// answer chooses the answer to req and records req, with base (req's
// Request) told the index of the scripted reply given. status is the HTTP
// error to answer with, 0 for none: the options' Status, or 401 for a
// request without the key. A request that is not main (or not scripted)
// gets the reply "ok". n is the number of requests recorded.
func (e *endpoint[R]) answer(req *R, base *Request, main bool) (status int, reply Reply, n int) {
	reply = Reply{Text: "ok"}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case !base.KeyOK:
		status = http.StatusUnauthorized
	case e.opts.Status != 0:
		status = e.opts.Status
	case !main:
	case e.opts.Respond != nil:
		base.Reply = e.next
		reply = e.opts.Respond(*req)
		e.next++
	case len(e.opts.Replies) > 0:
		base.Reply = min(e.next, len(e.opts.Replies)-1)
		reply = e.opts.Replies[base.Reply]
		e.next++
	}
	e.reqs = append(e.reqs, *req)
	e.asked = append(e.asked, *base)
	return status, reply, len(e.reqs)
}

// readBody decodes as much of r's JSON body into v as it can.
func readBody(r *http.Request, v any) {
	data, _ := io.ReadAll(io.LimitReader(r.Body, 32<<20))
	json.Unmarshal(data, v)
}

// tokens are the usage reply reports, defaults filled in.
func (r Reply) tokens() (in, out int) {
	in, out = r.InputTokens, r.OutputTokens
	if in == 0 {
		in = 100
	}
	if out == 0 {
		out = 20
	}
	return in, out
}

// input is the call's Input, an empty object if nil.
func (c *ToolCall) input() map[string]any {
	if c.Input == nil {
		return map[string]any{}
	}
	return c.Input
}

// writeJSON answers with status and v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(v)
	w.Write(b)
}

// eventStream starts a server-sent event stream on w and returns a function
// that writes one event of type typ (also set as data's "type") and flushes.
func eventStream(w http.ResponseWriter) func(typ string, data map[string]any) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	return func(typ string, data map[string]any) {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, eventJSON(typ, data))
		if fl != nil {
			fl.Flush()
		}
	}
}

// eventJSON is an event of type typ as the API streams it: data, with
// "type" set to typ, as JSON.
func eventJSON(typ string, data map[string]any) []byte {
	data["type"] = typ
	b, _ := json.Marshal(data)
	return b
}
