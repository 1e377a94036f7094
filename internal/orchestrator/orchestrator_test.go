package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/sqlite"
	"github.com/corral-dev/corral/internal/library"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/projection/projectiontest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

type fixture struct {
	o     *Orchestrator
	lib   *library.Library
	store *sqlite.Store
	tasks *projection.Tasks
	data  *workspace.DataRoot
}

// MustNew builds an Orchestrator over a real SQLite store and data root
// in temporary directories; edit changes its options first.
func MustNew(tb testing.TB, edit func(*Options)) *fixture {
	tb.Helper()
	log := slog.New(slog.DiscardHandler)
	env := projectiontest.New(tb)
	store, tasks, data := env.Store, env.Tasks, env.Data
	lib := library.New(library.Options{Store: store, Tasks: tasks, Data: data,
		Limits: library.Limits{MaxTaskDirBytes: 1 << 20, MaxContextBytes: 1 << 20, MaxReadBytes: 100, MaxWriteBytes: 1000}}, log)
	opts := Options{
		Store:   store,
		Tasks:   tasks,
		Data:    data,
		Library: lib,
		Limits: Limits{
			MaxPromptBytes:    1000,
			MaxContextBytes:   1 << 20,
			MaxQueued:         50,
			DefaultTimeoutMin: 30,
			MaxTimeoutMin:     120,
			StopGrace:         100 * time.Millisecond,
		},
		Defaults: Defaults{Agent: task.AgentClaude, Runtime: "local", Network: task.NetworkNone},
		Runtimes: map[string]string{"local": "", "gvisor": "runsc is not installed"},
		Networks: map[string]string{task.NetworkNone: ""},
		Agents: map[string]workerproto.AgentConfig{
			task.AgentClaude:  {Binary: "/usr/local/bin/claude", Env: []string{"ANTHROPIC_API_KEY=k"}},
			task.AgentCommand: {},
		},
	}
	if edit != nil {
		edit(&opts)
	}
	return &fixture{o: New(opts, log), lib: lib, store: store, tasks: tasks, data: data}
}

// MustShared writes a file beneath shared/.
func (f *fixture) MustShared(tb testing.TB, name, content string) {
	tb.Helper()
	p := f.data.HostPath("shared", name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		tb.Fatal(err)
	}
}

// MustSpawn spawns a task that must be accepted.
func (f *fixture) MustSpawn(tb testing.TB, req service.SpawnRequest) task.Task {
	tb.Helper()
	t, existing, err := f.o.Spawn(context.Background(), req)
	if err != nil || existing {
		tb.Fatalf("Spawn: existing %v, %v", existing, err)
	}
	return t
}

// MustAppend appends events to a task at its current version.
func (f *fixture) MustAppend(tb testing.TB, id string, evs ...eventstore.Proposed) task.Task {
	tb.Helper()
	return projectiontest.MustAppend(tb, f.tasks, id, evs...)
}

// MustRunning spawns a command task and moves it to running.
func (f *fixture) MustRunning(tb testing.TB) task.Task {
	tb.Helper()
	t := f.MustSpawn(tb, service.SpawnRequest{TaskDescription: "run", Command: []string{"true"}})
	return f.MustAppend(tb, t.ID,
		projection.NewEvent(task.EventStarting, nil, "test"),
		projection.NewEvent(task.EventStarted, task.Started{SandboxName: t.ID}, "test"))
}

// MustTaskFile writes a file beneath a task's directory.
func (f *fixture) MustTaskFile(tb testing.TB, id, name, content string) {
	tb.Helper()
	p := filepath.Join(f.data.TaskPath(id), name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		tb.Fatal(err)
	}
}

func (f *fixture) allEvents(tb testing.TB) []eventstore.Event {
	tb.Helper()
	evs, err := f.store.ReadAll(context.Background(), 0, 10000)
	if err != nil {
		tb.Fatal(err)
	}
	return evs
}

// fieldErrors returns every FieldError in err, through errors.Join trees.
func fieldErrors(err error) []*errdefs.FieldError {
	var out []*errdefs.FieldError
	var fe *errdefs.FieldError
	if errors.As(err, &fe) {
		out = append(out, fe)
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		out = out[:0]
		for _, e := range j.Unwrap() {
			out = append(out, fieldErrors(e)...)
		}
	}
	return out
}

func fields(err error) []string {
	var out []string
	for _, fe := range fieldErrors(err) {
		out = append(out, fe.Field)
	}
	sort.Strings(out)
	return out
}

func TestSpawnValidation(t *testing.T) {
	many := map[string]string{}
	for i := 0; i < 33; i++ {
		many["k"+strconv.Itoa(i)] = "v"
	}
	ok := service.SpawnRequest{TaskDescription: "do it"}
	with := func(edit func(*service.SpawnRequest)) service.SpawnRequest { r := ok; edit(&r); return r }
	tests := []struct {
		name  string
		req   service.SpawnRequest
		field string
		class error // besides ErrInvalidArgument
	}{
		{"missing description", with(func(r *service.SpawnRequest) { r.TaskDescription = "" }), "task_description", nil},
		{"blank description", with(func(r *service.SpawnRequest) { r.TaskDescription = " \n\t " }), "task_description", nil},
		{"oversize description", with(func(r *service.SpawnRequest) { r.TaskDescription = strings.Repeat("x", 1001) }), "task_description", errdefs.ErrTooLarge},
		{"NUL in description", with(func(r *service.SpawnRequest) { r.TaskDescription = "a\x00b" }), "task_description", nil},
		{"unknown agent", with(func(r *service.SpawnRequest) { r.Agent = "gpt" }), "agent", nil},
		{"command agent without command", with(func(r *service.SpawnRequest) { r.Agent = task.AgentCommand }), "command", nil},
		{"command with claude", with(func(r *service.SpawnRequest) { r.Agent = task.AgentClaude; r.Command = []string{"ls"} }), "command", nil},
		{"command with model gemini", with(func(r *service.SpawnRequest) { r.Model = "gemini"; r.Command = []string{"ls"} }), "command", nil},
		{"empty program", with(func(r *service.SpawnRequest) { r.Command = []string{" "} }), "command[0]", nil},
		{"timeout 121", with(func(r *service.SpawnRequest) { r.TimeoutMinutes = new(121) }), "timeout_minutes", nil},
		{"timeout -1", with(func(r *service.SpawnRequest) { r.TimeoutMinutes = new(-1) }), "timeout_minutes", nil},
		{"timeout 0", with(func(r *service.SpawnRequest) { r.TimeoutMinutes = new(0) }), "timeout_minutes", nil},
		{"unknown runtime", with(func(r *service.SpawnRequest) { r.Runtime = "nope" }), "runtime", nil},
		{"unavailable runtime", with(func(r *service.SpawnRequest) { r.Runtime = "gvisor" }), "runtime", errdefs.ErrFailedPrecondition},
		{"image with local", with(func(r *service.SpawnRequest) { r.Image = "alpine" }), "image", nil},
		{"unknown network", with(func(r *service.SpawnRequest) { r.Network = "open" }), "network", nil},
		{"bad memory", with(func(r *service.SpawnRequest) { r.Resources = &service.ResourceRequest{MemoryLimit: "lots"} }), "resources.memory_limit", nil},
		{"tiny memory", with(func(r *service.SpawnRequest) { r.Resources = &service.ResourceRequest{MemoryLimit: "1Mi"} }), "resources.memory_limit", nil},
		{"bad cpu", with(func(r *service.SpawnRequest) { r.Resources = &service.ResourceRequest{CPULimit: "fast"} }), "resources.cpu_limit", nil},
		{"zero cpu", with(func(r *service.SpawnRequest) { r.Resources = &service.ResourceRequest{CPULimit: "0"} }), "resources.cpu_limit", nil},
		{"bad pids", with(func(r *service.SpawnRequest) { r.Resources = &service.ResourceRequest{PidsLimit: 2} }), "resources.pids_limit", nil},
		{"context ..", with(func(r *service.SpawnRequest) { r.ContextFiles = []string{"../events.db"} }), "context_files[0]", workspace.ErrPathEscapes},
		{"context NUL", with(func(r *service.SpawnRequest) { r.ContextFiles = []string{"data/a\x00.txt"} }), "context_files[0]", workspace.ErrPathEscapes},
		// An absolute path is refused, not read as relative to shared/.
		{"context /etc/passwd", with(func(r *service.SpawnRequest) { r.ContextFiles = []string{"/etc/passwd"} }), "context_files[0]", errdefs.ErrInvalidArgument},
		{"context symlink out", with(func(r *service.SpawnRequest) { r.ContextFiles = []string{"data/ok.txt", "data/link"} }), "context_files[1]", workspace.ErrPathEscapes},
		{"context missing", with(func(r *service.SpawnRequest) { r.ContextFiles = []string{"data/none.txt"} }), "context_files[0]", errdefs.ErrNotFound},
		{"context directory", with(func(r *service.SpawnRequest) { r.ContextFiles = []string{"data"} }), "context_files[0]", workspace.ErrIsDir},
		{"context root", with(func(r *service.SpawnRequest) { r.ContextFiles = []string{"/workspace/shared/"} }), "context_files[0]", nil},
		{"context duplicate names", with(func(r *service.SpawnRequest) { r.ContextFiles = []string{"data/ok.txt", "scripts/ok.txt"} }), "context_files[1]", nil},
		{"too many labels", with(func(r *service.SpawnRequest) { r.Labels = many }), "labels", nil},
		{"bad label key", with(func(r *service.SpawnRequest) { r.Labels = map[string]string{"Bad Key": "v"} }), "labels", nil},
	}
	f := MustNew(t, nil)
	f.MustShared(t, "data/ok.txt", "ok")
	f.MustShared(t, "scripts/ok.txt", "ok too")
	if err := os.Symlink("/etc/passwd", f.data.HostPath("shared", "data", "link")); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := f.o.Spawn(context.Background(), tt.req)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Spawn = %v, want ErrInvalidArgument", err)
			}
			if tt.class != nil && !errors.Is(err, tt.class) {
				t.Errorf("Spawn = %v, want it to wrap %v", err, tt.class)
			}
			if diff := cmp.Diff([]string{tt.field}, fields(err)); diff != "" {
				t.Errorf("fields of %v (-want +got):\n%s", err, diff)
			}
			if ids, _ := f.data.TaskIDs(); len(ids) != 0 {
				t.Errorf("a failed spawn left task directories %v", ids)
			}
			if evs := f.allEvents(t); len(evs) != 0 {
				t.Errorf("a failed spawn appended %d events", len(evs))
			}
		})
	}
}

func TestSpawnReportsEveryProblem(t *testing.T) {
	f := MustNew(t, nil)
	_, _, err := f.o.Spawn(context.Background(), service.SpawnRequest{
		TaskDescription: "",
		Agent:           "gpt",
		TimeoutMinutes:  new(500),
		Network:         "open",
		ContextFiles:    []string{"../x"},
	})
	want := []string{"agent", "context_files[0]", "network", "task_description", "timeout_minutes"}
	if diff := cmp.Diff(want, fields(err)); diff != "" {
		t.Errorf("fields of %v (-want +got):\n%s", err, diff)
	}
}

func TestSpawnDefaultsAndAgents(t *testing.T) {
	f := MustNew(t, nil)
	f.MustShared(t, "data/in.csv", "a,b\n1,2\n")
	tests := []struct {
		req          service.SpawnRequest
		agent, model string
		timeout      int
	}{
		{service.SpawnRequest{TaskDescription: "x"}, task.AgentClaude, "", 30},
		{service.SpawnRequest{TaskDescription: "x", Model: "claude"}, task.AgentClaude, "claude", 30},
		{service.SpawnRequest{TaskDescription: "x", Model: "gemini", TimeoutMinutes: new(120)}, task.AgentGemini, "gemini", 120},
		{service.SpawnRequest{TaskDescription: "x", Model: "claude-opus-4"}, task.AgentClaude, "claude-opus-4", 30},
		{service.SpawnRequest{TaskDescription: "x", Command: []string{"ls"}, TimeoutMinutes: new(1)}, task.AgentCommand, "", 1},
		// model names an agent (the seed's choice): an explicit agent wins;
		// the record keeps the seed's model (the agent is not handed it:
		// TestPrepareModel).
		{service.SpawnRequest{TaskDescription: "x", Agent: "gemini", Model: "claude"}, task.AgentGemini, "claude", 30},
		{service.SpawnRequest{TaskDescription: "x", Agent: "claude", Model: "claude"}, task.AgentClaude, "claude", 30},
	}
	for _, tt := range tests {
		got := f.MustSpawn(t, tt.req)
		if got.Agent != tt.agent || got.Model != tt.model || got.TimeoutMinutes != tt.timeout {
			t.Errorf("Spawn(%+v) = agent %q model %q timeout %d; want %q %q %d", tt.req, got.Agent, got.Model, got.TimeoutMinutes, tt.agent, tt.model, tt.timeout)
		}
		if got.Runtime != "local" || got.Network != task.NetworkNone || got.Status != task.Queued {
			t.Errorf("defaults: runtime %q network %q status %s", got.Runtime, got.Network, got.Status)
		}
	}

	got := f.MustSpawn(t, service.SpawnRequest{TaskDescription: "with context", ContextFiles: []string{"/workspace/shared/data/in.csv"},
		Resources: &service.ResourceRequest{MemoryLimit: "512Mi", CPULimit: "500m", PidsLimit: 64}})
	if diff := cmp.Diff([]string{"data/in.csv"}, got.ContextFiles); diff != "" {
		t.Errorf("context files (-want +got):\n%s", diff)
	}
	if want := (task.Resources{MemoryBytes: 512 << 20, CPUMillis: 500, Pids: 64}); got.Resources != want {
		t.Errorf("resources = %+v, want %+v", got.Resources, want)
	}
	b, err := os.ReadFile(filepath.Join(f.data.TaskPath(got.ID), "context", "in.csv"))
	if err != nil || string(b) != "a,b\n1,2\n" {
		t.Errorf("copied context = %q, %v", b, err)
	}
	prompt, err := os.ReadFile(filepath.Join(f.data.TaskPath(got.ID), "prompt.md"))
	if err != nil || !strings.Contains(string(prompt), "with context") || !strings.Contains(string(prompt), "/task/context/in.csv") {
		t.Errorf("prompt.md = %q, %v", prompt, err)
	}
}

func TestSpawnIdempotency(t *testing.T) {
	f := MustNew(t, nil)
	ctx := context.Background()
	req := service.SpawnRequest{TaskDescription: "once", IdempotencyKey: "key-1"}
	first := f.MustSpawn(t, req)
	again, existing, err := f.o.Spawn(ctx, req)
	if err != nil || !existing || again.ID != first.ID {
		t.Errorf("same key, same args = %s existing %v, %v; want %s existing", again.ID, existing, err, first.ID)
	}
	other := req
	other.TaskDescription = "twice"
	if _, _, err := f.o.Spawn(ctx, other); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("same key, other args = %v, want ErrConflict", err)
	}
	if ids, _ := f.data.TaskIDs(); len(ids) != 1 {
		t.Errorf("task directories %v, want one", ids)
	}
	if evs := f.allEvents(t); len(evs) != 2 {
		t.Errorf("%d events, want the first spawn's 2", len(evs))
	}
}

// ai_worker_config.enabled: false refuses new work, clearly, and makes
// nothing.
func TestSpawnDisabled(t *testing.T) {
	f := MustNew(t, func(o *Options) { o.Disabled = true })
	_, _, err := f.o.Spawn(context.Background(), service.SpawnRequest{TaskDescription: "x"})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "ai_worker_config.enabled") {
		t.Errorf("spawn while disabled = %v, want unavailable naming ai_worker_config.enabled", err)
	}
	if ids, _ := f.data.TaskIDs(); len(ids) != 0 {
		t.Errorf("task directories %v, want none", ids)
	}
}

// Concurrent spawns cannot pass the queue bound together.
func TestSpawnQueueBoundConcurrent(t *testing.T) {
	f := MustNew(t, func(o *Options) { o.Limits.MaxQueued = 5 })
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.o.Spawn(context.Background(), service.SpawnRequest{TaskDescription: fmt.Sprint(i)})
		}()
	}
	wg.Wait()
	if q := f.o.tasks.Counts(); q[task.Queued] != 5 {
		t.Errorf("%d tasks queued against a bound of 5", q[task.Queued])
	}
}

func TestSpawnQueueFull(t *testing.T) {
	f := MustNew(t, func(o *Options) { o.Limits.MaxQueued = 2 })
	f.MustSpawn(t, service.SpawnRequest{TaskDescription: "1"})
	f.MustSpawn(t, service.SpawnRequest{TaskDescription: "2"})
	_, _, err := f.o.Spawn(context.Background(), service.SpawnRequest{TaskDescription: "3"})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("third spawn = %v, want ErrResourceExhausted", err)
	}
	if ids, _ := f.data.TaskIDs(); len(ids) != 2 {
		t.Errorf("task directories %v, want two", ids)
	}
}

func TestCancel(t *testing.T) {
	f := MustNew(t, nil)
	ctx := context.Background()
	tk := f.MustSpawn(t, service.SpawnRequest{TaskDescription: "x"})
	got, err := f.o.Cancel(ctx, tk.ID)
	if err != nil || got.Status != task.Cancelled || got.ErrorMessage != "cancelled before it started" {
		t.Fatalf("Cancel(queued) = %s %q, %v", got.Status, got.ErrorMessage, err)
	}
	if _, err := f.o.Cancel(ctx, tk.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Cancel(ended) = %v, want ErrConflict", err)
	}
	if _, err := f.o.Cancel(ctx, "task-nope"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Cancel(bad id) = %v, want ErrInvalidArgument", err)
	}
	if _, err := f.o.Cancel(ctx, task.NewID()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Cancel(unknown) = %v, want ErrNotFound", err)
	}

	// A running task is asked to stop; Cancel waits for it to end.
	run := f.MustRunning(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			cur, _ := f.tasks.Get(run.ID)
			if cur.CancelRequested {
				f.MustAppend(t, run.ID, projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Cancelled}, "scheduler"))
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	got, err = f.o.Cancel(ctx, run.ID)
	<-done
	if err != nil || got.Status != task.Cancelled {
		t.Errorf("Cancel(running) = %s, %v; want cancelled", got.Status, err)
	}
}

func TestResultWait(t *testing.T) {
	f := MustNew(t, nil)
	ctx := context.Background()
	tk := f.MustSpawn(t, service.SpawnRequest{TaskDescription: "x"})

	start := time.Now()
	res, err := f.o.Result(ctx, service.ResultRequest{TaskID: tk.ID, Wait: 100 * time.Millisecond})
	if err != nil || res.Done || res.Status != task.Queued {
		t.Errorf("Result(queued, short wait) = done %v %s, %v", res.Done, res.Status, err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("Result returned after %s, before its wait", d)
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(100 * time.Millisecond)
		f.MustAppend(t, tk.ID, projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Failed, ErrorMessage: "nope"}, "test"))
	}()
	start = time.Now()
	res, err = f.o.Result(ctx, service.ResultRequest{TaskID: tk.ID, Wait: 30 * time.Second})
	<-done
	if err != nil || !res.Done || res.Status != task.Failed || res.ErrorMessage != "nope" {
		t.Errorf("Result(wait) = done %v %s %q, %v", res.Done, res.Status, res.ErrorMessage, err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Result took %s, want it back as soon as the task ended", d)
	}
	if _, err := f.o.Result(ctx, service.ResultRequest{TaskID: tk.ID, Wait: time.Hour}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Result(wait 1h) = %v, want ErrInvalidArgument", err)
	}
}

func TestResultFileContents(t *testing.T) {
	f := MustNew(t, nil)
	tk := f.MustSpawn(t, service.SpawnRequest{TaskDescription: "x"})
	f.MustTaskFile(t, tk.ID, "output/summary.md", "all good")
	f.MustAppend(t, tk.ID, projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Success}, "test"))
	res, err := f.o.Result(context.Background(), service.ResultRequest{TaskID: tk.ID, IncludeFileContents: []string{"summary.md", "../prompt.md"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.FileContents["summary.md"]; got.Content != "all good" || got.Encoding != "utf-8" {
		t.Errorf("summary.md = %+v", got)
	}
	if got := res.FileContents["../prompt.md"]; got.Content != "" || !strings.Contains(got.Note, "escapes") {
		t.Errorf("../prompt.md = %+v, want refused", got)
	}
}

// A reader of a task's events that resumes after one retention removed
// is told so, and how to read them again; one that resumes after an event
// retention kept reads on over the gaps; an id no task ever had is only
// not found.
func TestEventsAfterCompaction(t *testing.T) {
	f := MustNew(t, nil)
	ctx := context.Background()
	tk := f.MustRunning(t)
	tk = f.MustAppend(t, tk.ID, projection.NewEvent(task.EventProgress, task.Progress{Kind: "text", Text: "a"}, "test"),
		projection.NewEvent(task.EventProgress, task.Progress{Kind: "text", Text: "b"}, "test"),
		projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Success}, "test"))
	evs, err := f.store.ReadStream(ctx, task.StreamID(tk.ID), 0)
	if err != nil {
		t.Fatal(err)
	}
	byType := func(typ string) string {
		for _, e := range evs {
			if e.Type == typ {
				return e.ID
			}
		}
		t.Fatalf("no %s event", typ)
		return ""
	}
	progress, started := byType(task.EventProgress), byType(task.EventStarted)
	read := func(after string) ([]string, error) {
		var types []string
		err := f.o.Events(ctx, service.EventsRequest{TaskID: tk.ID, After: after}, func(e eventstore.Event) error {
			types = append(types, e.Type)
			return nil
		})
		return types, err
	}
	if _, err := read("evt_never"); !errors.Is(err, errdefs.ErrNotFound) || strings.Contains(err.Error(), "retention") {
		t.Errorf("after an id no task had, before any compaction: %v, want only not found", err)
	}
	marker := projection.NewEvent(task.EventCompacted, task.Compacted{Removed: 2, Through: tk.Version}, "test")
	if _, _, err := f.store.Compact(ctx, task.StreamID(tk.ID), tk.Version, task.CompactedTypes, marker); err != nil {
		t.Fatal(err)
	}

	_, err = read(progress)
	if !errors.Is(err, errdefs.ErrNotFound) || !slices.Equal(fields(err), []string{"after"}) ||
		!strings.Contains(err.Error(), "retention has removed 2 of them") || !strings.Contains(err.Error(), "without after") {
		t.Errorf("after a removed event: %v, want not found saying retention removed it", err)
	}
	if types, err := read(started); err != nil || !slices.Equal(types, []string{task.EventCompleted, task.EventCompacted}) {
		t.Errorf("after a kept event: %v, %v; want the end and the marker", types, err)
	}
}

func TestListPages(t *testing.T) {
	f := MustNew(t, nil)
	ctx := context.Background()
	var made []string
	for i := 0; i < 3; i++ {
		made = append(made, f.MustSpawn(t, service.SpawnRequest{TaskDescription: "x"}).ID)
	}
	page, err := f.o.List(ctx, service.ListRequest{Limit: 2})
	if err != nil || len(page.Tasks) != 2 || page.NextCursor != made[1] {
		t.Fatalf("first page = %d tasks, cursor %q, %v", len(page.Tasks), page.NextCursor, err)
	}
	page, err = f.o.List(ctx, service.ListRequest{Limit: 2, Cursor: page.NextCursor})
	if err != nil || len(page.Tasks) != 1 || page.Tasks[0].ID != made[0] || page.NextCursor != "" {
		t.Errorf("second page = %+v, %v", page, err)
	}
	_, err = f.o.List(ctx, service.ListRequest{Status: "done", Limit: 1000, Cursor: "x"})
	if diff := cmp.Diff([]string{"cursor", "limit", "status"}, fields(err)); diff != "" {
		t.Errorf("List validation fields (-want +got):\n%s", diff)
	}
}

func TestFollowUp(t *testing.T) {
	f := MustNew(t, nil)
	ctx := context.Background()
	prev := f.MustSpawn(t, service.SpawnRequest{TaskDescription: "first pass", Agent: task.AgentClaude})
	prev = f.MustAppend(t, prev.ID,
		projection.NewEvent(task.EventStarting, nil, "test"),
		projection.NewEvent(task.EventStarted, task.Started{SandboxName: prev.ID}, "test"))
	if _, _, err := f.o.Spawn(ctx, service.SpawnRequest{TaskDescription: "more", FollowUpOf: prev.ID}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("follow-up of a running task: %v, want failed precondition", err)
	}
	f.MustTaskFile(t, prev.ID, "output/report.md", "# first pass\n")
	f.MustTaskFile(t, prev.ID, ".home/.claude/projects/-task/s1.jsonl", "{}\n")
	f.MustAppend(t, prev.ID, projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Success, SessionID: "s1"}, "test"))

	next := f.MustSpawn(t, service.SpawnRequest{TaskDescription: "refine the report", FollowUpOf: prev.ID})
	if next.Agent != prev.Agent || next.FollowUpOf != prev.ID {
		t.Errorf("follow-up agent %q of %q, want %q of %q", next.Agent, next.FollowUpOf, prev.Agent, prev.ID)
	}
	for name, want := range map[string]string{"context/previous/report.md": "# first pass\n", ".home/.claude/projects/-task/s1.jsonl": "{}\n"} {
		if got, err := os.ReadFile(filepath.Join(f.data.TaskPath(next.ID), name)); err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", name, got, err, want)
		}
	}
	if prompt, _ := os.ReadFile(filepath.Join(f.data.TaskPath(next.ID), "prompt.md")); !strings.Contains(string(prompt), "/task/context/previous/") {
		t.Errorf("prompt.md does not point at the previous output:\n%s", prompt)
	}
	// That its sandbox resumes session s1 is the task runner's to test
	// (taskrun's TestPrepareFollowUpResumes).
	for _, bad := range []string{"task-00000000000000000000000000", "nonsense"} {
		_, _, err := f.o.Spawn(ctx, service.SpawnRequest{TaskDescription: "x", FollowUpOf: bad})
		var fe *errdefs.FieldError
		if !errors.As(err, &fe) || fe.Field != "follow_up_of" {
			t.Errorf("follow_up_of %q: %v, want a field error naming follow_up_of", bad, err)
		}
	}
}

// claimingStore is a store that, before it records a task's creation,
// moves the task's entries out of its directory into a new one renamed
// over it, as a warm sandbox's claim does once the task is recorded: on a
// busy host that can come before the spawn's fsyncs of its files run.
type claimingStore struct {
	eventstore.Store
	data *workspace.DataRoot
}

func (s claimingStore) Append(ctx context.Context, stream string, expected int64, evs ...eventstore.Proposed) ([]eventstore.Event, error) {
	if len(evs) > 0 && evs[0].Type == task.EventCreated {
		dir := s.data.TaskPath(task.IDFromStream(stream))
		slot := dir + ".slot"
		if err := os.Mkdir(slot, 0o755); err != nil {
			return nil, err
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if err := os.Rename(filepath.Join(dir, e.Name()), filepath.Join(slot, e.Name())); err != nil {
				return nil, err
			}
		}
		if err := unix.Rename(slot, dir); err != nil {
			return nil, err
		}
	}
	return s.Store.Append(ctx, stream, expected, evs...)
}

// TestSpawnSyncsInputsMoved: the fsyncs of what a spawn wrote (prompt.md,
// context files), beside the task's first commit, reach the files even
// when a claim has moved them by then (they were once opened only when
// the goroutine ran, found nothing there, and the spawn warned "prompt.md
// not synced to disk").
func TestSpawnSyncsInputsMoved(t *testing.T) {
	var opts Options
	f := MustNew(t, func(o *Options) {
		o.Store = claimingStore{Store: o.Store, data: o.Data}
		o.Tasks = projection.New(o.Store, slog.New(slog.DiscardHandler))
		opts = *o
	})
	f.MustShared(t, "in.csv", "1,2")
	var logs testenv.SyncBuffer
	o := New(opts, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	for range 5 {
		tk, _, err := o.Spawn(context.Background(), service.SpawnRequest{TaskDescription: "the task", Command: []string{"true"}, ContextFiles: []string{"in.csv"}})
		if err != nil {
			t.Fatal(err)
		}
		dir := opts.Data.TaskPath(tk.ID)
		if b, err := os.ReadFile(filepath.Join(dir, workerproto.PromptFile)); err != nil || !strings.Contains(string(b), "the task") {
			t.Fatalf("prompt.md after the move: %q, %v", b, err)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "context", "in.csv")); err != nil || string(b) != "1,2" {
			t.Fatalf("context/in.csv after the move: %q, %v", b, err)
		}
	}
	if s := logs.String(); s != "" {
		t.Errorf("the spawns warned:\n%s", s)
	}
}

// BenchmarkSpawnContext: a spawn that copies three context files of 16 KiB
// from shared/, to its answer (the files and the task's first events
// durable).
func BenchmarkSpawnContext(b *testing.B) {
	f := MustNew(b, func(o *Options) { o.Limits.MaxQueued = 0 })
	names := []string{"a.csv", "b.csv", "c.csv"}
	for _, n := range names {
		f.MustShared(b, n, strings.Repeat("x", 16<<10))
	}
	req := service.SpawnRequest{TaskDescription: "the task", Command: []string{"true"}, ContextFiles: names}
	for b.Loop() {
		if _, _, err := f.o.Spawn(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSpawnAdmitted: a spawn the scheduler admits records task_starting in
// its own commit, after task_queued, answers queued as SPEC §2 has it, and
// lets the scheduler know once the commit is applied; one it does not
// admit records created and queued alone.
func TestSpawnAdmitted(t *testing.T) {
	admit := true
	var done int
	f := MustNew(t, func(o *Options) {
		o.Admit = func(task.Spec) (eventstore.Proposed, func(), bool) {
			if !admit {
				return eventstore.Proposed{}, nil, false
			}
			return projection.NewEvent(task.EventStarting, task.StartingOn{Replica: "r1"}, "scheduler"), func() { done++ }, true
		}
	})
	got := f.MustSpawn(t, service.SpawnRequest{TaskDescription: "x", Agent: task.AgentCommand, Command: []string{"true"}})
	if got.Status != task.Queued || done != 1 {
		t.Errorf("admitted spawn answered %s, done called %d times; want queued and once", got.Status, done)
	}
	if cur, _ := f.tasks.Get(got.ID); cur.Status != task.Starting || cur.Replica != "r1" {
		t.Errorf("admitted task is %s on %q, want starting on r1", cur.Status, cur.Replica)
	}
	evs, err := f.store.ReadStream(context.Background(), task.StreamID(got.ID), 0)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range evs {
		types = append(types, e.Type)
	}
	if diff := cmp.Diff([]string{task.EventCreated, task.EventQueued, task.EventStarting}, types); diff != "" || !evs[2].RecordedAt.Equal(evs[0].RecordedAt) {
		t.Errorf("admitted spawn's events (-want +got), want one commit:\n%s", diff)
	}
	admit = false
	got = f.MustSpawn(t, service.SpawnRequest{TaskDescription: "y", Agent: task.AgentCommand, Command: []string{"true"}})
	if cur, _ := f.tasks.Get(got.ID); got.Status != task.Queued || cur.Status != task.Queued || done != 1 {
		t.Errorf("spawn not admitted: answered %s, is %s, done %d; want queued, queued, 1", got.Status, cur.Status, done)
	}
}
