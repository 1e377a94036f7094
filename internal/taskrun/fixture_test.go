package taskrun

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/sqlite"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/projection/projectiontest"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/webhook"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

var testSecret = []byte("test webhook secret")

// fixture is a Runner over a real SQLite store, its projection and a data
// root, in temporary directories. Tasks are recorded as a spawn leaves
// them (MustCreate), without the orchestrator.
type fixture struct {
	r     *Runner
	store *sqlite.Store
	tasks *projection.Tasks
	data  *workspace.DataRoot
}

// MustNew builds a Runner with the options the server gives it (worker
// binaries and socket in the data root, a webhook verifier with
// testSecret, the claude and command agents); edit changes them first.
func MustNew(tb testing.TB, edit ...func(*Options)) *fixture {
	tb.Helper()
	log := slog.New(slog.DiscardHandler)
	env := projectiontest.New(tb)
	env.Follow(tb) // as the server does: reports append to the log directly
	store, tasks, data := env.Store, env.Tasks, env.Data
	opts := Options{
		Store: store, Tasks: tasks, Data: data,
		Agents: map[string]workerproto.AgentConfig{
			task.AgentClaude:  {Binary: "/usr/local/bin/claude", Args: []string{"--verbose"}, Env: []string{"ANTHROPIC_API_KEY=k"}, SandboxEnv: []string{"ANTHROPIC_API_KEY=placeholder"}},
			task.AgentCommand: {Args: []string{"--not-for-a-command"}},
		},
		Worker:      WorkerOptions{BinDir: data.HostPath("run", "bin"), SocketDir: data.HostPath("run", "sock"), Secret: testSecret},
		Verifier:    webhook.NewVerifier(testSecret, 0, nil),
		MaxLogBytes: 1 << 20, MaxTaskDirBytes: 1 << 20,
	}
	for _, e := range edit {
		e(&opts)
	}
	return &fixture{r: New(opts, log), store: store, tasks: tasks, data: data}
}

// MustCreate records a queued task as a spawn leaves it: its directory
// (context/, output/, logs/) with prompt.md, whose hash the task_created
// event records, then task_created and task_queued. The fields of spec a
// spawn fills in when unset take its defaults here: a description, the
// command agent for a command and claude otherwise, the local runtime,
// network none and 30 minutes. Nothing else of a spawn is done: context
// files and a follow-up's copies are the test's to write.
func (f *fixture) MustCreate(tb testing.TB, spec task.Spec) task.Task {
	tb.Helper()
	if spec.Description == "" {
		spec.Description = "x"
	}
	if spec.Agent == "" {
		spec.Agent = task.AgentClaude
		if len(spec.Command) > 0 {
			spec.Agent = task.AgentCommand
		}
	}
	if spec.Runtime == "" {
		spec.Runtime = "local"
	}
	if spec.Network == "" {
		spec.Network = task.NetworkNone
	}
	if spec.TimeoutMinutes == 0 && spec.TimeoutSeconds == 0 {
		spec.TimeoutMinutes = 30
	}
	id := task.NewID()
	dir, err := f.data.CreateTask(id)
	if err != nil {
		tb.Fatal(err)
	}
	defer dir.Close()
	prompt := []byte("# Task\n\n" + spec.Description + "\n")
	if err := workspace.WriteFileAtomicNoSync(dir, workerproto.PromptFile, prompt, 0o644); err != nil {
		tb.Fatal(err)
	}
	sum := sha256.Sum256(prompt)
	ev := func(typ string, payload any) eventstore.Proposed { return projection.NewEvent(typ, payload, "test") }
	t, err := f.tasks.Create(context.Background(), id,
		ev(task.EventCreated, task.Created{Spec: spec, PromptSHA256: hex.EncodeToString(sum[:])}),
		ev(task.EventQueued, nil))
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

// MustAppend appends events to a task at its current version.
func (f *fixture) MustAppend(tb testing.TB, id string, evs ...eventstore.Proposed) task.Task {
	tb.Helper()
	return projectiontest.MustAppend(tb, f.tasks, id, evs...)
}

// MustStart moves a queued task to running, as the scheduler does.
func (f *fixture) MustStart(tb testing.TB, t task.Task) task.Task {
	tb.Helper()
	return f.MustAppend(tb, t.ID,
		projection.NewEvent(task.EventStarting, nil, "test"),
		projection.NewEvent(task.EventStarted, task.Started{SandboxName: t.ID}, "test"))
}

// MustRunning records a command task and moves it to running.
func (f *fixture) MustRunning(tb testing.TB) task.Task {
	tb.Helper()
	return f.MustStart(tb, f.MustCreate(tb, task.Spec{Description: "run", Command: []string{"true"}}))
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

// statusJSON is a worker's status.json.
func statusJSON(status string, code int, summary, errMsg string) string {
	b, _ := json.Marshal(map[string]any{"status": status, "exit_code": code, "summary": summary, "error_message": errMsg, "duration_seconds": 2.5})
	return string(b)
}

// signed returns a signed completion webhook for id.
func signed(id, webhookID string, key []byte, edit ...func(*webhook.Completion)) (http.Header, []byte) {
	c := webhook.Completion{EventType: webhook.EventWorkerCompleted, Source: "local", TaskID: id, Status: "success", WebhookID: webhookID, Timestamp: time.Now().Unix()}
	for _, e := range edit {
		e(&c)
	}
	return sign(key, webhookID, c.Timestamp, c)
}

// signedProgress returns a signed progress report for id.
func signedProgress(id, webhookID string, items ...webhook.ProgressItem) (http.Header, []byte) {
	p := webhook.ProgressReport{EventType: task.EventProgress, Source: "local", TaskID: id, Items: items, WebhookID: webhookID, Timestamp: time.Now().Unix()}
	return sign(webhook.DeriveKey(testSecret, id), webhookID, p.Timestamp, p)
}

// sign is a worker's post of body with key: its JSON and its headers.
func sign(key []byte, webhookID string, timestamp int64, body any) (http.Header, []byte) {
	b, _ := json.Marshal(body)
	h := http.Header{}
	h.Set(webhook.HeaderSignature, webhook.Sign(key, b))
	h.Set(webhook.HeaderID, webhookID)
	h.Set(webhook.HeaderTimestamp, strconv.FormatInt(timestamp, 10))
	h.Set(webhook.HeaderSource, "local")
	return h, b
}
