//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/app"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore/postgres/postgrestest"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestOnPostgres: a server whose store is PostgreSQL (store.driver
// postgres) runs a task, and its log is in the database, not in the data
// root: a server started again on both knows the task and its end. A
// second server on the database and the data root joins the first as a
// replica and serves the same tasks; a server on SQLite cannot take the
// data root the replicas share.
func TestOnPostgres(t *testing.T) {
	testenv.RequireBwrap(t)
	db := postgrestest.New(t)
	env := []string{"CORRAL_STORE_DRIVER=postgres", "CORRAL_STORE_DSN=" + db.DSN, "CORRAL_API_TOKEN=" + strings.Repeat("t", 32)}
	data := testenv.TempDir(t)
	t.Cleanup(func() { killSandboxes(t, data) })
	started := func() (*server, func()) {
		a, stop := runApp(t, testConfig(t, env, data), nil, nil)
		url := "http://" + a.Addr()
		return &server{app: a, client: httpapi.NewClient(url, a.Token()), url: url, data: data, token: a.Token()}, stop
	}
	s, stop := started()
	tk := s.spawn(t, "on postgres", "sh", "-c", "echo hi > output/hi.txt")
	s.waitSuccess(t, tk.ID, time.Minute, "hi.txt")

	b, stopB := started()
	if got, err := b.client.Get(context.Background(), tk.ID); err != nil || got.Status != task.Success {
		t.Errorf("the task on a second replica: %+v, %v; want it, succeeded", got, err)
	}
	tk2 := b.spawn(t, "on the second replica", "sh", "-c", "echo two > output/two.txt")
	s.waitSuccess(t, tk2.ID, time.Minute, "two.txt") // seen through the first
	// A session made on the second runs its commands there, sent to the
	// first, with the admin's token and with its own.
	sess := mustCreateSession(t, b.client)
	for name, c := range map[string]*httpapi.Client{"admin": s.client, "session": httpapi.NewClient(s.url, sess.Token)} {
		var out strings.Builder
		end, err := c.ExecSession(context.Background(), sess.SessionID, httpapi.ExecBody{Command: shell("echo from $CORRAL_SERVER_SOCKET_DIR$(hostname)")},
			func(ch httpapi.ExecChunk) error { out.Write(ch.Bytes()); return nil })
		if err != nil || end.ExitCode != 0 || !strings.HasPrefix(out.String(), "from ") {
			t.Errorf("a command sent to the first replica with the %s token for a session on the second: %+v %q %v", name, end, out.String(), err)
		}
	}
	// So does workspace_exec over MCP on the first, its output streamed
	// back as progress.
	cs := connectMCP(t, s)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "workspace_exec",
		Arguments: map[string]any{"session_id": sess.SessionID, "command": "echo mcp-$((6*7)); echo err >&2; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	var ran service.SessionExecResult
	if b, _ := json.Marshal(res.StructuredContent); json.Unmarshal(b, &ran) != nil || res.IsError || ran.ExitCode != 3 || ran.Stdout != "mcp-42\n" || ran.Stderr != "err\n" {
		t.Errorf("workspace_exec on the first replica for a session on the second: %+v (error %v, %s)", ran, res.IsError, mcpText(res))
	}
	// A caller the first replica refuses is not forwarded: another
	// session's token, or none that is a session's.
	other := mustCreateSession(t, s.client)
	for name, token := range map[string]string{"another session's": other.Token, "a wrong": "sess_" + strings.Repeat("0", 48)} {
		_, err := httpapi.NewClient(s.url, token).ExecSession(context.Background(), sess.SessionID, httpapi.ExecBody{Command: shell("true")},
			func(httpapi.ExecChunk) error { return nil })
		if !errors.Is(err, errdefs.ErrPermissionDenied) && !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("%s token for a session on the other replica: %v, want refused before any forwarding", name, err)
		}
	}
	stopB()
	if a, err := app.New(context.Background(), testConfig(t, nil, data), slog.New(slog.DiscardHandler), app.Options{Binary: corralBin}); err == nil {
		a.Close()
		t.Fatal("a server on SQLite started on the replicas' data root")
	} else if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "in use") {
		t.Errorf("a server on SQLite on the replicas' data root: %v, want refused, saying why", err)
	}

	stop()
	s, _ = started()
	got, err := s.client.Get(context.Background(), tk.ID)
	if err != nil || got.Status != task.Success || len(got.OutputFiles) != 1 {
		t.Errorf("after a restart on the same database: %+v, %v; want the task, succeeded with its file", got, err)
	}
	if _, err := os.Stat(filepath.Join(data, "corral.db")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the data root has a corral.db (%v): the log went to SQLite", err)
	}
}

// connectMCP connects the MCP SDK's client to s's /mcp with s's token.
func connectMCP(t *testing.T, s *server) *mcp.ClientSession {
	t.Helper()
	hc := &http.Client{Transport: bearer{token: s.token}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: s.url + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// bearer sends every request with token as its bearer token.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

func mcpText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			b.WriteString(t.Text)
		}
	}
	return b.String()
}
