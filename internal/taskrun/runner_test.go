package taskrun

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/webhook"
	"github.com/corral-dev/corral/internal/workerproto"
)

func TestPrepare(t *testing.T) {
	f := MustNew(t)
	ctx := context.Background()
	cmdTask := f.MustCreate(t, task.Spec{Command: []string{"sh", "-c", "echo hi"}, TimeoutMinutes: 7,
		Resources: task.Resources{MemoryBytes: 1 << 30}})
	spec, err := f.r.Prepare(ctx, cmdTask)
	if err != nil {
		t.Fatal(err)
	}
	// Paths of the data root, which each runtime exposes its own way.
	wantMounts := []sandbox.Mount{
		{Source: "tasks/" + cmdTask.ID, Target: "/task"},
		{Source: "shared", Target: "/workspace/shared", ReadOnly: true},
		{Source: "run/bin/corral", Target: workerproto.CorralBinary, ReadOnly: true},
		{Source: "run/bin/corral-worker", Target: workerproto.WorkerBinary, ReadOnly: true},
		{Source: "run/sock", Target: workerproto.SocketDir, ReadOnly: true},
	}
	if diff := cmp.Diff(wantMounts, spec.Mounts); diff != "" {
		t.Errorf("mounts (-want +got):\n%s", diff)
	}
	if spec.ID != cmdTask.ID || spec.Dir != "/task" || spec.Command[0] != workerproto.WorkerBinary {
		t.Errorf("spec id %q dir %q argv[0] %q", spec.ID, spec.Dir, spec.Command[0])
	}
	if n := len(spec.Command); n < 4 || !slices.Equal(spec.Command[n-4:], []string{"--", "sh", "-c", "echo hi"}) {
		t.Errorf("argv %q, want it to end with -- sh -c 'echo hi'", spec.Command)
	}
	if slices.Contains(spec.Command, "--agent-binary") || slices.Contains(spec.Command, "--agent-arg") {
		t.Errorf("argv %q has --agent-binary or --agent-arg for the command agent", spec.Command)
	}
	wantKey := "CORRAL_WEBHOOK_KEY=" + hex.EncodeToString(webhook.DeriveKey(testSecret, cmdTask.ID))
	if !slices.Contains(spec.Env, wantKey) || !slices.Contains(spec.Env, "CORRAL_TASK_ID="+cmdTask.ID) {
		t.Errorf("env lacks the task id or derived webhook key")
	}
	for _, e := range spec.Env {
		if strings.Contains(e, string(testSecret)) || strings.Contains(e, hex.EncodeToString(testSecret)) {
			t.Errorf("env carries the server secret: %q", e)
		}
	}
	if want := (sandbox.Limits{MemoryBytes: 1 << 30, WallClock: 7 * time.Minute}); spec.Limits != want {
		t.Errorf("limits %+v, want %+v", spec.Limits, want)
	}
	if diff := cmp.Diff(map[string]string{sandbox.LabelManaged: "true", sandbox.LabelTaskID: cmdTask.ID}, spec.Labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}

	claude := f.MustCreate(t, task.Spec{Model: "claude-opus-4"})
	spec, err = f.r.Prepare(ctx, claude)
	if err != nil {
		t.Fatal(err)
	}
	argv := strings.Join(spec.Command, " ")
	if !strings.Contains(argv, "--agent claude --agent-binary /usr/local/bin/claude --agent-arg --verbose --model claude-opus-4") || slices.Contains(spec.Command, "--") {
		t.Errorf("claude argv %q", argv)
	}
	// The sandbox gets the agent's SandboxEnv, never its Env.
	if !slices.Contains(spec.Env, "ANTHROPIC_API_KEY=placeholder") || slices.Contains(spec.Env, "ANTHROPIC_API_KEY=k") {
		t.Errorf("claude env %q: want the key's placeholder, not the key", spec.Env)
	}
	// The seed's model names the agent: kept on the record, never handed
	// to the agent as a model name.
	seed := f.MustCreate(t, task.Spec{Agent: task.AgentClaude, Model: "claude"})
	if spec, err = f.r.Prepare(ctx, seed); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(spec.Command, "--model") {
		t.Errorf("argv %q hands the agent the seed's model", spec.Command)
	}
}

// TestPreparePromptLost: prompt.md reaches the disk beside the task's
// first events, so a crash can leave it missing, empty or torn; such a
// task must not start on what is left, and says why.
func TestPreparePromptLost(t *testing.T) {
	f := MustNew(t)
	ctx := context.Background()
	for name, damage := range map[string]func(path string) error{
		"missing": os.Remove,
		"empty":   func(p string) error { return os.Truncate(p, 0) },
		"torn":    func(p string) error { return os.Truncate(p, 5) },
		"other":   func(p string) error { return os.WriteFile(p, []byte("something else"), 0o644) },
	} {
		tk := f.MustCreate(t, task.Spec{Description: "the task", Command: []string{"true"}})
		if tk.PromptSHA256 == "" {
			t.Fatal("the created task records no prompt hash")
		}
		if _, err := f.r.Prepare(ctx, tk); err != nil {
			t.Fatalf("%s: before the damage: %v", name, err)
		}
		if err := damage(filepath.Join(f.data.TaskPath(tk.ID), workerproto.PromptFile)); err != nil {
			t.Fatal(err)
		}
		_, err := f.r.Prepare(ctx, tk)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "prompt.md did not survive") {
			t.Errorf("%s: Prepare: %v, want prompt.md did not survive (failed precondition)", name, err)
		}
	}
	// A task recorded before the hash was starts as before.
	tk := f.MustCreate(t, task.Spec{Description: "old", Command: []string{"true"}})
	tk.PromptSHA256 = ""
	os.Remove(filepath.Join(f.data.TaskPath(tk.ID), workerproto.PromptFile))
	if _, err := f.r.Prepare(ctx, tk); err != nil {
		t.Errorf("a task without a recorded hash: %v", err)
	}
}

// TestPrepareFollowUpResumes: a claude follow-up of a claude task that
// recorded its agent session resumes that session; one of a task of
// another agent, or of one without a session, starts afresh.
func TestPrepareFollowUpResumes(t *testing.T) {
	f := MustNew(t)
	ctx := context.Background()
	ended := func(agent, session string) task.Task {
		prev := f.MustStart(t, f.MustCreate(t, task.Spec{Description: "first pass", Agent: agent}))
		return f.MustAppend(t, prev.ID, projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Success, SessionID: session}, "test"))
	}
	prev := ended(task.AgentClaude, "s1")
	// What the spawn copies from the previous task (Prepare reads none of it).
	next := f.MustCreate(t, task.Spec{Description: "refine the report", Agent: task.AgentClaude, FollowUpOf: prev.ID})
	f.MustTaskFile(t, next.ID, "context/previous/report.md", "# first pass\n")
	f.MustTaskFile(t, next.ID, ".home/.claude/projects/-task/s1.jsonl", "{}\n")
	spec, err := f.r.Prepare(ctx, next)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(spec.Command, "--resume") || !slices.Contains(spec.Command, "s1") {
		t.Errorf("argv %q does not resume session s1", spec.Command)
	}

	for name, prev := range map[string]task.Task{
		"another agent's task": ended(task.AgentGemini, "s2"),
		"a task without one":   ended(task.AgentClaude, ""),
	} {
		next := f.MustCreate(t, task.Spec{Description: "more", Agent: task.AgentClaude, FollowUpOf: prev.ID})
		spec, err := f.r.Prepare(ctx, next)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(spec.Command, "--resume") {
			t.Errorf("follow-up of %s: argv %q resumes a session", name, spec.Command)
		}
	}
}

func TestCollect(t *testing.T) {
	f := MustNew(t, func(r *Options) { r.MaxTaskDirBytes = 4096 })
	ctx := context.Background()
	code := func(n int) *int { return &n }
	dur := 2.5
	tests := []struct {
		name  string
		files map[string]string
		exit  *sandbox.ExitStatus
		want  task.Completed
	}{
		{"success", map[string]string{"status.json": statusJSON("success", 0, " did it ", ""), "output/report.md": "# r"},
			&sandbox.ExitStatus{Code: 0},
			task.Completed{Status: task.Success, ExitCode: code(0), Summary: "did it", Reason: "exit", DurationSeconds: &dur,
				OutputFiles: []task.OutputFile{{Name: "report.md", Size: 3, Type: "text/markdown; charset=utf-8"}}}},
		{"failed", map[string]string{"status.json": statusJSON("failed", 2, "", "tests failed")},
			&sandbox.ExitStatus{Code: 2},
			task.Completed{Status: task.Failed, ExitCode: code(2), ErrorMessage: "tests failed", Reason: "exit", DurationSeconds: &dur}},
		{"no status.json", map[string]string{"output/a.txt": "a"},
			&sandbox.ExitStatus{Code: 3, Message: "boom"},
			task.Completed{Status: task.Failed, ExitCode: code(3), Reason: "exit",
				ErrorMessage: "the worker ended with exit code 3 without writing status.json (boom)",
				OutputFiles:  []task.OutputFile{{Name: "a.txt", Size: 1, Type: "text/plain; charset=utf-8"}}}},
		// A full disk kept the worker from writing status.json; its exit
		// 0, a success's alone, still says how it ended.
		{"no status.json, exit 0", map[string]string{"output/a.txt": "a"},
			&sandbox.ExitStatus{Code: 0},
			task.Completed{Status: task.Success, ExitCode: code(0), Reason: "exit",
				Summary:     "(the worker succeeded, but could not write status.json: its summary is lost; was the disk full?)",
				OutputFiles: []task.OutputFile{{Name: "a.txt", Size: 1, Type: "text/plain; charset=utf-8"}}}},
		{"lost", nil, nil,
			task.Completed{Status: task.Failed, Reason: "lost", ErrorMessage: "lost: the task's sandbox was gone when its server restarted or another adopted the task, and it left no status.json"}},
		{"vanished", nil, &sandbox.ExitStatus{Code: -1, Message: "exit status unknown"},
			task.Completed{Status: task.Failed, Reason: "lost", ErrorMessage: "lost: the task's sandbox vanished without an exit status or status.json (exit status unknown)"}},
		{"vanished after its status", map[string]string{"status.json": statusJSON("success", 0, "done", "")}, &sandbox.ExitStatus{Code: -1},
			task.Completed{Status: task.Success, ExitCode: code(0), Summary: "done", Reason: "recovered", DurationSeconds: &dur}},
		{"recovered", map[string]string{"status.json": statusJSON("success", 0, "done before restart", "")}, nil,
			task.Completed{Status: task.Success, ExitCode: code(0), Summary: "done before restart", Reason: "recovered", DurationSeconds: &dur}},
		{"oom", nil, &sandbox.ExitStatus{Code: 137, OOMKilled: true},
			task.Completed{Status: task.Failed, ExitCode: code(137), Reason: "exit", ErrorMessage: "out of memory: the sandbox reached its memory limit of 512MiB"}},
		{"oom with a failed status", map[string]string{"status.json": statusJSON("failed", 137, "", "killed")}, &sandbox.ExitStatus{Code: 137, OOMKilled: true},
			task.Completed{Status: task.Failed, ExitCode: code(137), Reason: "exit", DurationSeconds: &dur, ErrorMessage: "out of memory: the sandbox reached its memory limit of 512MiB"}},
		{"over quota", map[string]string{"status.json": statusJSON("success", 0, "big", ""), "output/big.bin": strings.Repeat("\x00", 5000)},
			&sandbox.ExitStatus{Code: 0},
			task.Completed{Status: task.Failed, ExitCode: code(0), Summary: "big", Reason: "exit", DurationSeconds: &dur,
				OutputFiles:  []task.OutputFile{{Name: "big.bin", Size: 5000, Type: "application/octet-stream"}},
				ErrorMessage: "output quota exceeded: the task directory holds 5"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tk := f.MustCreate(t, task.Spec{Description: tt.name, Resources: task.Resources{MemoryBytes: 512 << 20}})
			for name, content := range tt.files {
				f.MustTaskFile(t, tk.ID, name, content)
			}
			got := f.r.Collect(ctx, tk, tt.exit)
			if strings.HasPrefix(got.ErrorMessage, "output quota exceeded") && strings.HasPrefix(got.ErrorMessage, tt.want.ErrorMessage) {
				got.ErrorMessage = tt.want.ErrorMessage
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Collect (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCollectSkipsSymlinks(t *testing.T) {
	f := MustNew(t)
	tk := f.MustCreate(t, task.Spec{})
	f.MustTaskFile(t, tk.ID, "output/real.txt", "r")
	dir := f.data.TaskPath(tk.ID)
	for link, target := range map[string]string{"output/passwd": "/etc/passwd", "output/alias.txt": "real.txt"} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	// status.json as a symlink is not read: the worker cannot point the
	// server at another file.
	f.MustTaskFile(t, tk.ID, "elsewhere.json", statusJSON("success", 0, "fake", ""))
	if err := os.Symlink("elsewhere.json", filepath.Join(dir, "status.json")); err != nil {
		t.Fatal(err)
	}
	got := f.r.Collect(context.Background(), tk, &sandbox.ExitStatus{Code: 1})
	if diff := cmp.Diff([]task.OutputFile{{Name: "real.txt", Size: 1, Type: "text/plain; charset=utf-8"}}, got.OutputFiles); diff != "" {
		t.Errorf("output files (-want +got):\n%s", diff)
	}
	if got.Status != task.Failed || got.Summary == "fake" {
		t.Errorf("Collect read a symlinked status.json: %+v", got)
	}
}

func TestCollectDirectoryGone(t *testing.T) {
	f := MustNew(t)
	tk := f.MustCreate(t, task.Spec{})
	if err := f.data.RemoveTask(tk.ID); err != nil {
		t.Fatal(err)
	}
	got := f.r.Collect(context.Background(), tk, &sandbox.ExitStatus{Code: 0})
	if got.Status != task.Failed || !strings.HasPrefix(got.ErrorMessage, "task directory is gone") {
		t.Errorf("Collect = %+v", got)
	}
}

func TestCollectRedactsConfiguredSecrets(t *testing.T) {
	const key = "sk-configured-0123456789"
	f := MustNew(t, func(opts *Options) {
		opts.Agents[task.AgentCommand] = workerproto.AgentConfig{Env: []string{"SOME_API_KEY=" + key}}
	})
	tk := f.MustRunning(t)
	f.MustTaskFile(t, tk.ID, "status.json", statusJSON("failed", 1, "printed "+key, "boom "+key))
	c := f.r.Collect(context.Background(), tk, &sandbox.ExitStatus{Code: 1})
	if strings.Contains(c.Summary+c.ErrorMessage, key) || !strings.Contains(c.Summary, "[REDACTED]") || !strings.Contains(c.ErrorMessage, "[REDACTED]") {
		t.Errorf("summary %q, error %q: the configured key is not redacted", c.Summary, c.ErrorMessage)
	}
}

// A worker that reports before its sandbox is recorded as started ends its
// task only after: the log reads starting, started, then the end.
func TestWorkerCompleteWaitsForStarted(t *testing.T) {
	f := MustNew(t)
	ctx := context.Background()
	tk := f.MustCreate(t, task.Spec{Description: "fast", Command: []string{"true"}})
	f.MustAppend(t, tk.ID, projection.NewEvent(task.EventStarting, nil, "test"))
	f.MustTaskFile(t, tk.ID, "status.json", statusJSON("success", 0, "quick", ""))
	f.mustWaitForStart(t, tk, func() error {
		h, body := signed(tk.ID, "wh-fast", webhook.DeriveKey(testSecret, tk.ID))
		_, err := f.r.WorkerComplete(ctx, webhook.Received(h, body))
		return err
	})
	want := []string{task.EventCreated, task.EventQueued, task.EventStarting, task.EventStarted, task.EventCompleted}
	if types := f.types(t, tk.ID); !slices.Equal(types, want) {
		t.Errorf("events %v, want %v", types, want)
	}
}

func TestWorkerComplete(t *testing.T) {
	f := MustNew(t)
	ctx := context.Background()
	run := f.MustRunning(t)
	f.MustTaskFile(t, run.ID, "status.json", statusJSON("success", 0, "done by worker", ""))
	f.MustTaskFile(t, run.ID, "output/result.txt", "42")

	// A bad signature (another task's key) changes nothing.
	h, body := signed(run.ID, "wh-bad", webhook.DeriveKey(testSecret, task.NewID()))
	if _, err := f.r.WorkerComplete(ctx, webhook.Received(h, body)); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("bad signature = %v, want ErrUnauthenticated", err)
	}
	if got, _ := f.tasks.Get(run.ID); got.Status != task.Running || got.Version != run.Version {
		t.Errorf("after a bad signature the task is %s v%d, want running v%d", got.Status, got.Version, run.Version)
	}

	key := webhook.DeriveKey(testSecret, run.ID)
	h, body = signed(run.ID, "wh-1", key)
	evID, err := f.r.WorkerComplete(ctx, webhook.Received(h, body))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := f.tasks.Get(run.ID)
	if got.Status != task.Success || got.Summary != "done by worker" || len(got.OutputFiles) != 1 {
		t.Errorf("after the webhook: %+v", got)
	}
	evs, err := f.store.ReadStream(ctx, task.StreamID(run.ID), 0)
	if err != nil {
		t.Fatal(err)
	}
	last := evs[len(evs)-1]
	if last.ID != evID || last.Type != task.EventCompleted || last.Actor != "worker/"+run.ID {
		t.Errorf("WorkerComplete returned %s; last event %s %s by %s", evID, last.ID, last.Type, last.Actor)
	}
	var c task.Completed
	if err := json.Unmarshal(last.Data, &c); err != nil || c.Reason != "webhook" {
		t.Errorf("completed reason %q, %v; want webhook", c.Reason, err)
	}

	// A second completion (a new delivery) is accepted and changes nothing.
	h, body = signed(run.ID, "wh-2", key)
	evID2, err := f.r.WorkerComplete(ctx, webhook.Received(h, body))
	if err != nil || evID2 != evID {
		t.Errorf("second completion = %s, %v; want %s, nil", evID2, err, evID)
	}
	// A replay of the first delivery is refused by the verifier.
	h, body = signed(run.ID, "wh-1", key)
	if _, err := f.r.WorkerComplete(ctx, webhook.Received(h, body)); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("replayed webhook id = %v, want ErrConflict", err)
	}
	if evs2, _ := f.store.ReadStream(ctx, task.StreamID(run.ID), 0); len(evs2) != len(evs) {
		t.Errorf("%d events after repeats, want %d", len(evs2), len(evs))
	}

	queued := f.MustCreate(t, task.Spec{Description: "waiting"})
	h, body = signed(queued.ID, "wh-3", webhook.DeriveKey(testSecret, queued.ID))
	if _, err := f.r.WorkerComplete(ctx, webhook.Received(h, body)); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("completion of a queued task = %v, want ErrFailedPrecondition", err)
	}
	if got, _ := f.tasks.Get(queued.ID); got.Status != task.Queued {
		t.Errorf("queued task became %s", got.Status)
	}
}

// TestWorkerCompleteProgress: the progress a completion carries (what the
// worker's agent did since its last report) is recorded before the task's
// end, in the same commit; a failure's is recorded too, and more items than
// a report may hold are refused.
func TestWorkerCompleteProgress(t *testing.T) {
	f := MustNew(t)
	ctx := context.Background()
	items := []webhook.ProgressItem{{Kind: "tool_use", Tool: "Write"}, {Kind: "text", Text: "done", Coalesced: 3}}
	withItems := func(items []webhook.ProgressItem) func(*webhook.Completion) {
		return func(c *webhook.Completion) { c.Progress = items }
	}

	run := f.MustRunning(t)
	f.MustTaskFile(t, run.ID, "status.json", statusJSON("success", 0, "done", ""))
	key := webhook.DeriveKey(testSecret, run.ID)
	h, body := signed(run.ID, "wh-1", key, withItems(items))
	if _, err := f.r.WorkerComplete(ctx, webhook.Received(h, body)); err != nil {
		t.Fatal(err)
	}
	evs, err := f.store.ReadStream(ctx, task.StreamID(run.ID), run.Version)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		got = append(got, e.Type+" "+string(e.Data))
		if !e.RecordedAt.Equal(evs[0].RecordedAt) {
			t.Errorf("%s recorded at %s, the first at %s: want one commit", e.Type, e.RecordedAt, evs[0].RecordedAt)
		}
	}
	want := []string{
		task.EventProgress + ` {"kind":"tool_use","tool":"Write"}`,
		task.EventProgress + ` {"kind":"text","text":"done","coalesced":3}`,
	}
	if len(got) != 3 || !strings.HasPrefix(got[2], task.EventCompleted) {
		t.Fatalf("events after the completion: %q, want 2 progress then %s", got, task.EventCompleted)
	}
	if diff := cmp.Diff(want, got[:2]); diff != "" {
		t.Errorf("progress events (-want +got):\n%s", diff)
	}

	// A failure is left to the sandbox's exit; its progress is recorded.
	run = f.MustRunning(t)
	key = webhook.DeriveKey(testSecret, run.ID)
	h, body = signed(run.ID, "wh-2", key, withItems(items[:1]), func(c *webhook.Completion) { c.Status, c.ExitCode = "failed", 1 })
	evID, err := f.r.WorkerComplete(ctx, webhook.Received(h, body))
	if err != nil {
		t.Fatal(err)
	}
	evs, _ = f.store.ReadStream(ctx, task.StreamID(run.ID), run.Version)
	if len(evs) != 1 || evs[0].Type != task.EventProgress || evs[0].ID != evID {
		t.Errorf("after a failure's completion: %d events, want its one progress event, whose id (not %s) it returns", len(evs), evID)
	}
	if got, _ := f.tasks.Get(run.ID); got.Status != task.Running {
		t.Errorf("after a failure's completion the task is %s, want running until its sandbox exits", got.Status)
	}

	// More items than a report may hold: refused, nothing recorded.
	h, body = signed(run.ID, "wh-3", key, withItems(make([]webhook.ProgressItem, webhook.MaxProgressItems+1)))
	if _, err := f.r.WorkerComplete(ctx, webhook.Received(h, body)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("%d progress items: %v, want invalid argument", webhook.MaxProgressItems+1, err)
	}
	if evs2, _ := f.store.ReadStream(ctx, task.StreamID(run.ID), run.Version); len(evs2) != len(evs) {
		t.Errorf("a refused completion recorded %d events", len(evs2)-len(evs))
	}
}

func TestReconcileDirectories(t *testing.T) {
	f := MustNew(t)
	ctx := context.Background()
	known := f.MustCreate(t, task.Spec{})
	stray, err := f.data.CreateTask("task-stray")
	if err != nil {
		t.Fatal(err)
	}
	stray.Close()
	if err := f.r.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	evs, err := f.store.ReadStream(ctx, task.SystemStream, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Type != task.EventUnknownDirectory {
		t.Fatalf("system events %+v, want one %s", evs, task.EventUnknownDirectory)
	}
	var data map[string]string
	if err := json.Unmarshal(evs[0].Data, &data); err != nil || data["directory"] != "tasks/task-stray" {
		t.Errorf("event data %s, %v", evs[0].Data, err)
	}
	if _, err := os.Stat(f.data.TaskPath("task-stray")); err != nil {
		t.Errorf("the stray directory was touched: %v", err)
	}
	if _, err := os.Stat(f.data.TaskPath(known.ID)); err != nil {
		t.Errorf("the known task's directory: %v", err)
	}
}

// mustWaitForStart checks that report, made while task tk is starting,
// returns only once tk's start is recorded, and without an error.
func (f *fixture) mustWaitForStart(t *testing.T, tk task.Task, report func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- report() }()
	select {
	case err := <-done:
		t.Fatalf("the report was taken before the task started: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	f.MustAppend(t, tk.ID, projection.NewEvent(task.EventStarted, task.Started{SandboxName: tk.ID}, "test"))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// types returns the types of task id's events, in order.
func (f *fixture) types(tb testing.TB, id string) []string {
	tb.Helper()
	evs, err := f.store.ReadStream(context.Background(), task.StreamID(id), 0)
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

// A report refused because its task has not started is not spent: the
// worker's retry, with the same webhook id, goes through once the task
// has started. A progress report for a task still starting waits for its
// start, as a completion does, so the log reads started before progress.
func TestReportsBeforeTheStart(t *testing.T) {
	f := MustNew(t)
	ctx := context.Background()
	tk := f.MustCreate(t, task.Spec{Description: "early", Command: []string{"true"}})
	f.MustTaskFile(t, tk.ID, "status.json", statusJSON("success", 0, "early", ""))
	h, body := signed(tk.ID, "wh-early", webhook.DeriveKey(testSecret, tk.ID))
	if _, err := f.r.WorkerComplete(ctx, webhook.Received(h, body)); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("a completion for a queued task: %v, want ErrFailedPrecondition", err)
	}
	ph, pbody := signedProgress(tk.ID, "wh-progress", webhook.ProgressItem{Kind: "text", Text: "working"})
	if _, err := f.r.WorkerProgress(ctx, webhook.Received(ph, pbody)); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("progress for a queued task: %v, want ErrFailedPrecondition", err)
	}

	f.MustAppend(t, tk.ID, projection.NewEvent(task.EventStarting, nil, "test"))
	f.mustWaitForStart(t, tk, func() error {
		_, err := f.r.WorkerProgress(ctx, webhook.Received(ph, pbody))
		return err
	})
	if _, err := f.r.WorkerComplete(ctx, webhook.Received(h, body)); err != nil {
		t.Fatalf("the completion's retry: %v", err)
	}
	want := []string{task.EventCreated, task.EventQueued, task.EventStarting, task.EventStarted, task.EventProgress, task.EventCompleted}
	if types := f.types(t, tk.ID); !slices.Equal(types, want) {
		t.Errorf("events %v, want %v", types, want)
	}
}

// What a workspace task's worker reports is redacted of the configured
// secrets everywhere it lands: its changes' names and commit subjects, its
// agent session id, its progress.
func TestCollectRedactsReportedChanges(t *testing.T) {
	const key = "sk-configured-0123456789"
	f := MustNew(t, func(opts *Options) {
		opts.Agents[task.AgentCommand] = workerproto.AgentConfig{Env: []string{"SOME_API_KEY=" + key}}
	})
	tk := f.MustCreate(t, task.Spec{Command: []string{"true"}, Workspace: "proj"})
	tk = f.MustStart(t, tk)
	st, _ := json.Marshal(map[string]any{"status": "success", "exit_code": 0, "summary": "ok", "session_id": "s-" + key,
		"changes": map[string]any{"added": []string{key + ".txt"}, "modified": []string{}, "deleted": []string{},
			"commits": []map[string]string{{"hash": "abc", "subject": "add " + key}}}})
	f.MustTaskFile(t, tk.ID, "status.json", string(st))
	c := f.r.Collect(context.Background(), tk, &sandbox.ExitStatus{Code: 0})
	b, _ := json.Marshal(c)
	if c.Changes == nil || len(c.Changes.Added) != 1 || len(c.Changes.Commits) != 1 {
		t.Fatalf("changes %+v, want the one file and commit reported", c.Changes)
	}
	if strings.Contains(string(b), key) {
		t.Errorf("the result holds the configured key: %s", b)
	}
	evs := f.r.progressEvents(tk, []webhook.ProgressItem{{Kind: key, Status: key}})
	if strings.Contains(string(evs[0].Data), key) {
		t.Errorf("progress holds the configured key: %s", evs[0].Data)
	}
}

// A task its deadline ended stays timed out when its directory is also
// over quota; the quota is said beside.
func TestCollectTimeoutOverQuota(t *testing.T) {
	f := MustNew(t, func(r *Options) { r.MaxTaskDirBytes = 4096 })
	tk := f.MustRunning(t)
	f.MustTaskFile(t, tk.ID, "output/big.bin", strings.Repeat("x", 8192))
	c := f.r.Collect(context.Background(), tk, &sandbox.ExitStatus{Code: -1, DeadlineExceeded: true})
	if c.Status != task.Timeout || !strings.Contains(c.ErrorMessage, "timed out") || !strings.Contains(c.ErrorMessage, "quota") {
		t.Errorf("status %s, error %q; want timeout, saying both", c.Status, c.ErrorMessage)
	}
}
