//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/agent/agenttest"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes/k8stest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

const claudeTestKey = "sk-ant-test-4f9c1e7a0b2d"

// mustClaudeServer starts a scripted Anthropic endpoint and a server whose
// claude agent uses it through the egress allowlist. The endpoint listens
// on opts.Addr, by default 127.0.0.2 (reached through the proxy: the
// sandbox's NO_PROXY names only 127.0.0.1); on 127.0.0.1 the worker
// forwards it (TestClaudeModelOnHostLoopback).
func mustClaudeServer(t *testing.T, opts agenttest.AnthropicOptions) (*server, *agenttest.Anthropic) {
	t.Helper()
	return mustClaudeServerAllowing(t, opts, true, nil)
}

// mustClaudeServerAllowing is mustClaudeServer with the endpoint in the
// allowlist or not, and the configuration edited by edit (unless nil).
func mustClaudeServerAllowing(t *testing.T, opts agenttest.AnthropicOptions, allow bool, edit func(testing.TB, *config.Config)) (*server, *agenttest.Anthropic) {
	t.Helper()
	testenv.RequireBinary(t, "claude", "npm install -g @anthropic-ai/claude-code")
	opts.Key = claudeTestKey
	if opts.Addr == "" {
		opts.Addr = "127.0.0.2:0"
	}
	ep := agenttest.MustAnthropic(t, opts)
	s := MustStart(t, func(c *config.Config) {
		if edit != nil {
			edit(t, c)
		}
		c.Egress.Mode = "allowlist"
		c.Egress.Allow = []string{"api.anthropic.com"}
		if allow {
			c.Egress.Allow = append(c.Egress.Allow, ep.Addr)
		}
		c.Agents.Claude.Env = map[string]string{
			"ANTHROPIC_BASE_URL":      ep.URL,
			"ANTHROPIC_API_KEY":       claudeTestKey,
			"CLAUDE_CODE_MAX_RETRIES": "1",
		}
	})
	return s, ep
}

func spawnClaude(t *testing.T, s *server, req service.SpawnRequest) task.Task {
	t.Helper()
	req.Agent = "claude"
	req.Network = "allowlist"
	if req.Model == "" {
		req.Model = "claude-sonnet-4-5"
	}
	tk, _, err := s.client.Spawn(context.Background(), req)
	if err != nil {
		t.Fatalf("spawn claude task: %v", err)
	}
	return tk
}

// taskEvents returns the task's events of type typ.
func taskEvents(t *testing.T, s *server, id, typ string) []eventstore.Event {
	t.Helper()
	var out []eventstore.Event
	err := s.client.Events(context.Background(), service.EventsRequest{TaskID: id}, func(e eventstore.Event) error {
		if typ == "" || e.Type == typ {
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestClaudeCSVChart runs seed 000's first use case with the real Claude
// Code CLI in a real sandbox: the scripted model asks for a Bash call that
// totals a CSV by category and draws a PNG chart, then answers with text.
// On kubernetes the CLI runs in a worker pod under gVisor, from an image
// (k8stest.ClaudeImage), and reaches the scripted endpoint on the host's
// 127.0.0.2 only through the egress proxy, over TCP.
func TestClaudeCSVChart(t *testing.T) {
	t.Run("default runtime", func(t *testing.T) { t.Parallel(); testClaudeCSVChart(t, nil) })
	t.Run("kubernetes", func(t *testing.T) {
		t.Parallel()
		testClaudeCSVChart(t, func(tb testing.TB, c *config.Config) {
			onKubernetes(k8stest.GVisor)(tb, c)
			k8stest.RequireImage(tb, k8stest.ClaudeImage)
			c.Runtime = "kubernetes"
			c.AIWorker.AICoderImage = k8stest.ClaudeImage
			c.Kubernetes.EgressListen = k8stest.NodeIP + ":0"
		})
	})
}

// writeTransactions puts seed 000's bank statement in the shared
// workspace, as data/transactions.csv.
func writeTransactions(t *testing.T, data string) {
	t.Helper()
	shared := filepath.Join(data, "shared", "data")
	if err := os.MkdirAll(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	csv := "date,category,amount\n2026-01-02,groceries,40.50\n2026-01-03,rent,900\n2026-01-05,groceries,22.25\n2026-01-09,transport,15\n"
	if err := os.WriteFile(filepath.Join(shared, "transactions.csv"), []byte(csv), 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkChart checks what testdata/claude_chart.py makes of the statement
// in task id's output: the totals by category and a PNG chart.
func checkChart(t *testing.T, data, id string) {
	t.Helper()
	totals, err := os.ReadFile(filepath.Join(data, "tasks", id, "output", "totals.csv"))
	if want := "category,total\ngroceries,62.75\nrent,900.00\ntransport,15.00\n"; err != nil || string(totals) != want {
		t.Errorf("output/totals.csv = %q, %v; want %q", totals, err, want)
	}
	png, err := os.ReadFile(filepath.Join(data, "tasks", id, "output", "chart.png"))
	if err != nil || !strings.HasPrefix(string(png), "\x89PNG\r\n\x1a\n") {
		t.Errorf("output/chart.png is not a PNG (%d bytes, %v)", len(png), err)
	}
}

func testClaudeCSVChart(t *testing.T, edit func(testing.TB, *config.Config)) {
	script, err := os.ReadFile("testdata/claude_chart.py")
	if err != nil {
		t.Fatal(err)
	}
	final := "Totals by category are in output/totals.csv and the chart in output/chart.png."
	s, ep := mustClaudeServerAllowing(t, agenttest.AnthropicOptions{Replies: []agenttest.Reply{
		{Text: "I'll total the transactions.", Tool: &agenttest.ToolCall{Name: "Bash", Input: map[string]any{
			"command":     "cd /task && python3 - <<'PY'\n" + string(script) + "PY",
			"description": "Total by category and chart",
		}}, InputTokens: 1500, OutputTokens: 120},
		{Text: final, InputTokens: 1700, OutputTokens: 30},
	}}, true, edit)
	writeTransactions(t, s.data)
	spawned := time.Now()
	tk := spawnClaude(t, s, service.SpawnRequest{TaskDescription: "Parse my transactions and chart my spending by category", ContextFiles: []string{"data/transactions.csv"}})
	res := s.wait(t, tk.ID, 120*time.Second, "totals.csv")
	if res.Status != task.Success {
		logs, _ := filepath.Glob(filepath.Join(s.data, "tasks", tk.ID, "logs", "*"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			t.Logf("%s:\n%s", filepath.Base(l), b[max(0, len(b)-4096):])
		}
		t.Fatalf("task %s: %s", res.Status, res.ErrorMessage)
	}
	if got, want := res.Summary, final; got != want {
		t.Errorf("summary = %q, want %q", got, want)
	}
	checkChart(t, s.data, tk.ID)

	got, err := s.client.Get(context.Background(), tk.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Usage == nil || got.Usage.InputTokens < 3200 || got.Usage.OutputTokens < 150 || got.CostUSD <= 0 {
		t.Errorf("usage %+v cost %v, want at least the scripted 3200 input and 150 output tokens and a cost", got.Usage, got.CostUSD)
	}
	if got.SessionID == "" {
		t.Error("no session id recorded")
	}
	var first time.Time
	var toolUse, toolResult bool
	for _, e := range taskEvents(t, s, tk.ID, task.EventProgress) {
		var p task.Progress
		if err := json.Unmarshal(e.Data, &p); err != nil {
			t.Fatal(err)
		}
		if first.IsZero() {
			first = e.RecordedAt
		}
		switch {
		case p.Kind == "tool_use" && p.Tool == "Bash" && strings.Contains(p.Input, "python3"):
			toolUse = true
		case p.Kind == "tool_result" && p.Tool == "Bash" && p.Status == "ok":
			toolResult = true
		}
	}
	if !toolUse || !toolResult {
		t.Errorf("progress events: tool_use Bash %v, tool_result ok %v; want both", toolUse, toolResult)
	}
	reqs := ep.Requests()
	if len(reqs) == 0 {
		t.Fatal("the endpoint got no request")
	}
	for _, r := range reqs {
		if !r.KeyOK {
			t.Errorf("request %s without the configured key", r.Path)
		}
	}
	// The endpoint was reached through the task's egress proxy (the
	// sandbox has no other way to the host's 127.0.0.2).
	egressEvents(t, s.client, tk.ID, func(evs []task.EgressConnection) bool {
		return slices.ContainsFunc(evs, func(e task.EgressConnection) bool { return e.Allowed && e.Address == ep.Addr })
	})
	t.Logf("spawn → first model request %v, → first progress event %v, → done %v",
		reqs[0].At.Sub(spawned).Round(time.Millisecond), first.Sub(spawned).Round(time.Millisecond), time.Since(spawned).Round(time.Millisecond))
	body := metricsBody(t, s)
	for _, want := range []string{`corral_agent_tokens_total{agent="claude",kind="input"}`, `corral_agent_cost_usd_total{agent="claude"}`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	assertSecretAbsent(t, s, tk.ID, claudeTestKey)
}

func metricsBody(t *testing.T, s *server) string {
	t.Helper()
	code, body := s.do(t, "GET", "/metrics", "", nil)
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	return body
}

// TestClaudeEndpointErrors: the model endpoint refusing the key, rate
// limiting and failing end the task failed with a line that says so.
func TestClaudeEndpointErrors(t *testing.T) {
	tests := []struct {
		status int
		want   string
	}{
		{401, "refused the API key (HTTP 401"},
		{429, "rate limiting (HTTP 429"},
		{500, "server error (HTTP 500"},
	}
	for _, tt := range tests {
		t.Run(http3(tt.status), func(t *testing.T) {
			t.Parallel()
			s, _ := mustClaudeServer(t, agenttest.AnthropicOptions{Status: tt.status})
			tk := spawnClaude(t, s, service.SpawnRequest{TaskDescription: "Say hello"})
			res := s.wait(t, tk.ID, 120*time.Second)
			if res.Status != task.Failed || !strings.Contains(res.ErrorMessage, tt.want) || strings.Contains(res.ErrorMessage, "\n") {
				t.Errorf("task %s: %q; want failed with one line containing %q", res.Status, res.ErrorMessage, tt.want)
			}
			assertSecretAbsent(t, s, tk.ID, claudeTestKey)
		})
	}
}

func http3(code int) string { return "http_" + strconv.Itoa(code) }

// TestClaudeFollowUpResumesSession spawns a follow-up of a finished Claude
// task: the real CLI must resume the first session, so the model sees the
// earlier exchange in the follow-up's first request.
func TestClaudeFollowUpResumesSession(t *testing.T) {
	t.Parallel()
	s, ep := mustClaudeServer(t, agenttest.AnthropicOptions{Replies: []agenttest.Reply{{Text: "The first answer."}, {Text: "The second answer."}}})
	first := spawnClaude(t, s, service.SpawnRequest{TaskDescription: "Say something."})
	res := s.wait(t, first.ID, 3*time.Minute)
	if res.Status != task.Success || res.SessionID == "" {
		t.Fatalf("first task: %s, session %q, %s", res.Status, res.SessionID, res.ErrorMessage)
	}
	next := spawnClaude(t, s, service.SpawnRequest{TaskDescription: "Say more.", FollowUpOf: first.ID})
	res = s.wait(t, next.ID, 3*time.Minute)
	if res.Status != task.Success || res.Summary != "The second answer." {
		t.Fatalf("follow-up: %s %q %s", res.Status, res.Summary, res.ErrorMessage)
	}
	var last agenttest.AnthropicRequest
	for _, r := range ep.Requests() {
		if r.Main {
			last = r
		}
	}
	// A fresh session would send one user message; a resumed one sends the
	// first exchange too.
	if last.Messages < 3 || !strings.Contains(last.LastUser, "Say more.") {
		t.Errorf("the follow-up's request has %d messages: the session was not resumed", last.Messages)
	}
}

// TestClaudeModelOnHostLoopback: a model server on the host's own
// loopback, ANTHROPIC_BASE_URL=http://127.0.0.1:PORT, as people run local
// model servers and gateways. The CLI's base URL is the worker's relay on
// the sandbox's loopback; the egress sends its requests to the host's
// 127.0.0.1:PORT with the key added, whether egress.allow lists the
// address or not: the operator named it, the sandbox did not.
func TestClaudeModelOnHostLoopback(t *testing.T) {
	for _, rt := range []string{"local", "gvisor", "unlisted"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "gvisor" {
				testenv.RequireRunsc(t)
			}
			t.Parallel()
			s, ep := mustClaudeServerAllowing(t, agenttest.AnthropicOptions{Addr: "127.0.0.1:0", Replies: []agenttest.Reply{{Text: "Hello from the host's loopback."}}}, rt != "unlisted", nil)
			req := service.SpawnRequest{TaskDescription: "Say hello"}
			if rt != "unlisted" {
				req.Runtime = rt
			}
			tk := spawnClaude(t, s, req)
			res := s.wait(t, tk.ID, 3*time.Minute)
			if res.Status != task.Success || !strings.Contains(res.Summary, "Hello from the host's loopback.") {
				t.Fatalf("task %s: %q %q", res.Status, res.ErrorMessage, res.Summary)
			}
			for _, r := range ep.Requests() {
				if !r.KeyOK {
					t.Errorf("request %s without the key", r.Path)
				}
			}
			egressEvents(t, s.client, tk.ID, func(cs []task.EgressConnection) bool {
				return slices.ContainsFunc(cs, func(c task.EgressConnection) bool {
					return c.Method == "POST" && c.Path == "/v1/messages" && c.Credential && c.Address == ep.Addr && c.Allowed && c.Status == 200
				})
			})
			assertSecretAbsent(t, s, tk.ID, claudeTestKey)
		})
	}
}
