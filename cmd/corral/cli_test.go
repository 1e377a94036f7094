package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// TestMain makes the tables' local time UTC, before any test runs (time.Local
// is not to be changed while another goroutine reads the time).
func TestMain(m *testing.M) {
	time.Local = time.UTC
	os.Exit(m.Run())
}

var update = flag.Bool("update", false, "rewrite the golden files under testdata/ with what the commands print now")

// golden compares got with testdata/name, or with -update writes it there.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./cmd/corral -update writes it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from what the command prints (go test ./cmd/corral -update rewrites it):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// corral runs the CLI in the test and returns its exit code and outputs.
func corral(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// commands returns every command of the tree, the root's children first.
func commands(c *cobra.Command) []*cobra.Command {
	var out []*cobra.Command
	for _, s := range c.Commands() {
		out = append(out, s)
		out = append(out, commands(s)...)
	}
	return out
}

// TestHelpGolden: every command's help, as corral help CMD prints it,
// is the one in testdata/help/.
func TestHelpGolden(t *testing.T) {
	cmds := append([]*cobra.Command{newRoot()}, commands(newRoot())...)
	for _, c := range cmds {
		path := strings.Fields(c.CommandPath())[1:]
		name := strings.Join(append([]string{"corral"}, path...), "_")
		if c.Hidden || name == "corral_help" {
			continue
		}
		code, stdout, stderr := corral(t, append([]string{"help"}, path...)...)
		if code != 0 || stderr != "" {
			t.Errorf("corral help %s: exit %d, %s", strings.Join(path, " "), code, stderr)
		}
		stdout = machineFree(stdout)
		golden(t, "help/"+name+".golden", stdout)
		// CMD --help prints the same, but where the command parses its
		// own flags (worker).
		if c.DisableFlagParsing {
			continue
		}
		if _, again, _ := corral(t, append(path, "--help")...); machineFree(again) != stdout {
			t.Errorf("corral %s --help differs from corral help %[1]s", strings.Join(path, " "))
		}
	}
}

// machineFree is help with the defaults that depend on the machine or the
// build written as their names.
func machineFree(help string) string {
	return strings.NewReplacer(`"`+runtime.GOARCH+`"`, `"GOARCH"`, `"`+defaultServerImage()+`"`, `"corral:VERSION"`).Replace(help)
}

// TestCompletionScripts: corral completion bash|zsh|fish writes the
// script each shell loads (docs/cli.md says how).
func TestCompletionScripts(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish"} {
		code, stdout, stderr := corral(t, "completion", shell)
		if code != 0 || stderr != "" || !strings.Contains(stdout, "__complete") {
			t.Errorf("completion %s: exit %d, %s", shell, code, stderr)
		}
		golden(t, "completion/corral."+shell, stdout)
	}
}

// The fixed data of the test server: tasks and sessions with every
// column filled, one description trying to act on the terminal.
var (
	created = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	tasks   = []task.Task{
		fixedTask("task-01jdac0000000000000000003", task.Running, nil, "summarise the sales"),
		fixedTask("task-01jdab0000000000000000002", task.Failed, new(3), "fail \x1b[2J loudly"),
		fixedTask("task-01jdab0000000000000000001", task.Success, new(0), "count the rows"),
	}
	sessions = []service.Session{
		{ID: "sess-01jdac0000000000000000002", Runtime: "gvisor", Network: "none", Status: service.SessionSuspended, CreatedAt: created, LastUsedAt: created.Add(time.Minute), Execs: 4, IdleTimeout: 1800},
		{ID: "sess-01jdab0000000000000000001", Runtime: "docker", Image: "python:3.13", Network: "allowlist", Status: service.SessionRunning, CreatedAt: created, LastUsedAt: created.Add(2 * time.Minute), Execs: 1, IdleTimeout: 1800, Workspace: "myapp"},
		{ID: "sess-01jdaa0000000000000000000", Runtime: "local", Network: "none", Status: service.SessionEnded, EndReason: "deleted", CreatedAt: created, LastUsedAt: created, IdleTimeout: 1800},
	}
)

func fixedTask(id string, st task.Status, exit *int, desc string) task.Task {
	t := task.Task{ID: id, Status: st, Version: 4, CreatedAt: created, UpdatedAt: created.Add(time.Minute), ExitCode: exit}
	t.Description, t.Agent, t.Runtime, t.Network, t.TimeoutMinutes = desc, task.AgentCommand, "local", "none", 30
	if st.Terminal() {
		ms := int64(1500)
		t.DurationMS = &ms
	}
	return t
}

// fixedServer is the HTTP API (httpapi, as corral serve runs it) over
// fixed tasks and sessions; run spawns a task that ends at once, as its
// description says (see spawned).
type fixedServer struct {
	service.Tasks
	mu    sync.Mutex
	tasks []task.Task
	spawn map[string]task.Task
}

func startFixed(t *testing.T) (*fixedServer, string) {
	t.Helper()
	fs := &fixedServer{tasks: tasks, spawn: map[string]task.Task{}}
	hs := httptest.NewServer(httpapi.New(service.Set{Tasks: fs, Sessions: fixedSessions{}, Library: workspaceBackend{}}, workspaceBackend{}, httpapi.Options{SessionGate: fixedSessions{}}, slog.New(slog.DiscardHandler)).Handler())
	t.Cleanup(hs.Close)
	return fs, hs.URL
}

func (f *fixedServer) List(_ context.Context, req service.ListRequest) (service.ListPage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	page := service.ListPage{Tasks: []task.Task{}}
	for _, t := range f.tasks {
		if req.Status == "" || string(t.Status) == req.Status {
			page.Tasks = append(page.Tasks, t)
		}
	}
	return page, nil
}

func (f *fixedServer) Get(_ context.Context, id string) (task.Task, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range append(f.tasks, f.spawned()...) {
		if t.ID == id {
			return t, nil
		}
	}
	return task.Task{}, errdefs.ErrNotFound
}

func (f *fixedServer) spawned() []task.Task {
	var out []task.Task
	for _, t := range f.spawn {
		out = append(out, t)
	}
	return out
}

// Spawn makes a task that has ended already: "exit N" fails with exit
// code N, "timeout" times out, "cancel" is cancelled, "fail" fails with
// no exit code, anything else succeeds.
func (f *fixedServer) Spawn(_ context.Context, req service.SpawnRequest) (task.Task, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := "task-01jdaz000000000000000000" + string(rune('a'+len(f.spawn)))
	t := fixedTask(id, task.Success, new(0), req.TaskDescription)
	switch d := req.TaskDescription; {
	case strings.HasPrefix(d, "exit "):
		t.Status = task.Failed
		n := 0
		for _, c := range strings.TrimPrefix(d, "exit ") {
			n = n*10 + int(c-'0')
		}
		t.ExitCode = &n
	case d == "timeout", d == "cancel", d == "fail":
		t.Status = map[string]task.Status{"timeout": task.Timeout, "cancel": task.Cancelled, "fail": task.Failed}[d]
		t.ExitCode = nil
	}
	f.spawn[id] = t
	queued := t
	queued.Status = task.Queued
	return queued, false, nil
}

func (f *fixedServer) Events(ctx context.Context, req service.EventsRequest, fn func(eventstore.Event) error) error {
	if err := fn(eventstore.Event{ID: "ev-1", StreamID: req.TaskID, Type: task.EventCompleted, Data: []byte(`{}`), RecordedAt: created}); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

func (f *fixedServer) Result(ctx context.Context, req service.ResultRequest) (service.Result, error) {
	t, err := f.Get(ctx, req.TaskID)
	return service.Result{Task: t, Done: t.Status.Terminal()}, err
}

// fixedSessions serves the fixed sessions; no token is a session's own.
type fixedSessions struct {
	service.Sessions
	service.SessionGate
}

func (fixedSessions) Authorize(string, string) bool { return false }

func (fixedSessions) List(context.Context) ([]service.Session, error) { return sessions, nil }

func (fixedSessions) Get(_ context.Context, id string) (service.Session, error) {
	for _, s := range sessions {
		if s.ID == id {
			return s, nil
		}
	}
	return service.Session{}, errdefs.ErrNotFound
}

// TestOutputFormats: tasks and sessions, listed and got, in every -o
// format and with -q, against testdata/output/.
func TestOutputFormats(t *testing.T) {
	_, url := startFixed(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"tasks", []string{"tasks"}},
		{"tasks_wide", []string{"tasks", "-o", "wide"}},
		{"tasks_name", []string{"tasks", "-o", "name"}},
		{"tasks_q", []string{"tasks", "-q"}},
		{"tasks_json", []string{"tasks", "-o", "json"}},
		{"tasks_json_alias", []string{"tasks", "--json"}},
		{"tasks_yaml", []string{"tasks", "-o", "yaml"}},
		{"tasks_failed", []string{"tasks", "--status", "failed"}},
		{"tasks_get", []string{"tasks", "get", "task-01jdab0000000000000000002"}},
		{"tasks_get_wide", []string{"tasks", "get", "-o", "wide", "task-01jdab0000000000000000002"}},
		{"tasks_get_name", []string{"tasks", "get", "-o", "name", "task-01jdab0000000000000000002"}},
		{"tasks_get_json", []string{"tasks", "get", "-o", "json", "task-01jdab0000000000000000002"}},
		{"tasks_get_yaml", []string{"tasks", "get", "-o", "yaml", "task-01jdab0000000000000000002"}},
		{"sessions", []string{"sessions"}},
		{"sessions_ls_wide", []string{"sessions", "ls", "-o", "wide"}},
		{"sessions_name", []string{"sessions", "-o", "name"}},
		{"sessions_q", []string{"sessions", "-q"}},
		{"sessions_json", []string{"sessions", "-o", "json"}},
		{"sessions_yaml", []string{"sessions", "-o", "yaml"}},
		{"sessions_gvisor", []string{"sessions", "ls", "--runtime", "gvisor"}},
		{"sessions_running", []string{"sessions", "--status", "running", "-q"}},
		{"sessions_get", []string{"sessions", "get", "sess-01jdab0000000000000000001"}},
		{"sessions_get_wide", []string{"sessions", "get", "-o", "wide", "sess-01jdab0000000000000000001"}},
		{"sessions_get_name", []string{"sessions", "get", "-o", "name", "sess-01jdab0000000000000000001"}},
		{"sessions_get_json", []string{"sessions", "get", "-o", "json", "sess-01jdab0000000000000000001"}},
		{"sessions_get_yaml", []string{"sessions", "get", "-o", "yaml", "sess-01jdab0000000000000000001"}},
	} {
		code, stdout, stderr := corral(t, append(tc.args, "--server", url)...)
		if code != 0 || stderr != "" {
			t.Errorf("corral %s: exit %d, %s", strings.Join(tc.args, " "), code, stderr)
		}
		golden(t, "output/"+tc.name, stdout)
		if c := rawControl(stdout); c != "" {
			t.Errorf("corral %s printed %q raw", strings.Join(tc.args, " "), c)
		}
	}
	// --json is -o json.
	_, j, _ := corral(t, "tasks", "-o", "json", "--server", url)
	if _, alias, _ := corral(t, "tasks", "--json", "--server", url); alias != j {
		t.Error("tasks --json differs from tasks -o json")
	}
	for _, bad := range [][]string{
		{"tasks", "-o", "xml"}, {"tasks", "-q", "-o", "json"}, {"tasks", "--json", "-o", "yaml"},
		{"sessions", "--runtime", "vmware"}, {"sessions", "--status", "asleep"}, {"result", "-o", "wide", "task-01jdab0000000000000000002"},
	} {
		if code, _, stderr := corral(t, append(bad, "--server", url)...); code != exitUsage || !strings.Contains(stderr, "Run 'corral") {
			t.Errorf("corral %s: exit %d, %q; want 2 and where the usage is", strings.Join(bad, " "), code, stderr)
		}
	}
}

// TestIDPrefixes: wherever an id is taken, a unique prefix of it will
// do, with or without its kind's prefix; an ambiguous one is a usage
// error that lists the ids it starts, and one that starts none is not
// found.
func TestIDPrefixes(t *testing.T) {
	_, url := startFixed(t)
	for _, tc := range []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"tasks", "get", "-o", "name", "task-01jdac"}, 0, "task/task-01jdac0000000000000000003\n", ""},
		{[]string{"tasks", "get", "-o", "name", "01jdab0000000000000000002"}, 0, "task/task-01jdab0000000000000000002\n", ""},
		{[]string{"tasks", "get", "01jdab"}, exitUsage, "", "corral tasks get: task id prefix \"01jdab\" is ambiguous: it starts 2 ids: task-01jdab0000000000000000002, task-01jdab0000000000000000001\n"},
		{[]string{"tasks", "get", "zzz"}, exitFailure, "", "corral tasks get: no task id starts with \"zzz\"\n"},
		{[]string{"result", "task-01jdab0000000000000000001", "-o", "json"}, 0, "", ""},
		{[]string{"result", "01jdab00000000000000000"}, exitUsage, "", "ambiguous"},
		{[]string{"sessions", "get", "-o", "name", "sess-01jdac"}, 0, "session/sess-01jdac0000000000000000002\n", ""},
		{[]string{"sessions", "get", "-o", "name", "01jdaa"}, 0, "session/sess-01jdaa0000000000000000000\n", ""},
		{[]string{"sessions", "get", "01jda"}, exitUsage, "", "corral sessions get: session id prefix \"01jda\" is ambiguous: it starts 3 ids: sess-01jdac0000000000000000002, sess-01jdab0000000000000000001, sess-01jdaa0000000000000000000\n"},
		{[]string{"sessions", "get", "task-"}, exitFailure, "", "corral sessions get: no session id starts with \"task-\"\n"},
	} {
		code, stdout, stderr := corral(t, append(tc.args, "--server", url)...)
		if code != tc.code || (tc.stdout != "" && stdout != tc.stdout) || !strings.Contains(stderr, tc.stderr) || (tc.code == 0 && stderr != "") {
			t.Errorf("corral %s: exit %d, stdout %q, stderr %q; want %d, %q, %q", strings.Join(tc.args, " "), code, stdout, stderr, tc.code, tc.stdout, tc.stderr)
		}
	}
}

// TestDynamicCompletion: the shells' completion asks the server for the
// ids of tasks (with their status and description) and of sessions that
// have not ended, with the command's own --server.
func TestDynamicCompletion(t *testing.T) {
	_, url := startFixed(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"result", []string{"result", "--server", url, ""}},
		{"logs_prefix", []string{"logs", "--server", url, "task-01jdab"}},
		{"exec", []string{"exec", "--server", url, ""}},
		{"exec_second_arg", []string{"exec", "--server", url, "sess-01jdab0000000000000000001", ""}},
		{"run_session_flag", []string{"run", "--server", url, "--session", ""}},
		{"sessions_rm", []string{"sessions", "rm", "--server", url, "sess-"}},
		{"tasks_output_flag", []string{"tasks", "-o", ""}},
		{"run_runtime_flag", []string{"run", "--runtime", ""}},
		{"no_server", []string{"cancel", "--server", closedURL(t), ""}},
	} {
		code, stdout, _ := corral(t, append([]string{cobra.ShellCompRequestCmd}, tc.args...)...)
		if code != 0 {
			t.Errorf("completion of %s: exit %d", strings.Join(tc.args, " "), code)
		}
		golden(t, "completion/dynamic_"+tc.name, strings.ReplaceAll(stdout, url, "URL"))
	}
}

// TestRunFollowExitCodes: run --follow exits with the task's own exit
// code, and for a task without one with 1, 124 or 130 as it failed, timed
// out or was cancelled.
func TestRunFollowExitCodes(t *testing.T) {
	_, url := startFixed(t)
	for _, tc := range []struct {
		desc string
		code int
	}{
		{"ok", 0}, {"exit 3", 3}, {"exit 1", 1}, {"exit 255", 255}, {"exit 300", exitFailure},
		{"fail", exitFailure}, {"timeout", exitTimeout}, {"cancel", exitCancelled},
	} {
		code, stdout, stderr := corral(t, "run", "--follow", "--server", url, tc.desc, "--", "true")
		if code != tc.code || !strings.Contains(stdout, "status:") || !strings.Contains(stderr, " queued\n") {
			t.Errorf("run --follow %q: exit %d, stdout %q, stderr %q; want exit %d", tc.desc, code, stdout, stderr, tc.code)
		}
	}
	// -o json prints the result as JSON, and the exit code is the same.
	if code, stdout, _ := corral(t, "run", "-f", "-o", "json", "--server", url, "exit 4"); code != 4 || !strings.Contains(stdout, `"exit_code": 4`) {
		t.Errorf("run -f -o json: exit %d, %q", code, stdout)
	}
}

// TestWatch: tasks --watch prints the list, then each task again when it
// changes, until interrupted.
func TestWatch(t *testing.T) {
	fs, url := startFixed(t)
	watchInterval = 10 * time.Millisecond
	t.Cleanup(func() { watchInterval = 2 * time.Second })
	ctx, cancel := context.WithCancel(context.Background())
	var stdout syncBuffer
	done := make(chan int)
	go func() {
		done <- run(ctx, []string{"tasks", "--watch", "-o", "name", "--server", url}, &stdout, &stdout)
	}()
	waitFor(t, &stdout, "task/task-01jdab0000000000000000001\n")
	fs.mu.Lock()
	fs.tasks = append([]task.Task{}, tasks...)
	fs.tasks[0].Status, fs.tasks[0].Version = task.Success, 5
	fs.mu.Unlock()
	waitFor(t, &stdout, "task/task-01jdab0000000000000000001\ntask/task-01jdac0000000000000000003\n")
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("tasks --watch: exit %d after an interrupt", code)
	}
	if got, want := stdout.String(), "task/task-01jdac0000000000000000003\ntask/task-01jdab0000000000000000002\ntask/task-01jdab0000000000000000001\ntask/task-01jdac0000000000000000003\n"; got != want {
		t.Errorf("tasks --watch printed %q, want %q", got, want)
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func waitFor(t *testing.T, b *syncBuffer, suffix string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if strings.HasSuffix(b.String(), suffix) {
			return
		}
	}
	t.Fatalf("no %q at the end of %q", suffix, b.String())
}

// warmBackend is a server keeping one pool of warm sandboxes.
type warmBackend struct{ workspaceBackend }

func (warmBackend) Stats() httpapi.Stats {
	return httpapi.Stats{Warm: []httpapi.WarmPool{{Runtime: "gvisor", Shape: "none", Ready: 1, Target: 2, Claims: 7, Misses: 3, Started: 9, Destroyed: 1}}}
}

// TestDoctorAsksTheServer: doctor shows the server's checks (GET
// /api/health) and warm pools first, then this machine's checks; a required check that fails
// on the server fails the doctor.
func TestDoctorAsksTheServer(t *testing.T) {
	checked := time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC)
	hs := httptest.NewServer(httpapi.New(service.Set{Library: workspaceBackend{}}, warmBackend{}, httpapi.Options{
		Version: "v9.9.9",
		Doctor: func(context.Context) ([]httpapi.Check, time.Time) {
			return []httpapi.Check{
				{Name: "runtime local", OK: true, Detail: "bubblewrap on the server"},
				{Name: "agent claude", Detail: "no credentials \x1b[2J", Fix: "set ANTHROPIC_API_KEY", Required: true},
			}, checked
		},
	}, slog.New(slog.DiscardHandler)).Handler())
	defer hs.Close()
	cfg := filepath.Join(t.TempDir(), "corral.yaml")
	if err := os.WriteFile(cfg, []byte("data: "+filepath.Join(filepath.Dir(cfg), "data")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := corral(t, "doctor", "--server", hs.URL, "--config", cfg)
	server := strings.Index(stdout, "server "+hs.URL+" (corral v9.9.9, ready; checked 2026-11-29 09:00:00):\nok   runtime local ")
	fail := strings.Index(stdout, "FAIL agent claude                                  no credentials \\x1b[2J\n")
	warm := strings.Index(stdout, "\nwarm sandboxes on the server:\nRUNTIME  SHAPE  READY  TARGET  CLAIMS  MISSES  STARTED  FAILED  DESTROYED\ngvisor   none   1      2       7       3       9        0       1\n")
	local := strings.Index(stdout, "\nthis machine (configuration: "+cfg)
	if code != exitFailure || server < 0 || fail < server || warm < fail || local < warm || stderr != "" {
		t.Errorf("doctor: exit %d, stderr %q, stdout:\n%s\nwant 1, the server's checks, then this machine's", code, stderr, stdout)
	}
	_, stdout, _ = corral(t, "doctor", "--server", hs.URL, "--config", cfg, "-o", "json")
	var rep doctorReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil || rep.Server == nil || len(rep.Server.Checks) != 2 || len(rep.Local) == 0 || rep.ServerURL != hs.URL {
		t.Errorf("doctor -o json: %v\n%s", err, stdout)
	}
	// No server: said, and this machine's checks all the same.
	url := closedURL(t)
	code, stdout, _ = corral(t, "doctor", "--server", url, "--config", cfg)
	if !strings.HasPrefix(stdout, "server "+url+": no corral server is running at "+url+"\n\nthis machine") || code == exitUnreachable {
		t.Errorf("doctor without a server: exit %d:\n%s", code, stdout)
	}
}

// TestExecOnceNetwork: exec-once --network names a network, as run's
// does: none (the default) or the server's own policy; a mode
// code_execute cannot give is a usage error, not the network turned on.
func TestExecOnceNetwork(t *testing.T) {
	var got []service.ExecRequest
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/exec", func(w http.ResponseWriter, r *http.Request) {
		var req service.ExecRequest
		json.NewDecoder(r.Body).Decode(&req)
		got = append(got, req)
		io.WriteString(w, `{"task_id":"task-1","status":"success","success":true,"exit_code":0,"stdout":"hi\n","stderr":"","output_files":[]}`)
	})
	hs := httptest.NewServer(mux)
	defer hs.Close()
	for _, tc := range []struct {
		args    []string
		code    int
		network bool
	}{
		{[]string{"exec-once", "--", "true"}, 0, false},
		{[]string{"exec-once", "--network", "none", "--", "true"}, 0, false},
		{[]string{"exec-once", "--network", "default", "--", "true"}, 0, true},
		{[]string{"exec-once", "--network", "open", "--", "true"}, exitUsage, false},
		{[]string{"exec-once", "--network", "--", "true"}, exitUsage, false},
	} {
		got = nil
		code, _, stderr := corral(t, append([]string{tc.args[0], "--server", hs.URL}, tc.args[1:]...)...)
		if code != tc.code || (code == 0 && (len(got) != 1 || got[0].Network != tc.network || got[0].Command != "true")) || (code != 0 && len(got) != 0) {
			t.Errorf("corral %s: exit %d (%s), sent %+v; want exit %d, network %v", strings.Join(tc.args, " "), code, stderr, got, tc.code, tc.network)
		}
	}
}

// TestPagingHintOnStderr: the next page's command goes to stderr, where it
// does not break a pipe of ids.
func TestPagingHintOnStderr(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/tasks", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"tasks":[{"task_id":"task-01jdab0000000000000000001","status":"queued"}],"next_cursor":"task-01jdab0000000000000000001"}`)
	})
	hs := httptest.NewServer(mux)
	defer hs.Close()
	code, stdout, stderr := corral(t, "tasks", "-q", "--limit", "1", "--server", hs.URL)
	if code != 0 || stdout != "task-01jdab0000000000000000001\n" || stderr != "more: corral tasks --cursor task-01jdab0000000000000000001\n" {
		t.Errorf("tasks -q: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
