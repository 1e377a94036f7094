package agenttest

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// endpoint is what the scripted endpoints share: the loopback server, the
// record of requests (of type R) and the position in the script.
type endpoint[R any] struct {
	mu   sync.Mutex
	next int
	reqs []R
}

// start listens on addr (default "127.0.0.1:0") and serves h until tb ends.
// It returns the address listened on, host:port.
func (e *endpoint[R]) start(tb testing.TB, name, addr string, h http.HandlerFunc) string {
	tb.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatalf("listen for the %s endpoint: %v", name, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	tb.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// Requests returns what the endpoint was asked, in order.
func (e *endpoint[R]) Requests() []R {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]R(nil), e.reqs...)
}

// script is how an endpoint answers: with status for every request if set,
// else a main request with respond's reply if set, else with the next of
// replies (the last one repeated).
type script[R any] struct {
	status  int
	replies []Reply
	respond func(R) Reply
}

// answer chooses the answer to req and records req, with *idx (req's Reply
// field) set to the index of the scripted reply given. status is the HTTP
// error to answer with, 0 for none; a request that is not main (or not
// scripted) gets the reply "ok". n is the number of requests recorded.
func (e *endpoint[R]) answer(req *R, idx *int, keyOK, main bool, s script[R]) (status int, reply Reply, n int) {
	reply = Reply{Text: "ok"}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case !keyOK:
		status = http.StatusUnauthorized
	case s.status != 0:
		status = s.status
	case !main:
	case s.respond != nil:
		*idx = e.next
		reply = s.respond(*req)
		e.next++
	case len(s.replies) > 0:
		*idx = min(e.next, len(s.replies)-1)
		reply = s.replies[*idx]
		e.next++
	}
	e.reqs = append(e.reqs, *req)
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
		data["type"] = typ
		b, _ := json.Marshal(data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, b)
		if fl != nil {
			fl.Flush()
		}
	}
}
