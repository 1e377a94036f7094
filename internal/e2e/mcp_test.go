//go:build integration

package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/session"
	"github.com/corral-dev/corral/internal/testenv"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpReport is what test/mcp/client.mjs prints.
type mcpReport struct {
	Failures []string `json:"failures"`
	Tools    []string `json:"tools"`
	TaskID   string   `json:"task_id"`
	Status   string   `json:"status"`
	Rows     string   `json:"rows"`
	Progress []string `json:"progress"`
	Outside  struct {
		IsError bool   `json:"isError"`
		Text    string `json:"text"`
	} `json:"outside"`
}

// requireMCPClient needs node and the TypeScript SDK installed in
// test/mcp (CI runs npm ci there), and returns that directory.
func requireMCPClient(t *testing.T) string {
	t.Helper()
	testenv.RequireBinary(t, "node", "apt-get install -y nodejs npm")
	dir, err := filepath.Abs(filepath.Join("..", "..", "test", "mcp"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		testenv.Missing(t, "the MCP TypeScript SDK in test/mcp/node_modules (run: cd test/mcp && npm ci)")
	}
	return dir
}

// runMCPClient runs client.mjs with args and decodes its report.
func runMCPClient(t *testing.T, dir string, env []string, args ...string) mcpReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{filepath.Join(dir, "client.mjs")}, args...)...)
	cmd.Dir = t.TempDir() // no corral.yaml from the working directory
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	t.Logf("client.mjs stderr:\n%s", stderr.String())
	var r mcpReport
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("client.mjs (%v) printed %q: %v", runErr, stdout.String(), err)
	}
	if runErr != nil || len(r.Failures) > 0 {
		t.Fatalf("client.mjs %v: %v\nfailures:\n%s", args, runErr, strings.Join(r.Failures, "\n"))
	}
	return r
}

// checkReport checks the parts of a report the Go side can verify against
// the server itself.
func checkReport(t *testing.T, s *server, r mcpReport) {
	t.Helper()
	if r.Status != "success" || strings.TrimSpace(r.Rows) != "3" {
		t.Errorf("task %s: status %s rows %q", r.TaskID, r.Status, r.Rows)
	}
	if defs, err := s.client.Tools(context.Background()); err != nil || len(r.Tools) != len(defs) {
		t.Errorf("tools %v, want the %d of the catalogue (%v)", r.Tools, len(defs), err)
	}
	// Every status change, in order, before the result: the worker's own
	// progress lines may come between running and the end.
	p := r.Progress
	if len(p) < 5 || !slices.Equal(p[:4], []string{"created", "queued", "starting", "running"}) || p[len(p)-1] != "ended: success" {
		t.Errorf("progress %q, want created, queued, starting, running, ..., ended: success", p)
	}
	if !r.Outside.IsError || strings.Contains(r.Outside.Text, "root:") || !strings.Contains(r.Outside.Text, "path") {
		t.Errorf("read outside the workspace: %+v", r.Outside)
	}
	res, err := s.client.Result(context.Background(), service.ResultRequest{TaskID: r.TaskID, IncludeFileContents: []string{"rows.txt"}})
	if err != nil || res.FileContents["rows.txt"].Content != r.Rows {
		t.Errorf("the server's result of %s: %v %+v", r.TaskID, err, res.FileContents)
	}
	var actors []string
	s.client.Events(context.Background(), service.EventsRequest{TaskID: r.TaskID}, func(e eventstore.Event) error {
		actors = append(actors, e.Actor)
		return nil
	})
	if len(actors) == 0 || actors[0] == "" || actors[0] == "anonymous" {
		t.Errorf("the spawn through MCP recorded actor %q, want the authenticated caller", actors)
	}
	data, err := os.ReadFile(filepath.Join(s.data, "shared", "data", "in.csv"))
	if err != nil || string(data) != "a,b\n1,2\n3,4\n" {
		t.Errorf("shared/data/in.csv: %q %v", data, err)
	}
}

const mcpToken = "mcp-test-token-0123456789"

// TestMCPStreamableHTTP drives /mcp with the official TypeScript SDK client
// over streamable HTTP, with the API's bearer token.
func TestMCPStreamableHTTP(t *testing.T) {
	dir := requireMCPClient(t)
	s := MustStartEnv(t, []string{"CORRAL_API_TOKEN=" + mcpToken}, withExec) // client.mjs calls code_execute

	// The same bearer auth as the API.
	req, _ := http.NewRequest(http.MethodPost, s.url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if code, body := send(t, req); code != http.StatusUnauthorized {
		t.Errorf("POST /mcp without a token: %d %s, want 401", code, body)
	}

	r := runMCPClient(t, dir, []string{"CORRAL_API_TOKEN=" + mcpToken, "CORRAL_SESSION_ID=" + mustSession(t, s)}, "http", s.url+"/mcp")
	checkReport(t, s, r)
}

// TestMCPStdio drives `corral mcp --server URL` over stdio with the
// TypeScript SDK's StdioClientTransport spawning the built binary.
func TestMCPStdio(t *testing.T) {
	dir := requireMCPClient(t)
	s := MustStartEnv(t, []string{"CORRAL_API_TOKEN=" + mcpToken}, withExec) // client.mjs calls code_execute
	r := runMCPClient(t, dir, []string{"CORRAL_API_TOKEN=" + mcpToken, "CORRAL_SESSION_ID=" + mustSession(t, s)}, "stdio", corralBin, "mcp", "--server", s.url)
	checkReport(t, s, r)
}

// `corral mcp --server` lists code_execute only where that server runs
// it: a client offered a tool the server refuses would call it for
// nothing.
func TestMCPStdioCatalogueFollowsServer(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("execution=%v", on), func(t *testing.T) {
			s := MustStartEnv(t, []string{"CORRAL_API_TOKEN=" + mcpToken}, func(c *config.Config) { c.Execution.Enabled = on })
			cmd := exec.Command(corralBin, "mcp", "--server", s.url)
			cmd.Env = append(os.Environ(), "CORRAL_API_TOKEN="+mcpToken)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			list, err := cs.ListTools(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			listed := slices.ContainsFunc(list.Tools, func(tl *mcp.Tool) bool { return tl.Name == "code_execute" })
			if listed != on || len(list.Tools) < 10 {
				t.Errorf("with execution.enabled %v: code_execute listed %v among %d tools", on, listed, len(list.Tools))
			}
		})
	}
}

// TestMCPStdioEmbedded runs `corral mcp` with no server at the configured
// address: it starts an embedded one on that address and data directory.
func TestMCPStdioEmbedded(t *testing.T) {
	dir := requireMCPClient(t)
	testenv.RequireBwrap(t)
	addr := freeLoopbackAddr(t)
	data := testenv.TempDir(t)
	t.Cleanup(func() { killSandboxes(t, data) })
	r := runMCPClient(t, dir, []string{"CORRAL_LISTEN=" + addr, "CORRAL_DATA=" + data, "CORRAL_API_TOKEN=", "EXECUTION_ENABLED=true"}, "stdio", corralBin, "mcp") // client.mjs calls code_execute
	if r.Status != "success" || strings.TrimSpace(r.Rows) != "3" {
		t.Errorf("task %s: status %s rows %q", r.TaskID, r.Status, r.Rows)
	}
	// The embedded server kept its events and files in the data directory.
	if _, err := os.Stat(filepath.Join(data, "corral.db")); err != nil {
		t.Errorf("no event store in the data directory: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(data, "tasks", r.TaskID, "output", "rows.txt")); err != nil || strings.TrimSpace(string(b)) != "3" {
		t.Errorf("rows.txt in the task directory: %q %v", b, err)
	}
}

// mustSession creates a session on s for the MCP client's workspace_exec.
func mustSession(t *testing.T, s *server) string {
	t.Helper()
	created, err := s.client.CreateSession(context.Background(), session.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return created.SessionID
}

// TestMCPSessionLifecycle: a real MCP client suspends, resumes and forks
// a session with the tools that the HTTP API's routes mirror, and each
// answer says what was kept; a command on the suspended session resumes
// it, its files there.
func TestMCPSessionLifecycle(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()
	sess := mustCreateSession(t, s.client)
	id := sess.SessionID
	cs := connectMCP(t, s)
	call := func(name string, args map[string]any, into any) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil || res.IsError {
			t.Fatalf("%s: %v %s", name, err, mcpText(res))
		}
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, into); err != nil {
			t.Fatalf("%s answered %s: %v", name, b, err)
		}
	}
	var ran service.SessionExecResult
	call("workspace_exec", map[string]any{"session_id": id, "command": "echo kept > f.txt"}, &ran)
	var sus service.SessionSuspend
	call("suspend_session", map[string]any{"session_id": id}, &sus)
	if sus.Session.Status != service.SessionSuspended || sus.MemoryKept || !strings.Contains(sus.Note, "files kept") {
		t.Errorf("suspend_session on local: %+v", sus)
	}
	call("workspace_exec", map[string]any{"session_id": id, "command": "cat f.txt"}, &ran)
	if ran.ExitCode != 0 || ran.Stdout != "kept\n" {
		t.Errorf("a command on the suspended session: %+v", ran)
	}
	call("suspend_session", map[string]any{"session_id": id}, &sus)
	var resumed service.Session
	call("resume_session", map[string]any{"session_id": id}, &resumed)
	if resumed.ID != id || resumed.Status != service.SessionRunning {
		t.Errorf("resume_session: %+v", resumed)
	}
	var forks service.SessionFork
	call("fork_session", map[string]any{"session_id": id, "count": 2}, &forks)
	if len(forks.Forks) != 2 || forks.MemoryKept || forks.Files != 1 {
		t.Fatalf("fork_session: %+v", forks)
	}
	for _, f := range forks.Forks {
		call("workspace_exec", map[string]any{"session_id": f.SessionID, "command": "cat f.txt"}, &ran)
		if f.Token == "" || f.Session.ForkedFrom != id || ran.Stdout != "kept\n" {
			t.Errorf("fork %s: token given %v, forked from %q, reads %q", f.SessionID, f.Token != "", f.Session.ForkedFrom, ran.Stdout)
		}
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "fork_session", Arguments: map[string]any{"session_id": id, "count": 17}})
	if err != nil || !res.IsError {
		t.Errorf("fork_session of 17: %v, error %v", err, res != nil && res.IsError)
	}
}
