package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/orchestrator"
	"github.com/corral-dev/corral/internal/orchestrator/orchestratortest"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/tools"
	"github.com/corral-dev/corral/internal/workspace"
)

// fixture is a real orchestrator over a SQLite store, without a scheduler:
// tasks stay queued until a test appends their events.
type fixture struct {
	svc   service.Set
	orch  *orchestrator.Orchestrator
	tasks *projection.Tasks
	data  *workspace.DataRoot
}

func MustFixture(tb testing.TB) *fixture {
	tb.Helper()
	f := orchestratortest.New(tb, nil)
	return &fixture{svc: f.Set(), orch: f.Orch, tasks: f.Tasks, data: f.Data}
}

// MustComplete ends a task with status success and writes its output files.
func (f *fixture) MustComplete(tb testing.TB, id string, files map[string]string) {
	tb.Helper()
	var outs []task.OutputFile
	for name, content := range files {
		p := filepath.Join(f.data.TaskPath(id), "output", name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			tb.Fatal(err)
		}
		outs = append(outs, task.OutputFile{Name: name, Size: int64(len(content)), Type: "text/plain"})
	}
	_, err := f.tasks.Update(context.Background(), id, func(task.Task) ([]eventstore.Proposed, error) {
		return []eventstore.Proposed{
			projection.NewEvent(task.EventStarting, nil, "test"),
			projection.NewEvent(task.EventStarted, task.Started{SandboxName: id}, "test"),
			projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Success, OutputFiles: outs, Summary: "done"}, "test"),
		}, nil
	})
	if err != nil {
		tb.Fatal(err)
	}
}

// progressLog records the progress notifications a client receives.
type progressLog struct {
	mu   sync.Mutex
	msgs []string
}

func (p *progressLog) add(m string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, m)
}

func (p *progressLog) all() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.msgs...)
}

// MustConnect serves svc over the SDK's in-memory transport and returns a
// connected client session.
func MustConnect(tb testing.TB, svc service.Set, log *slog.Logger) (*mcp.ClientSession, *progressLog) {
	tb.Helper()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	prog := &progressLog{}
	cs := mustConnectTo(tb, New(svc, Options{MaxArgumentBytes: 64 << 10}, log), &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			prog.add(r.Params.Message)
		},
	}, nil)
	return cs, prog
}

// mustConnectTo connects a client with opts to s over the SDK's in-memory
// transport, speaking the protocol version of copts (default the SDK's
// latest).
func mustConnectTo(tb testing.TB, s *Server, opts *mcp.ClientOptions, copts *mcp.ClientSessionOptions) *mcp.ClientSession {
	tb.Helper()
	ct, st := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := s.srv.Connect(ctx, st, nil)
	if err != nil {
		tb.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, opts).Connect(ctx, ct, copts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		cs.Close()
		ss.Wait()
	})
	return cs
}

// call calls a tool and returns its result, failing on a protocol error.
func call(tb testing.TB, cs *mcp.ClientSession, name string, args any) *mcp.CallToolResult {
	tb.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		tb.Fatalf("call %s: %v", name, err)
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			b.WriteString(t.Text)
		}
	}
	return b.String()
}

// MustOK calls a tool that must succeed and decodes its JSON text result.
func MustOK(tb testing.TB, cs *mcp.ClientSession, name string, args, out any) {
	tb.Helper()
	res := call(tb, cs, name, args)
	if res.IsError {
		tb.Fatalf("%s: isError: %s", name, text(res))
	}
	if err := json.Unmarshal([]byte(text(res)), out); err != nil {
		tb.Fatalf("%s: decode %q: %v", name, text(res), err)
	}
	sc, err := json.Marshal(res.StructuredContent)
	if err != nil {
		tb.Fatal(err)
	}
	if !json.Valid(sc) || string(sc) == "null" {
		tb.Errorf("%s: structuredContent is %s", name, sc)
	}
}

func TestListTools(t *testing.T) {
	f := MustFixture(t)
	cs, _ := MustConnect(t, f.svc, nil)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	cat := tools.New(f.svc, tools.Limits{}).All()
	if len(res.Tools) != len(cat) {
		t.Fatalf("listed %d tools, the catalogue has %d", len(res.Tools), len(cat))
	}
	// The SDK lists tools by name.
	byName := map[string]tools.Tool{}
	for _, tl := range cat {
		byName[tl.Name] = tl
	}
	for _, got := range res.Tools {
		want, ok := byName[got.Name]
		if !ok || got.Description != want.Description {
			t.Errorf("tool %q: not in the catalogue, or its description differs", got.Name)
			continue
		}
		delete(byName, got.Name)
		var gs, ws any
		b, _ := json.Marshal(got.InputSchema)
		json.Unmarshal(b, &gs)
		json.Unmarshal(want.Schema, &ws)
		if d := cmp.Diff(ws, gs); d != "" {
			t.Errorf("%s schema (-catalogue +listed):\n%s", got.Name, d)
		}
	}
	for name := range byName {
		t.Errorf("tool %s is not listed", name)
	}
}

func TestCallEveryTool(t *testing.T) {
	f := MustFixture(t)
	cs, prog := MustConnect(t, f.svc, nil)

	var written workspace.Entry
	MustOK(t, cs, "write_workspace", map[string]any{"path": "data/in.csv", "content": "a,b\n1,2\n"}, &written)
	if written.Path != "data/in.csv" || written.Size != 8 {
		t.Errorf("write_workspace: %+v", written)
	}
	var file service.File
	MustOK(t, cs, "read_workspace", map[string]any{"path": "data/in.csv"}, &file)
	if file.Content != "a,b\n1,2\n" {
		t.Errorf("read_workspace content %q", file.Content)
	}
	var listing struct {
		Entries []workspace.Entry `json:"entries"`
	}
	MustOK(t, cs, "list_workspace", map[string]any{"path": "", "recursive": true}, &listing)
	var paths []string
	for _, e := range listing.Entries {
		paths = append(paths, e.Path)
	}
	if !strings.Contains(strings.Join(paths, " "), "data/in.csv") {
		t.Errorf("list_workspace recursive: %v, want data/in.csv among them", paths)
	}

	var spawned struct {
		TaskID string `json:"task_id"`
		Status string `json:"status"`
	}
	MustOK(t, cs, "spawn_worker", map[string]any{"task_description": "count rows", "context_files": []string{"data/in.csv"}, "agent": "command", "command": []string{"wc", "-l"}}, &spawned)
	if !task.ValidID(spawned.TaskID) || spawned.Status != string(task.Queued) {
		t.Fatalf("spawn_worker: %+v", spawned)
	}
	var page service.ListPage
	MustOK(t, cs, "list_worker_tasks", map[string]any{"limit": 10}, &page)
	if len(page.Tasks) != 1 || page.Tasks[0].ID != spawned.TaskID {
		t.Errorf("list_worker_tasks: %+v", page.Tasks)
	}

	// read_task_result waits while the task ends, with a progress token.
	go func() {
		time.Sleep(100 * time.Millisecond)
		f.MustComplete(t, spawned.TaskID, map[string]string{"rows.txt": "2\n"})
	}()
	params := &mcp.CallToolParams{Name: "read_task_result", Arguments: map[string]any{"task_id": spawned.TaskID, "wait_seconds": 10, "include_file_contents": []string{"rows.txt"}}}
	params.SetProgressToken("p1")
	res, err := cs.CallTool(context.Background(), params)
	if err != nil || res.IsError {
		t.Fatalf("read_task_result: %v %s", err, text(res))
	}
	var result service.Result
	if err := json.Unmarshal([]byte(text(res)), &result); err != nil {
		t.Fatal(err)
	}
	if !result.Done || result.Status != task.Success || result.FileContents["rows.txt"].Content != "2\n" {
		t.Errorf("read_task_result: done %v status %s files %+v", result.Done, result.Status, result.FileContents)
	}
	// A result that says the task ended is sent after the notification of
	// its end, so every step is sent; the client may still be handling the
	// last one.
	waitFor(t, func() bool { return len(prog.all()) >= 5 })
	if got, want := prog.all(), []string{"created", "queued", "starting", "running", "ended: success"}; !cmp.Equal(got, want) {
		t.Errorf("progress notifications %q, want %q", got, want)
	}

	var second struct {
		TaskID string `json:"task_id"`
	}
	MustOK(t, cs, "spawn_worker", map[string]any{"task_description": "never runs", "agent": "command", "command": []string{"true"}}, &second)
	var cancelled task.Task
	MustOK(t, cs, "cancel_worker_task", map[string]any{"task_id": second.TaskID}, &cancelled)
	if cancelled.Status != task.Cancelled {
		t.Errorf("cancel_worker_task: status %s", cancelled.Status)
	}
}

func TestProgressWhileWaiting(t *testing.T) {
	f := MustFixture(t)
	cs, prog := MustConnect(t, f.svc, nil)
	tk, _, err := f.orch.Spawn(context.Background(), service.SpawnRequest{TaskDescription: "x", Agent: "command", Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		params := &mcp.CallToolParams{Name: "read_task_result", Arguments: map[string]any{"task_id": tk.ID, "wait_seconds": 20}}
		params.SetProgressToken(7)
		res, _ := cs.CallTool(context.Background(), params)
		done <- res
	}()
	// The task starts while the call waits: its notification must arrive
	// before the task ends.
	waitFor(t, func() bool { return len(prog.all()) >= 2 })
	if _, err := f.tasks.Update(context.Background(), tk.ID, func(task.Task) ([]eventstore.Proposed, error) {
		return []eventstore.Proposed{projection.NewEvent(task.EventStarting, nil, "test"), projection.NewEvent(task.EventStarted, task.Started{SandboxName: tk.ID}, "test")}, nil
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(prog.all()) >= 4 })
	// The agent's own progress reads as what it did, not "progress".
	if _, err := f.tasks.Update(context.Background(), tk.ID, func(task.Task) ([]eventstore.Proposed, error) {
		return []eventstore.Proposed{projection.NewEvent(task.EventProgress, task.Progress{Kind: "tool_use", Tool: "Bash", Input: "ls"}, "test")}, nil
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(prog.all()) >= 5 })
	if got, want := prog.all(), []string{"created", "queued", "starting", "running", "Bash: ls"}; !cmp.Equal(got, want) {
		t.Errorf("progress %q, want %q", got, want)
	}
	if _, err := f.tasks.Update(context.Background(), tk.ID, func(task.Task) ([]eventstore.Proposed, error) {
		return []eventstore.Proposed{projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Failed, ErrorMessage: "exit 1"}, "test")}, nil
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-done:
		if res == nil || res.IsError || !strings.Contains(text(res), `"status":"failed"`) {
			t.Errorf("read_task_result: %+v", res)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("read_task_result did not return after the task ended")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestBadInput: every bad call is a tool error that says what is wrong, and
// none of them changes anything.
func TestBadInput(t *testing.T) {
	f := MustFixture(t)
	cs, _ := MustConnect(t, f.svc, nil)
	big := strings.Repeat("x", 70<<10)
	for _, tc := range []struct {
		name string
		tool string
		args any
		want string
	}{
		{"path outside the workspace", "write_workspace", map[string]any{"path": "../escape.txt", "content": "x"}, "path"},
		{"absolute path outside", "read_workspace", map[string]any{"path": "/etc/passwd"}, "path"},
		{"dotdot listing", "list_workspace", map[string]any{"path": "data/../../.."}, "path"},
		{"wrong type", "write_workspace", map[string]any{"path": 5, "content": "x"}, "path: must be a string"},
		{"wrong type for an integer", "spawn_worker", map[string]any{"task_description": "x", "timeout_minutes": "ten"}, "timeout_minutes"},
		{"missing required", "write_workspace", map[string]any{"path": "a.txt"}, "content: is required"},
		{"missing task description", "spawn_worker", map[string]any{"agent": "command", "command": []string{"true"}}, "task_description"},
		{"unknown argument", "spawn_worker", map[string]any{"task_description": "x", "agnet": "command"}, "agnet"},
		{"oversize arguments", "write_workspace", map[string]any{"path": "big.txt", "content": big}, "over the limit"},
		{"oversize spawn", "spawn_worker", map[string]any{"task_description": big}, "over the limit"},
		{"unknown task", "read_task_result", map[string]any{"task_id": "t_nope"}, "task_id"},
		{"wait out of range", "read_task_result", map[string]any{"task_id": "t_nope", "wait_seconds": 601}, "wait_seconds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := call(t, cs, tc.tool, tc.args)
			if !res.IsError {
				t.Fatalf("not an error: %s", text(res))
			}
			if msg := text(res); !strings.Contains(msg, tc.want) || strings.Contains(msg, "internal error") {
				t.Errorf("message %q, want it to mention %q", msg, tc.want)
			}
		})
	}
	var listing struct {
		Entries []workspace.Entry `json:"entries"`
	}
	MustOK(t, cs, "list_workspace", map[string]any{"recursive": true}, &listing)
	for _, e := range listing.Entries {
		if !e.IsDir {
			t.Errorf("a bad call left %s in the workspace", e.Path)
		}
	}
	if _, err := os.Stat(filepath.Join(f.data.Path(), "escape.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("escape.txt outside shared/: %v", err)
	}
	page, err := f.orch.List(context.Background(), service.ListRequest{})
	if err != nil || len(page.Tasks) != 0 {
		t.Errorf("a bad call created tasks: %v %v", page.Tasks, err)
	}
}

func TestUnknownTool(t *testing.T) {
	f := MustFixture(t)
	cs, _ := MustConnect(t, f.svc, nil)
	_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "delete_everything", Arguments: map[string]any{}})
	if err == nil || !strings.Contains(err.Error(), `unknown tool "delete_everything"`) {
		t.Errorf("unknown tool: %v, want a protocol error naming it", err)
	}
}

// brokenLibrary fails ReadWorkspace with an unclassified error.
type brokenLibrary struct {
	service.Library
	err error
}

func (b brokenLibrary) ReadWorkspace(context.Context, string) (service.File, error) {
	return service.File{}, b.err
}

func TestInternalErrorIsHidden(t *testing.T) {
	var logged bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logged}, nil))
	cs, _ := MustConnect(t, service.Set{Library: brokenLibrary{err: errors.New("open /srv/secret/db: disk on fire")}}, log)
	res := call(t, cs, "read_workspace", map[string]any{"path": "a.txt"})
	msg := text(res)
	if !res.IsError || !strings.HasPrefix(msg, "internal error (request id ") || strings.Contains(msg, "secret") {
		t.Errorf("result %v %q, want an internal error without the detail", res.IsError, msg)
	}
	rid := strings.TrimSuffix(strings.TrimPrefix(msg, "internal error (request id "), ")")
	mu.Lock()
	defer mu.Unlock()
	if l := logged.String(); !strings.Contains(l, "disk on fire") || !strings.Contains(l, rid) {
		t.Errorf("log %q, want the detail and request id %s", l, rid)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestErrorsReadAsMessages: a tool error says what is wrong in words, not
// in the class it is filed under or the system call that failed.
func TestErrorsReadAsMessages(t *testing.T) {
	f := MustFixture(t)
	cs, _ := MustConnect(t, f.svc, nil)
	var e workspace.Entry
	MustOK(t, cs, "write_workspace", map[string]any{"path": "a.txt", "content": "x"}, &e)
	for _, tc := range []struct {
		tool string
		args any
		want string
	}{
		{"read_workspace", map[string]any{"path": "nope.txt"}, "nope.txt: no such file or directory"},
		{"read_workspace", map[string]any{"path": "a.txt/b"}, "a.txt/b: not a directory"},
		{"write_workspace", map[string]any{"path": "../x", "content": "x"}, "path escapes workspace"},
		{"cancel_worker_task", map[string]any{"task_id": "task-00000000000000000000000000"}, "not found"},
	} {
		res := call(t, cs, tc.tool, tc.args)
		msg := text(res)
		if !res.IsError || !strings.Contains(msg, tc.want) {
			t.Errorf("%s %v: %v %q, want an error saying %q", tc.tool, tc.args, res.IsError, msg, tc.want)
		}
		for _, bad := range []string{"openat", "statat", "invalid argument", "failed precondition", "permission denied", f.data.Path()} {
			if strings.Contains(msg, bad) {
				t.Errorf("%s %v: %q says %q", tc.tool, tc.args, msg, bad)
			}
		}
	}
}
