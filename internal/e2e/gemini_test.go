//go:build integration

package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/agent/agenttest"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// The shell command the scripted models ask every agent to run: it writes
// output/result.txt with Python, in the task directory.
const (
	agentScriptCommand = `mkdir -p output && python3 -c "open('output/result.txt','w').write(str(6*7)+'\n')"`
	agentFinalText     = "Wrote output/result.txt with the answer, 42."
)

// agentEndpointAddr is where scripted endpoints listen: not 127.0.0.1,
// which the sandbox's NO_PROXY names (its own loopback), since the agent
// must reach the model through the egress proxy, listed by address.
const agentEndpointAddr = "127.0.0.2:0"

// mustStartForAgent starts a server whose agent name has env and may reach
// endpoint (host:port) through the egress allowlist.
func mustStartForAgent(t *testing.T, name, endpoint string, env map[string]string) *server {
	t.Helper()
	return MustStart(t, func(c *config.Config) {
		c.Egress.Mode = "allowlist"
		c.Egress.Allow = []string{endpoint}
		switch name {
		case "gemini":
			c.Agents.Gemini.Env = env
		case "codex":
			c.Agents.Codex.Env = env
		case "opencode":
			c.Agents.Opencode.Env = env
		}
	})
}

// spawnAgent spawns a task for the named agent with network allowlist.
func spawnAgent(t *testing.T, s *server, name, desc, model string) task.Task {
	t.Helper()
	tk, _, err := s.client.Spawn(context.Background(), service.SpawnRequest{TaskDescription: desc, Agent: name, Model: model, Network: task.NetworkAllowlist})
	if err != nil {
		t.Fatalf("spawn %s: %v", name, err)
	}
	return tk
}

// taskProgress returns the task's progress events.
func taskProgress(t *testing.T, s *server, id string) []task.Progress {
	t.Helper()
	var out []task.Progress
	err := s.client.Events(context.Background(), service.EventsRequest{TaskID: id}, func(e eventstore.Event) error {
		if e.Type != task.EventProgress {
			return nil
		}
		var p task.Progress
		if err := json.Unmarshal(e.Data, &p); err != nil {
			return err
		}
		out = append(out, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// assertAgentSuccess checks a scripted run that succeeded: the file the
// agent's own tool wrote, the summary, the usage, a progress event for the
// tool call, and the key nowhere in the task directory or the events.
func assertAgentSuccess(t *testing.T, s *server, id, tool, key string, wantUsage bool) {
	t.Helper()
	res := s.wait(t, id, 3*time.Minute, "result.txt")
	if res.Status != task.Success {
		logs, _ := os.ReadFile(filepath.Join(s.data, "tasks", id, "logs", "stderr.log"))
		t.Fatalf("task %s: %s\nstderr:\n%s", res.Status, res.ErrorMessage, logs)
	}
	b, err := os.ReadFile(filepath.Join(s.data, "tasks", id, "output", "result.txt"))
	if err != nil || string(b) != "42\n" {
		t.Errorf("output/result.txt = %q, %v; want the agent's tool to have written 42", b, err)
	}
	tk, err := s.client.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if tk.Summary != agentFinalText {
		t.Errorf("summary %q, want %q", tk.Summary, agentFinalText)
	}
	if wantUsage && (tk.Usage == nil || tk.Usage.InputTokens == 0 || tk.Usage.OutputTokens == 0) {
		t.Errorf("usage %+v, want tokens recorded", tk.Usage)
	}
	found := false
	for _, p := range taskProgress(t, s, id) {
		if p.Kind == "tool_use" && p.Tool == tool && strings.Contains(p.Input, "result.txt") {
			found = true
		}
	}
	if !found {
		t.Errorf("no task_progress event for the %s call: %+v", tool, taskProgress(t, s, id))
	}
	scriptedNoKey(t, s, id, key)
}

// scriptedNoKey checks that key appears in no file of the task directory and
// no event of the server.
func scriptedNoKey(t *testing.T, s *server, id, key string) {
	t.Helper()
	dir := filepath.Join(s.data, "tasks", id)
	files := 0
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		files++
		if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(key)) {
			t.Errorf("the API key is in %s", p)
		}
		return nil
	})
	if files == 0 {
		t.Errorf("no files in %s", dir)
	}
	n := 0
	err := s.client.Events(context.Background(), service.EventsRequest{}, func(e eventstore.Event) error {
		n++
		if bytes.Contains(e.Data, []byte(key)) {
			t.Errorf("the API key is in event %s (%s)", e.ID, e.Type)
		}
		return nil
	})
	if err != nil || n == 0 {
		t.Errorf("events: %d, %v", n, err)
	}
	for _, stream := range []string{"", "?stream=stderr"} {
		if _, body := s.do(t, "GET", "/api/tasks/"+id+"/logs"+stream, "", nil); strings.Contains(body, key) {
			t.Errorf("the API key is in the logs%s", stream)
		}
	}
}

// assertAgentFails waits for a task to fail and checks its message.
func assertAgentFails(t *testing.T, s *server, id string, want ...string) {
	t.Helper()
	res := s.wait(t, id, 3*time.Minute)
	if res.Status != task.Failed {
		t.Fatalf("task %s, want failed (summary %q)", res.Status, res.Summary)
	}
	for _, w := range want {
		if !strings.Contains(res.ErrorMessage, w) {
			t.Errorf("error message %q lacks %q", res.ErrorMessage, w)
		}
	}
	if strings.Contains(res.ErrorMessage, "\n") {
		t.Errorf("error message is not one line: %q", res.ErrorMessage)
	}
}

// TestGeminiAgent runs the real Gemini CLI in a bwrap sandbox against a
// scripted Gemini API reached through the egress allowlist: the model asks
// for run_shell_command, the CLI runs it (writing output/result.txt), and
// the model's final text becomes the summary.
func TestGeminiAgent(t *testing.T) {
	t.Parallel()
	testenv.RequireBinary(t, "gemini", "npm install -g @google/gemini-cli")
	testenv.RequireBinary(t, "python3", "apt-get install -y python3")
	const key = "gm-test-key-5d2c81e0a9"
	g := agenttest.MustGemini(t, agenttest.GeminiOptions{Addr: agentEndpointAddr, Key: key, Replies: []agenttest.Reply{
		{Text: "I will write the result.", Tool: &agenttest.ToolCall{Name: "run_shell_command", Input: map[string]any{"command": agentScriptCommand}}},
		{Text: agentFinalText},
	}})
	s := mustStartForAgent(t, "gemini", g.Addr, map[string]string{"GEMINI_API_KEY": key, "GOOGLE_GEMINI_BASE_URL": g.URL})
	tk := spawnAgent(t, s, "gemini", "Compute 6*7 into output/result.txt", "gemini-2.5-pro")
	assertAgentSuccess(t, s, tk.ID, "run_shell_command", key, true)

	var main int
	for _, r := range g.Requests() {
		if !r.KeyOK {
			t.Errorf("a request without the key: %+v", r)
		}
		if r.Main {
			main++
			if r.Model != "gemini-2.5-pro" {
				t.Errorf("model %q, want the task's", r.Model)
			}
		}
	}
	if main != 2 {
		t.Errorf("%d main requests, want 2 (the tool call, then the answer): %+v", main, g.Requests())
	}
}

// TestGeminiAgentEndpointErrors: the endpoint refuses the key (401), rate
// limits (429) or fails (500), and each task fails with a line that says
// which (Gemini CLI does not retry a 401; it tries a 429 or 500 three
// times, about 15 s, as the adapter configures it).
func TestGeminiAgentEndpointErrors(t *testing.T) {
	t.Parallel()
	testenv.RequireBinary(t, "gemini", "npm install -g @google/gemini-cli")
	for _, tc := range []struct {
		status int
		want   []string
	}{
		{http.StatusUnauthorized, []string{"gemini: the model endpoint refused the API key (HTTP 401; check GEMINI_API_KEY in agents.gemini.env)"}},
		{http.StatusTooManyRequests, []string{"gemini: the model endpoint is rate limiting (HTTP 429; retries exhausted)"}},
		{http.StatusInternalServerError, []string{"gemini: the model endpoint failed with a server error (HTTP 500; retries exhausted)"}},
	} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			t.Parallel()
			const key = "gm-err-key-3a9c5e7f1b"
			opts := agenttest.GeminiOptions{Addr: agentEndpointAddr, Key: key}
			sent := key
			if tc.status == http.StatusUnauthorized {
				sent = "gm-wrong-key-77f1d2c3"
			} else {
				opts.Status = tc.status
			}
			g := agenttest.MustGemini(t, opts)
			s := mustStartForAgent(t, "gemini", g.Addr, map[string]string{"GEMINI_API_KEY": sent, "GOOGLE_GEMINI_BASE_URL": g.URL})
			tk := spawnAgent(t, s, "gemini", "Say hello", "gemini-2.5-pro")
			assertAgentFails(t, s, tk.ID, tc.want...)
			if len(g.Requests()) == 0 {
				t.Errorf("the endpoint was never asked")
			}
			scriptedNoKey(t, s, tk.ID, sent)
		})
	}
}
