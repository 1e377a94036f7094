//go:build integration

package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

func TestTaskWithContextAndOutput(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()
	csv := "date,category,amount\n2026-01-02,food,12.50\n2026-01-03,rent,900\n2026-01-04,food,7.25\n"
	s.mustWriteWorkspace(t, "data/tx.csv", []byte(csv))
	tk := mustSpawn(t, s.client, service.SpawnRequest{
		TaskDescription: "total the food spending",
		ContextFiles:    []string{"data/tx.csv"},
		Command: []string{"sh", "-c", `awk -F, '$2=="food"{s+=$3} END{printf "%.2f\n", s}' context/tx.csv > output/food.txt
mkdir -p output/charts && printf 'PNG' > output/charts/fake.bin
grep -c food /task/prompt.md >/dev/null && echo "food total written"`},
	})
	if tk.Agent != task.AgentCommand {
		t.Errorf("agent = %q, want command (argv given)", tk.Agent)
	}
	res := s.waitSuccess(t, tk.ID, 30*time.Second, "food.txt")
	if got := res.FileContents["food.txt"].Content; got != "19.75\n" {
		t.Errorf("food.txt = %q, want 19.75", got)
	}
	var names []string
	for _, f := range res.OutputFiles {
		names = append(names, f.Name)
	}
	if want := []string{"charts/fake.bin", "food.txt"}; !slices.Equal(names, want) {
		t.Errorf("output files %v, want %v", names, want)
	}
	if res.Summary != "food total written" {
		t.Errorf("summary %q", res.Summary)
	}
	if res.ExitCode == nil || *res.ExitCode != 0 || res.DurationSeconds == nil {
		t.Errorf("exit code %v, duration %v", res.ExitCode, res.DurationSeconds)
	}
	var buf bytes.Buffer
	if err := s.client.Download(ctx, tk.ID, "food.txt", &buf); err != nil || buf.String() != "19.75\n" {
		t.Errorf("download food.txt: %q, %v", buf.String(), err)
	}
	// The context is a copy: the shared original is untouched, and the task
	// directory holds prompt.md with the description.
	prompt, err := os.ReadFile(filepath.Join(s.data, "tasks", tk.ID, "prompt.md"))
	if err != nil || !strings.Contains(string(prompt), "total the food spending") || !strings.Contains(string(prompt), "/task/context/tx.csv") {
		t.Errorf("prompt.md = %q, %v", prompt, err)
	}
}

func TestFailingCommand(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	tk := s.spawn(t, "fail", "sh", "-c", "echo working; echo 'something broke: disk on fire' >&2; exit 3")
	res := s.wait(t, tk.ID, 30*time.Second)
	if res.Status != task.Failed {
		t.Fatalf("status %s, want failed", res.Status)
	}
	if res.ExitCode == nil || *res.ExitCode != 3 {
		t.Errorf("exit code %v, want 3", res.ExitCode)
	}
	if !strings.Contains(res.ErrorMessage, "disk on fire") || !strings.Contains(res.ErrorMessage, "3") {
		t.Errorf("error_message %q does not carry the exit code and stderr tail", res.ErrorMessage)
	}
}

func TestTimeoutKillsTheTree(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	tk := mustSpawn(t, s.client, service.SpawnRequest{
		TaskDescription: "sleep past the timeout", TimeoutMinutes: new(1),
		Command: []string{"sh", "-c", "sleep 1001 & sleep 1001"},
	})
	s.waitStatus(t, tk.ID, task.Running, 20*time.Second)
	res := s.wait(t, tk.ID, 90*time.Second)
	if res.Status != task.Timeout {
		t.Fatalf("status %s, want timeout", res.Status)
	}
	if !strings.Contains(res.ErrorMessage, "timed out") {
		t.Errorf("error_message %q", res.ErrorMessage)
	}
	waitGone(t, "sleep", "1001")
}

func waitGone(t *testing.T, argv ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for processRunning(argv...) {
		if time.Now().After(deadline) {
			t.Fatalf("%v still runs", argv)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestCancelQueuedAndRunning(t *testing.T) {
	t.Parallel()
	s := MustStart(t, func(c *config.Config) { c.AIWorker.MaxConcurrentWorkers = 1 })
	ctx := context.Background()
	running := s.spawn(t, "long", "sh", "-c", "sleep 1002 & sleep 1002")
	queued := s.spawn(t, "waits its turn", "true")
	s.waitStatus(t, running.ID, task.Running, 20*time.Second)
	if got, _ := s.client.Get(ctx, queued.ID); got.Status != task.Queued {
		t.Fatalf("second task is %s, want queued behind the limit of 1", got.Status)
	}
	got, err := s.client.Cancel(ctx, queued.ID)
	if err != nil || got.Status != task.Cancelled {
		t.Fatalf("cancel queued: %v, %v", got.Status, err)
	}
	got, err = s.client.Cancel(ctx, running.ID)
	if err != nil || got.Status != task.Cancelled {
		t.Fatalf("cancel running: %v, %v", got.Status, err)
	}
	waitGone(t, "sleep", "1002")
	if _, err := s.client.Cancel(ctx, running.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("cancel of an ended task: %v, want a conflict", err)
	}
	if d, err := os.ReadDir(filepath.Join(s.data, "tasks", queued.ID, "output")); err != nil || len(d) != 0 {
		t.Errorf("the cancelled queued task ran: %v %v", d, err)
	}
}

func TestConcurrencyLimit(t *testing.T) {
	t.Parallel()
	s := MustStart(t, func(c *config.Config) { c.AIWorker.MaxConcurrentWorkers = 2 })
	var ids []string
	for i := 0; i < 5; i++ {
		tk := s.spawn(t, "overlap check", "sh", "-c", "date +%s.%N > output/start; sleep 0.5; date +%s.%N > output/end")
		ids = append(ids, tk.ID)
	}
	type span struct{ start, end float64 }
	var spans []span
	for _, id := range ids {
		res := s.waitSuccess(t, id, 60*time.Second, "start", "end")
		st, _ := strconv.ParseFloat(strings.TrimSpace(res.FileContents["start"].Content), 64)
		en, _ := strconv.ParseFloat(strings.TrimSpace(res.FileContents["end"].Content), 64)
		spans = append(spans, span{st, en})
	}
	for _, a := range spans {
		n := 0
		for _, b := range spans {
			if b.start <= a.start && a.start < b.end {
				n++
			}
		}
		if n > 2 {
			t.Fatalf("%d tasks ran at once at %f, limit is 2: %v", n, a.start, spans)
		}
	}
}

func TestIdempotentSpawn(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()
	req := service.SpawnRequest{TaskDescription: "once", Command: []string{"true"}, IdempotencyKey: "chat-42-msg-7"}
	a, existing, err := s.client.Spawn(ctx, req)
	if err != nil || existing {
		t.Fatalf("first spawn: %v existing=%v", err, existing)
	}
	b, existing, err := s.client.Spawn(ctx, req)
	if err != nil || !existing || b.ID != a.ID {
		t.Fatalf("second spawn: %s existing=%v err=%v, want %s", b.ID, existing, err, a.ID)
	}
	req.TaskDescription = "something else"
	if _, _, err := s.client.Spawn(ctx, req); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("same key, other arguments: %v, want a conflict", err)
	}
	page, err := s.client.List(ctx, service.ListRequest{})
	if err != nil || len(page.Tasks) != 1 {
		t.Errorf("%d tasks, want 1 (%v)", len(page.Tasks), err)
	}
}

func TestListFiltersAndCursor(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "t", Command: []string{"true"}, ConversationID: "conv-a"})
	}
	other := s.spawn(t, "other conversation", "false")
	s.wait(t, other.ID, 30*time.Second)
	var seen []string
	cursor := ""
	for {
		page, err := s.client.List(ctx, service.ListRequest{ConversationID: "conv-a", Limit: 2, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range page.Tasks {
			seen = append(seen, tk.ID)
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	if len(seen) != 3 || !slices.IsSortedFunc(seen, func(a, b string) int { return strings.Compare(b, a) }) {
		t.Errorf("conversation pages gave %v, want 3 ids newest first", seen)
	}
	page, err := s.client.List(ctx, service.ListRequest{Status: "failed"})
	if err != nil || len(page.Tasks) != 1 || page.Tasks[0].ID != other.ID {
		t.Errorf("status=failed gave %v, %v", page.Tasks, err)
	}
}

func TestLogsFollowAndEvents(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()
	tk := s.spawn(t, "chatty", "sh", "-c", "for i in 1 2 3 4 5; do echo line $i; sleep 0.2; done")
	var logs bytes.Buffer
	if err := s.client.Logs(ctx, service.LogsRequest{TaskID: tk.ID, Follow: true}, &logs); err != nil {
		t.Fatal(err)
	}
	if want := "line 1\nline 2\nline 3\nline 4\nline 5\n"; logs.String() != want {
		t.Errorf("followed logs %q, want %q", logs.String(), want)
	}
	var types []string
	var first string
	progress := 0
	// Lifecycle events in order; the worker's task_progress events (here:
	// the lines the command printed) come between them, how many depends
	// on their coalescing.
	lifecycle := func(e eventstore.Event) bool {
		if e.Type == task.EventProgress {
			progress++
			return false
		}
		return true
	}
	err := s.client.Events(ctx, service.EventsRequest{TaskID: tk.ID}, func(e eventstore.Event) error {
		if first == "" {
			first = e.ID
		}
		if lifecycle(e) {
			types = append(types, e.Type)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{task.EventCreated, task.EventQueued, task.EventStarting, task.EventStarted, task.EventCompleted}
	if !slices.Equal(types, want) || progress == 0 {
		t.Errorf("events %v with %d progress events, want %v and some progress", types, progress, want)
	}
	// SSE resumes after an event id.
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var resumed []string
	err = s.client.Events(sctx, service.EventsRequest{TaskID: tk.ID, After: first, Follow: true}, func(e eventstore.Event) error {
		if lifecycle(e) {
			resumed = append(resumed, e.Type)
		}
		if e.Type == task.EventCompleted {
			return errStop
		}
		return nil
	})
	if !errors.Is(err, errStop) || !slices.Equal(resumed, want[1:]) {
		t.Errorf("SSE after the first event gave %v (%v), want %v", resumed, err, want[1:])
	}
}

var errStop = errors.New("stop")

func TestToolsOverHTTP(t *testing.T) {
	t.Parallel()
	s := MustStart(t, withExec)
	code, body := s.do(t, "GET", "/api/tools", "", nil)
	var defs []struct {
		Type     string `json:"type"`
		Function struct {
			Name       string          `json:"name"`
			Parameters json.RawMessage `json:"parameters"`
		} `json:"function"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &defs) != nil {
		t.Fatalf("GET /api/tools: %d %s", code, body)
	}
	var names []string
	for _, d := range defs {
		names = append(names, d.Function.Name)
	}
	want := []string{"spawn_worker", "read_task_result", "list_worker_tasks", "cancel_worker_task", "read_workspace", "write_workspace", "list_workspace",
		"create_attachment_from_workspace", "ingest_from_workspace", "export_notes_to_workspace", "search_documents", "list_skills", "get_skill", "create_skill",
		"code_execute", "workspace_exec", "suspend_session", "resume_session", "fork_session", "spawn_workspace_task"}
	if !slices.Equal(names, want) {
		t.Errorf("tools %v, want %v", names, want)
	}
	code, body = s.do(t, "POST", "/api/tools/write_workspace", "application/json", strings.NewReader(`{"path":"scripts/hello.sh","content":"echo hello from shared\n"}`))
	if code != 200 {
		t.Fatalf("write_workspace: %d %s", code, body)
	}
	code, body = s.do(t, "POST", "/api/tools/spawn_worker", "application/json", strings.NewReader(`{"task_description":"run the shared script","agent":"command","command":["sh","/workspace/shared/scripts/hello.sh"]}`))
	var spawned struct {
		TaskID string `json:"task_id"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &spawned) != nil {
		t.Fatalf("spawn_worker: %d %s", code, body)
	}
	code, body = s.do(t, "POST", "/api/tools/read_task_result", "application/json", strings.NewReader(`{"task_id":"`+spawned.TaskID+`","wait_seconds":30}`))
	if code != 200 || !strings.Contains(body, `"status":"success"`) || !strings.Contains(body, "hello from shared") {
		t.Errorf("read_task_result: %d %s", code, body)
	}
	code, body = s.do(t, "POST", "/api/tools/list_workspace", "application/json", strings.NewReader(`{"path":"scripts"}`))
	if code != 200 || !strings.Contains(body, "scripts/hello.sh") {
		t.Errorf("list_workspace: %d %s", code, body)
	}
	code, body = s.do(t, "POST", "/api/tools/read_workspace", "application/json", strings.NewReader(`{"path":"../corral.db"}`))
	if code != 403 || !strings.Contains(body, "escapes") {
		t.Errorf("read_workspace outside shared: %d %s", code, body)
	}
	code, _ = s.do(t, "POST", "/api/tools/no_such_tool", "application/json", strings.NewReader(`{}`))
	if code != 404 {
		t.Errorf("unknown tool: %d, want 404", code)
	}
	code, body = s.do(t, "GET", "/metrics", "", nil)
	if code != 200 || !strings.Contains(body, `corral_tasks{status="success"} 1`) || !strings.Contains(body, "corral_task_duration_seconds_count 1") {
		t.Errorf("metrics: %d %s", code, body)
	}
	// The task's life took commits of the event log (created, starting,
	// started, completed at least), each holding one event or more.
	commits, events := metricValue(t, body, "corral_event_commit_seconds_count"), metricValue(t, body, "corral_events_committed_total")
	if commits < 4 || events < commits {
		t.Errorf("metrics: %d commits of %d events, want 4 or more commits of at least one event each", commits, events)
	}
}

// metricValue is the value of the series name (a metric and its labels, as
// /metrics writes them) in a /metrics body.
func metricValue(t *testing.T, body, name string) uint64 {
	t.Helper()
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("/metrics: bad value in %q", line)
			}
			return n
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return 0
}

// withQuota2MiB sets the task directory quota to 2 MiB, with 1 MiB of
// context.
func withQuota2MiB(t *testing.T, c *config.Config) {
	c.Limits.MaxTaskDirBytes = mustSize(t, "2MiB")
	c.Limits.MaxContextBytes = mustSize(t, "1MiB")
}

func TestDiskFillerStoppedAtQuota(t *testing.T) {
	t.Parallel()
	s := MustStart(t, func(c *config.Config) { withQuota2MiB(t, c) })
	// Many small files: no single write hits a per-file limit, so only the
	// quota watcher can stop it.
	tk := s.spawn(t, "fill the disk", "sh", "-c", "i=0; while :; do head -c 262144 /dev/zero > output/f$i; i=$((i+1)); sleep 0.05; done")
	s.waitOverQuota(t, tk.ID)
	waitSandboxGone(t, s, tk.ID, 10*time.Second)
	count := func() int {
		ents, _ := os.ReadDir(filepath.Join(s.data, "tasks", tk.ID, "output"))
		return len(ents)
	}
	before := count()
	time.Sleep(500 * time.Millisecond)
	if after := count(); after != before {
		t.Errorf("the filler still writes after the task ended: %d files, then %d", before, after)
	}
}

func TestOneHugeFileStoppedAtQuota(t *testing.T) {
	t.Parallel()
	s := MustStart(t, func(c *config.Config) { withQuota2MiB(t, c) })
	// One write far past the quota: RLIMIT_FSIZE stops it at the limit at
	// once, before the quota watcher's next look.
	tk := s.spawn(t, "one huge file", "sh", "-c", "head -c 100000000 /dev/zero > output/huge")
	s.waitOverQuota(t, tk.ID)
	info, err := os.Stat(filepath.Join(s.data, "tasks", tk.ID, "output", "huge"))
	if err != nil || info.Size() > 2<<20 {
		t.Errorf("output/huge: %v, %v; want at most the 2MiB quota", info, err)
	}
}

func TestFollowUpSeesPreviousOutput(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	first := s.spawn(t, "count to three", "sh", "-c", "printf '1\\n2\\n3\\n' > output/numbers.txt")
	s.waitSuccess(t, first.ID, 30*time.Second)
	next := mustSpawn(t, s.client, service.SpawnRequest{
		TaskDescription: "sum what the previous task counted",
		FollowUpOf:      first.ID,
		Command:         []string{"sh", "-c", "awk '{s+=$1} END {print s}' context/previous/numbers.txt > output/sum.txt"},
	})
	res := s.wait(t, next.ID, 30*time.Second, "sum.txt")
	if res.Status != task.Success || res.FileContents["sum.txt"].Content != "6\n" {
		t.Errorf("follow-up: %s %q %s", res.Status, res.FileContents["sum.txt"].Content, res.ErrorMessage)
	}
}
