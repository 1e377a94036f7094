//go:build integration

package e2e_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/webhook"
)

// snapshot is what a rejected request must leave unchanged.
type snapshot struct {
	events   int
	taskDirs int
}

func (s *server) snapshot(t *testing.T) snapshot {
	t.Helper()
	code, body := s.do(t, "GET", "/api/events", "", nil)
	var r struct {
		Events []json.RawMessage `json:"events"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &r) != nil {
		t.Fatalf("GET /api/events: %d %s", code, body)
	}
	dirs, _ := os.ReadDir(filepath.Join(s.data, "tasks"))
	return snapshot{len(r.Events), len(dirs)}
}

func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	s := MustStart(t, func(c *config.Config) { c.Limits.MaxPromptBytes = mustSize(t, "1KiB") })
	s.mustWriteWorkspace(t, "data/ok.csv", []byte("a,b\n"))
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644)
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(s.data, "shared", "data", "link")); err != nil {
		t.Fatal(err)
	}
	before := s.snapshot(t)
	cases := []struct {
		name, method, path, body string
		status                   int
		mention                  string
	}{
		{"missing description", "POST", "/api/tasks", `{"command":["true"]}`, 400, "task_description"},
		{"blank description", "POST", "/api/tasks", `{"task_description":"   ","command":["true"]}`, 400, "task_description"},
		{"unknown agent", "POST", "/api/tasks", `{"task_description":"x","agent":"hal9000"}`, 400, "agent"},
		{"timeout too long", "POST", "/api/tasks", `{"task_description":"x","command":["true"],"timeout_minutes":121}`, 400, "timeout_minutes"},
		{"timeout negative", "POST", "/api/tasks", `{"task_description":"x","command":["true"],"timeout_minutes":-1}`, 400, "timeout_minutes"},
		{"dot-dot context", "POST", "/api/tasks", `{"task_description":"x","command":["true"],"context_files":["../corral.db"]}`, 403, "context_files[0]"},
		{"absolute context", "POST", "/api/tasks", `{"task_description":"x","command":["true"],"context_files":["/etc/passwd"]}`, 400, "absolute"},
		{"NUL context", "POST", "/api/tasks", `{"task_description":"x","command":["true"],"context_files":["data/ok.csv\u0000.txt"]}`, 403, "NUL"},
		{"symlink out of shared", "POST", "/api/tasks", `{"task_description":"x","command":["true"],"context_files":["data/link"]}`, 403, "symbolic link"},
		{"oversize prompt", "POST", "/api/tasks", `{"task_description":"` + strings.Repeat("a", 2000) + `","command":["true"]}`, 413, "task_description"},
		{"malformed JSON", "POST", "/api/tasks", `{"task_description":`, 400, "JSON"},
		{"unknown field", "POST", "/api/tasks", `{"task_description":"x","comand":["true"]}`, 400, "comand"},
		{"wrong type", "POST", "/api/tasks", `{"task_description":"x","timeout_minutes":"ten"}`, 400, "timeout_minutes"},
		{"unknown task", "GET", "/api/tasks/task-00000000000000000000000000", "", 404, "task-00000000000000000000000000"},
		{"malformed task id", "GET", "/api/tasks/..%2f..%2fetc", "", 400, "task_id"},
		{"cancel unknown task", "POST", "/api/tasks/task-00000000000000000000000000/cancel", "", 404, "not found"},
		{"workspace escape", "PUT", "/api/workspace/..%2fcorral.db", "x", 403, "escapes"},
		{"reserved name", "PUT", "/api/workspace/data/NUL.txt", "x", 400, "reserved"},
		{"reserved workspace", "POST", "/api/workspaces", `{"name":"con"}`, 400, "reserves"},
		{"bad list limit", "GET", "/api/tasks?limit=0", "", 400, "limit"},
		{"bad status filter", "GET", "/api/tasks?status=done", "", 400, "status"},
		{"bad events cursor", "GET", "/api/events?after=evt_nope", "", 422, "after"},
		{"bad wait", "GET", "/api/tasks/task-00000000000000000000000000/result?wait=soon", "", 400, "wait"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body *strings.Reader
			if c.body != "" {
				body = strings.NewReader(c.body)
			} else {
				body = strings.NewReader("")
			}
			code, got := s.do(t, c.method, c.path, "application/json", body)
			if code != c.status || !strings.Contains(got, c.mention) {
				t.Errorf("%s %s: %d %s, want %d mentioning %q", c.method, c.path, code, got, c.status, c.mention)
			}
			var eb struct {
				Error     string `json:"error"`
				RequestID string `json:"request_id"`
			}
			if json.Unmarshal([]byte(got), &eb) != nil || eb.Error == "" || eb.RequestID == "" {
				t.Errorf("error body %s is not {error, request_id}", got)
			}
		})
	}
	if after := s.snapshot(t); after != before {
		t.Errorf("rejected requests changed state: before %+v, after %+v", before, after)
	}
}

func mustSize(t *testing.T, v string) config.Size {
	t.Helper()
	sz, err := config.ParseSize(v)
	if err != nil {
		t.Fatal(err)
	}
	return sz
}

func TestBearerToken(t *testing.T) {
	t.Parallel()
	s := MustStartEnv(t, []string{"CORRAL_API_TOKEN=s3cret-token"}, nil)
	for _, c := range []struct {
		path, auth string
		status     int
	}{
		{"/api/tasks", "", 401},
		{"/api/tasks", "Bearer wrong", 401},
		{"/api/tasks", "Basic czNjcmV0LXRva2Vu", 401},
		{"/api/tasks", "Bearer s3cret-token", 200},
		{"/metrics", "", 401},
		{"/healthz", "", 200},
	} {
		req, _ := http.NewRequest("GET", s.url+c.path, nil)
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("GET %s with %q: %d, want %d", c.path, c.auth, resp.StatusCode, c.status)
		}
	}
	// With no token configured, a non-loopback address is refused.
	cfg := config.Default()
	cfg.Listen = "0.0.0.0:7777"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "CORRAL_API_TOKEN") {
		t.Errorf("non-loopback listen without a token: %v", err)
	}
}

// signed builds a completion webhook for id, signed with key.
func signed(t *testing.T, id string, key []byte, ts time.Time, webhookID string) (http.Header, []byte) {
	t.Helper()
	c := webhook.Completion{EventType: "worker_completed", Source: "local", TaskID: id, Status: "success", WebhookID: webhookID, Timestamp: ts.Unix()}
	body, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set(webhook.HeaderSignature, webhook.Sign(key, body))
	h.Set(webhook.HeaderSource, "local")
	h.Set(webhook.HeaderTimestamp, strconv.FormatInt(c.Timestamp, 10))
	h.Set(webhook.HeaderID, webhookID)
	h.Set("Content-Type", "application/json")
	return h, body
}

func (s *server) postWebhook(t *testing.T, h http.Header, body []byte) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", s.url+"/api/webhooks/worker-complete", strings.NewReader(string(body)))
	req.Header = h
	return send(t, req)
}

func TestWebhookRejections(t *testing.T) {
	t.Parallel()
	s := MustStart(t, func(c *config.Config) { c.AIWorker.MaxConcurrentWorkers = 2 })
	secret, err := os.ReadFile(filepath.Join(s.data, "run", "webhook.key"))
	if err != nil {
		t.Fatal(err)
	}
	victim := s.spawn(t, "victim", "sleep", "1003")
	other := s.spawn(t, "other", "sleep", "1003")
	s.waitStatus(t, victim.ID, task.Running, 20*time.Second)
	s.waitStatus(t, other.ID, task.Running, 20*time.Second)
	key := webhook.DeriveKey(secret, victim.ID)
	now := time.Now()

	h, body := signed(t, victim.ID, webhook.DeriveKey(secret, other.ID), now, "w-other-key")
	if code, got := s.postWebhook(t, h, body); code != 401 {
		t.Errorf("another task's key: %d %s, want 401", code, got)
	}
	h, body = signed(t, victim.ID, key, now, "w-bad-sig")
	h.Set(webhook.HeaderSignature, "sha256="+hex.EncodeToString(make([]byte, 32)))
	if code, got := s.postWebhook(t, h, body); code != 401 {
		t.Errorf("bad signature: %d %s, want 401", code, got)
	}
	h, body = signed(t, victim.ID, key, now.Add(-time.Hour), "w-stale")
	if code, got := s.postWebhook(t, h, body); code != 403 || !strings.Contains(got, "timestamp") {
		t.Errorf("stale timestamp: %d %s, want 403", code, got)
	}
	h, body = signed(t, victim.ID, key, now, "w-tampered")
	body = []byte(strings.Replace(string(body), `"success"`, `"failed"`, 1))
	if code, got := s.postWebhook(t, h, body); code != 401 {
		t.Errorf("tampered body: %d %s, want 401", code, got)
	}
	if tk, _ := s.client.Get(context.Background(), victim.ID); tk.Status != task.Running {
		t.Fatalf("rejected webhooks changed the task: %s", tk.Status)
	}

	// A valid completion ends the task; the same delivery again is a replay.
	h, body = signed(t, victim.ID, key, now, "w-good")
	if code, got := s.postWebhook(t, h, body); code != 200 || !strings.Contains(got, "accepted") {
		t.Fatalf("valid webhook: %d %s", code, got)
	}
	if code, got := s.postWebhook(t, h, body); code != 409 || !strings.Contains(got, "already delivered") {
		t.Errorf("replayed webhook: %d %s, want 409", code, got)
	}
	tk, _ := s.client.Get(context.Background(), victim.ID)
	if !tk.Status.Terminal() {
		t.Errorf("valid webhook did not end the task: %s", tk.Status)
	}
	// A fresh, valid completion for an ended task is accepted and changes nothing.
	v := tk.Version
	h, body = signed(t, victim.ID, key, now, "w-again")
	if code, _ := s.postWebhook(t, h, body); code != 200 {
		t.Errorf("second valid webhook: %d", code)
	}
	if tk, _ := s.client.Get(context.Background(), victim.ID); tk.Version != v {
		t.Errorf("an idempotent completion appended events: version %d → %d", v, tk.Version)
	}
	if tk, _ := s.client.Get(context.Background(), other.ID); tk.Status != task.Running {
		t.Errorf("the other task changed: %s", tk.Status)
	}
	s.client.Cancel(context.Background(), other.ID)
}
