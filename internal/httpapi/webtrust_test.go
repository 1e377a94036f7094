package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/webhook"
	"github.com/corral-dev/corral/internal/workspace"
)

// reached is a Backend that records which of its methods a request reached.
type reached struct {
	stub
	mu  sync.Mutex
	hit []string
}

func (b *reached) mark(name string) {
	b.mu.Lock()
	b.hit = append(b.hit, name)
	b.mu.Unlock()
}

// take returns the methods reached since the last call.
func (b *reached) take() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.hit
	b.hit = nil
	return h
}

func (b *reached) SessionExec(context.Context, service.SessionExecRequest, func(string, []byte)) (service.SessionExecResult, error) {
	return service.SessionExecResult{}, nil
}
func (b *reached) Execute(context.Context, service.ExecRequest) (service.ExecResult, error) {
	b.mark("exec")
	return service.ExecResult{}, nil
}
func (b *reached) Spawn(context.Context, service.SpawnRequest) (task.Task, bool, error) {
	b.mark("spawn")
	return task.Task{ID: "task-1", Status: task.Queued}, false, nil
}

func (b *reached) List(context.Context, service.ListRequest) (service.ListPage, error) {
	b.mark("list")
	return service.ListPage{}, nil
}

func (b *reached) Cancel(_ context.Context, id string) (task.Task, error) {
	b.mark("cancel")
	return task.Task{ID: id}, nil
}

func (b *reached) WriteWorkspace(context.Context, string, []byte) (workspace.Entry, error) {
	b.mark("write")
	return workspace.Entry{}, nil
}

func (b *reached) WorkerComplete(context.Context, webhook.Signed) (string, error) {
	b.mark("complete")
	return "evt_1", nil
}

// webReq is one request of TestWebTrust.
type webReq struct {
	name        string
	method      string
	path        string
	host        string // "" keeps the URL's
	origin      string
	contentType string
	body        string
	want        int
	reach       string // the backend method it must reach ("" for none)
}

func TestWebTrust(t *testing.T) {
	b := &reached{}
	mcp := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.mark("mcp")
		w.WriteHeader(http.StatusOK)
	})
	srv := newTestServer(b, Options{
		MaxRequestBytes: 1024,
		MCP:             mcp,
		Listen:          "corral.lan:0",
		AllowedHosts:    []string{"corral.example.com", "Proxy.Example.com:8443"},
		AllowedOrigins:  []string{"https://UI.example.com/"},
	}, slogTo(io.Discard))
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	_, port, _ := net.SplitHostPort(hs.Listener.Addr().String())
	self := "http://127.0.0.1:" + port
	spawn := `{"task_description":"x","command":["true"]}`

	for _, c := range []webReq{
		// The attacks: a page's simple request, and DNS rebinding.
		{name: "cross-site text/plain spawn", method: "POST", path: "/api/tasks", origin: "http://attacker.example", contentType: "text/plain", body: spawn, want: 403},
		{name: "cross-site JSON spawn", method: "POST", path: "/api/tasks", origin: "http://attacker.example", contentType: "application/json", body: spawn, want: 403},
		{name: "text/plain spawn without Origin", method: "POST", path: "/api/tasks", contentType: "text/plain", body: spawn, want: 415},
		{name: "form spawn", method: "POST", path: "/api/tasks", contentType: "application/x-www-form-urlencoded", body: "a=b", want: 415},
		{name: "spawn body with no type", method: "POST", path: "/api/tasks", body: spawn, want: 415},
		{name: "spawn in another charset", method: "POST", path: "/api/tasks", contentType: "application/json; charset=latin1", body: spawn, want: 415},
		{name: "rebound list", method: "GET", path: "/api/tasks", host: "rebind.attacker.example", want: 403},
		{name: "rebound name with our port", method: "GET", path: "/api/tasks", host: "rebind.attacker.example:" + port, want: 403},
		{name: "rebound metrics", method: "GET", path: "/metrics", host: "rebind.attacker.example", want: 403},
		{name: "rebound healthz", method: "GET", path: "/healthz", host: "rebind.attacker.example", want: 403},
		{name: "rebound mcp", method: "POST", path: "/mcp", host: "rebind.attacker.example", contentType: "application/json", body: "{}", want: 403},
		{name: "cross-site mcp", method: "POST", path: "/mcp", origin: "http://attacker.example", contentType: "application/json", body: "{}", want: 403},
		{name: "text/plain mcp", method: "POST", path: "/mcp", contentType: "text/plain", body: "{}", want: 415},
		{name: "rebound unknown route", method: "GET", path: "/api/nothing", host: "rebind.attacker.example", want: 403},
		{name: "opaque origin", method: "POST", path: "/api/tasks/task-1/cancel", origin: "null", want: 403},
		{name: "localhost on another port", method: "GET", path: "/api/tasks", host: "localhost:1", want: 403},
		{name: "unspecified address", method: "GET", path: "/api/tasks", host: "0.0.0.0:" + port, want: 403},
		{name: "loopback page on another port", method: "POST", path: "/api/tasks/task-1/cancel", origin: "http://127.0.0.1:1", want: 403},
		{name: "cross-site workspace write", method: "PUT", path: "/api/workspace/a.txt", origin: "http://attacker.example", contentType: "text/plain", body: "x", want: 403},

		// What must keep working.
		{name: "JSON spawn", method: "POST", path: "/api/tasks", contentType: "application/json", body: spawn, want: 201, reach: "spawn"},
		{name: "JSON spawn in UTF-8", method: "POST", path: "/api/tasks", contentType: "application/json; charset=UTF-8", body: spawn, want: 201, reach: "spawn"},
		{name: "same-origin spawn", method: "POST", path: "/api/tasks", origin: self, contentType: "application/json", body: spawn, want: 201, reach: "spawn"},
		{name: "cancel with no body", method: "POST", path: "/api/tasks/task-1/cancel", want: 200, reach: "cancel"},
		{name: "localhost", method: "GET", path: "/api/tasks", host: "localhost:" + port, want: 200, reach: "list"},
		{name: "IPv6 loopback", method: "GET", path: "/api/tasks", host: "[::1]:" + port, want: 200, reach: "list"},
		{name: "the listen name", method: "GET", path: "/api/tasks", host: "corral.lan:" + port, want: 200, reach: "list"},
		{name: "a listed host, any port", method: "GET", path: "/api/tasks", host: "Corral.Example.com", want: 200, reach: "list"},
		{name: "a listed host:port", method: "GET", path: "/api/tasks", host: "proxy.example.com:8443", want: 200, reach: "list"},
		{name: "a listed host on another port", method: "GET", path: "/api/tasks", host: "proxy.example.com:9443", want: 403},
		{name: "the proxy's own https page", method: "POST", path: "/api/tasks/task-1/cancel", host: "corral.example.com", origin: "https://corral.example.com", want: 200, reach: "cancel"},
		{name: "a listed origin", method: "POST", path: "/api/tasks/task-1/cancel", origin: "https://ui.example.com", want: 200, reach: "cancel"},
		{name: "raw workspace write", method: "PUT", path: "/api/workspace/a.txt", contentType: "text/plain", body: "x", want: 200, reach: "write"},
		{name: "mcp", method: "POST", path: "/mcp", contentType: "application/json", body: "{}", want: 200, reach: "mcp"},
		{name: "mcp stream", method: "GET", path: "/mcp", want: 200, reach: "mcp"},
		// The worker webhook is signed; it has no host name on its socket.
		{name: "worker webhook", method: "POST", path: "/api/webhooks/worker-complete", host: "unix", origin: "http://attacker.example", contentType: "application/json", body: "{}", want: 200, reach: "complete"},
	} {
		code, body := webCall(t, hs.URL, c)
		if code != c.want {
			t.Errorf("%s: HTTP %d %s, want %d", c.name, code, body, c.want)
		}
		got := b.take()
		if (c.reach == "" && len(got) > 0) || (c.reach != "" && (len(got) != 1 || got[0] != c.reach)) {
			t.Errorf("%s: reached %v, want %q", c.name, got, c.reach)
		}
		if code == 403 || code == 415 {
			var eb errorBody
			if err := json.Unmarshal([]byte(body), &eb); err != nil || eb.RequestID == "" || !strings.Contains(eb.Error, "http.allowed_") && !strings.Contains(eb.Error, "application/json") {
				t.Errorf("%s: error body %s, want the API's error format saying what to do", c.name, body)
			}
		}
	}
}

func TestWebhookSocketHandlerTakesNoHost(t *testing.T) {
	b := &reached{}
	hs := httptest.NewServer(newTestServer(b, Options{}, slogTo(io.Discard)).WebhookHandler())
	t.Cleanup(hs.Close)
	code, body := webCall(t, hs.URL, webReq{method: "POST", path: "/api/webhooks/worker-complete", host: "unix", contentType: "application/json", body: "{}"})
	if got := b.take(); code != 200 || len(got) != 1 {
		t.Errorf("webhook over the socket: HTTP %d %s, reached %v", code, body, got)
	}
}

func TestTheClientPassesTheChecks(t *testing.T) {
	b := &reached{}
	hs := httptest.NewServer(newTestServer(b, Options{}, slogTo(io.Discard)).Handler())
	t.Cleanup(hs.Close)
	cl := NewClient(hs.URL, "")
	ctx := context.Background()
	if _, err := cl.Cancel(ctx, "task-1"); err != nil {
		t.Errorf("cancel: %v", err)
	}
	if _, err := cl.WriteWorkspace(ctx, "a.txt", []byte("not json")); err != nil {
		t.Errorf("write workspace: %v", err)
	}
	if _, err := cl.List(ctx, service.ListRequest{}); err != nil {
		t.Errorf("list: %v", err)
	}
	if got := b.take(); len(got) != 3 {
		t.Errorf("reached %v, want cancel, write and list", got)
	}
}

func webCall(t *testing.T, base string, c webReq) (int, string) {
	t.Helper()
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	req, err := http.NewRequest(c.method, base+c.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if c.host != "" {
		req.Host = c.host
	}
	if c.origin != "" {
		req.Header.Set("Origin", c.origin)
	}
	if c.contentType != "" {
		req.Header.Set("Content-Type", c.contentType)
	}
	return roundTrip(t, req)
}

func (b *reached) ListProjects(context.Context) ([]service.Project, error) { return nil, nil }
func (b *reached) CreateProject(context.Context, service.CreateProjectRequest) (service.Project, error) {
	return service.Project{}, nil
}
func (b *reached) ListProjectFiles(context.Context, string, string, bool) ([]service.ProjectEntry, error) {
	return nil, nil
}
func (b *reached) ReadProjectFile(context.Context, string, string) (service.File, error) {
	return service.File{}, nil
}
