//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
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

// scriptedAgent is an agent CLI as its tests run it: against a scripted
// endpoint of its provider, reached through the egress allowlist.
type scriptedAgent struct {
	name    string // the agent, and the binary of its CLI
	install string // how to install the CLI
	model   string // the model its tasks ask for
	// askedModel is the model the endpoint is asked for (opencode names
	// the provider in the task's model, not in its requests).
	askedModel string
	// keyVar and urlVar are the variables of the agent's environment that
	// give the CLI its API key and the endpoint's URL.
	keyVar, urlVar string
	// streamed says that the CLI streams its main requests, as its tests
	// check.
	streamed bool
	// start starts a scripted endpoint of the agent's provider that takes
	// key and answers with replies, or with the HTTP error status if set.
	start func(t *testing.T, key string, status int, replies []agenttest.Reply) scriptedEndpoint
}

// env is the agent's environment to reach the endpoint at url with key.
func (a scriptedAgent) env(key, url string) map[string]string {
	return map[string]string{a.keyVar: key, a.urlVar: url}
}

// scriptedEndpoint is a started endpoint as the agents' tests use it.
type scriptedEndpoint struct {
	addr  string                     // host:port, for the allowlist
	url   string                     // the base URL, for the CLI
	asked func() []agenttest.Request // what it was asked, in order
	// requests is all it recorded of each request, for a failed test's log
	// (an OpenAI request's tool output included).
	requests func() any
}

// startOpenAI starts a scripted OpenAI Responses API where the agents'
// endpoints listen.
func startOpenAI(t *testing.T, key string, status int, replies []agenttest.Reply) scriptedEndpoint {
	o := agenttest.MustOpenAI(t, agenttest.OpenAIOptions{Addr: agentEndpointAddr, Key: key, Status: status, Replies: replies})
	return scriptedEndpoint{addr: o.Addr, url: o.URL, asked: o.Asked, requests: func() any { return o.Requests() }}
}

// startGemini starts a scripted Gemini API where the agents' endpoints
// listen.
func startGemini(t *testing.T, key string, status int, replies []agenttest.Reply) scriptedEndpoint {
	g := agenttest.MustGemini(t, agenttest.GeminiOptions{Addr: agentEndpointAddr, Key: key, Status: status, Replies: replies})
	return scriptedEndpoint{addr: g.Addr, url: g.URL, asked: g.Asked, requests: func() any { return g.Requests() }}
}

// mustStartForAgent starts a server whose agent name has env and may reach
// endpoint (host:port) through the egress allowlist.
func mustStartForAgent(t *testing.T, name, endpoint string, env map[string]string) *server {
	t.Helper()
	return mustStartForAgentOn(t, "", "", name, endpoint, env)
}

// mustStartForAgentOn is mustStartForAgent with tasks on runtime rt (""
// for the default) and the gvisor runtime on runsc ("" for the one on the
// PATH).
func mustStartForAgentOn(t *testing.T, rt, runsc, name, endpoint string, env map[string]string) *server {
	t.Helper()
	return MustStart(t, func(c *config.Config) {
		if rt != "" {
			c.Runtime = rt
		}
		if runsc != "" {
			c.Gvisor.Runsc = runsc
		}
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
	assertSecretAbsent(t, s, id, key)
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

// The agents whose CLIs the tests run against a scripted endpoint.
var (
	geminiAgent = scriptedAgent{name: "gemini", install: "npm install -g @google/gemini-cli", model: "gemini-2.5-pro", askedModel: "gemini-2.5-pro",
		keyVar: "GEMINI_API_KEY", urlVar: "GOOGLE_GEMINI_BASE_URL", start: startGemini}
	codexAgent = scriptedAgent{name: "codex", install: "npm install -g @openai/codex", model: "gpt-5", askedModel: "gpt-5",
		keyVar: "OPENAI_API_KEY", urlVar: "OPENAI_BASE_URL", streamed: true, start: startOpenAI}
	// opencode names the provider in the task's model, not in its requests.
	opencodeAgent = scriptedAgent{name: "opencode", install: "npm install -g opencode-ai", model: "openai/gpt-5", askedModel: "gpt-5",
		keyVar: "OPENAI_API_KEY", urlVar: "OPENAI_BASE_URL", start: startOpenAI}
)

// require skips (or, under CI, fails) t unless the agent's CLI and python3
// (its shell tool's script) are installed, and returns the runsc to run
// runtime rt with: on gvisor not Debian 12's (20221219), which under load
// loses Codex's spawn of its tool now and then (docs/agents.md).
func (a scriptedAgent) require(t *testing.T, rt string) (runsc string) {
	t.Helper()
	testenv.RequireBinary(t, a.name, a.install)
	testenv.RequireBinary(t, "python3", "apt-get install -y python3")
	if rt == "gvisor" {
		runsc = testenv.RequireSystrapRunsc(t)
	}
	return runsc
}

// TestScriptedAgent runs each agent's real CLI in a sandbox (bwrap, and
// gVisor on the runsc scripts/k8s/build.sh builds) against a scripted
// endpoint of its provider (the Gemini API; a Responses API for Codex and
// for opencode's openai provider), reached through the egress allowlist:
// the model asks for the CLI's shell tool, the CLI runs it (writing
// output/result.txt), and the model's final text becomes the summary. The
// endpoint must have been sent the key every time, and asked twice by the
// agent loop (the tool call, then the answer) for the task's model,
// streamed where the CLI streams.
func TestScriptedAgent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		agent scriptedAgent
		key   string
		call  agenttest.ToolCall // the model's call of the CLI's shell tool
		tool  string             // the tool's name in the task's progress
	}{
		{geminiAgent, "gm-test-key-5d2c81e0a9", agenttest.ToolCall{Name: "run_shell_command", Input: map[string]any{"command": agentScriptCommand}}, "run_shell_command"},
		{codexAgent, "sk-codex-test-9b1f3a7c2e", agenttest.ToolCall{Name: "exec_command", Input: map[string]any{"cmd": agentScriptCommand}}, "shell"},
		{opencodeAgent, "sk-opencode-test-3e7a1c9b5d", agenttest.ToolCall{Name: "bash", Input: map[string]any{"command": agentScriptCommand, "description": "Write the result"}}, "bash"},
	} {
		a := tc.agent
		for _, rt := range []string{"local", "gvisor"} {
			t.Run(a.name+"/"+rt, func(t *testing.T) {
				t.Parallel()
				runsc := a.require(t, rt)
				ep := a.start(t, tc.key, 0, []agenttest.Reply{{Text: "I will write the result.", Tool: &tc.call}, {Text: agentFinalText}})
				s := mustStartForAgentOn(t, rt, runsc, a.name, ep.addr, a.env(tc.key, ep.url))
				tk := spawnAgent(t, s, a.name, "Compute 6*7 into output/result.txt", a.model)
				defer func() {
					if t.Failed() {
						t.Logf("the endpoint was asked: %+v", ep.requests())
						s.logTask(t, tk.ID)
					}
				}()
				assertAgentSuccess(t, s, tk.ID, tc.tool, tc.key, true)

				var main int
				for _, r := range ep.asked() {
					if !r.KeyOK {
						t.Errorf("a request without the key: %+v", r)
					}
					if r.Main {
						main++
						if r.Model != a.askedModel || (a.streamed && !r.Stream) {
							t.Errorf("request %+v, want the task's model %q (streamed: %t)", r, a.askedModel, a.streamed)
						}
					}
				}
				if main != 2 {
					t.Errorf("%d main requests, want 2 (the tool call, then the answer): %+v", main, ep.asked())
				}
			})
		}
	}
}

// endpointError is an HTTP error a scripted endpoint answers with, and
// what the failed task's error message must say of it.
type endpointError struct {
	status int
	want   string
}

// TestScriptedAgentEndpointErrors: the endpoint refuses the key (401),
// rate limits (429) or fails (500), and each agent's task fails with one
// line that says which; the endpoint was asked, and the key sent is in no
// file of the task, no event and no log.
func TestScriptedAgentEndpointErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range endpointErrorCases {
		t.Run(tc.agent.name, func(t *testing.T) {
			t.Parallel()
			testenv.RequireBinary(t, tc.agent.name, tc.agent.install)
			for _, e := range tc.errs {
				t.Run(strconv.Itoa(e.status), func(t *testing.T) {
					t.Parallel()
					testEndpointError(t, tc, e)
				})
			}
		})
	}
}

// TestOpencodeServerErrorsRetried is TestScriptedAgentEndpointErrors's
// opencode 500, which opencode retries with backoff for about 90 s: a
// top-level test of its own, so that it starts among the first parallel
// tests, not queued behind them all as a nested parallel subtest is, with
// the package waiting for it alone at its end.
func TestOpencodeServerErrorsRetried(t *testing.T) {
	t.Parallel()
	testenv.RequireBinary(t, opencodeAgent.name, opencodeAgent.install)
	testEndpointError(t, opencodeErrors, endpointError{http.StatusInternalServerError, "opencode: the model endpoint failed with a server error (HTTP 500"})
}

// endpointErrorCase is an agent, its endpoint's key and the wrong one a
// 401 is sent, and the errors its endpoint answers with.
type endpointErrorCase struct {
	agent         scriptedAgent
	key, wrongKey string
	errs          []endpointError
}

var (
	opencodeErrors = endpointErrorCase{opencodeAgent, "sk-opencode-err-8f2e4a6c0b", "sk-opencode-wrong-5d6e7f80", []endpointError{
		{http.StatusUnauthorized, "opencode: the model endpoint refused the API key (HTTP 401"},
		{http.StatusTooManyRequests, "opencode: the model endpoint is rate limiting (HTTP 429"},
		// Its 500 is TestOpencodeServerErrorsRetried.
	}}
	endpointErrorCases = []endpointErrorCase{
		// Gemini CLI does not retry a 401; it tries a 429 or 500 three
		// times, about 15 s, as the adapter configures it.
		{geminiAgent, "gm-err-key-3a9c5e7f1b", "gm-wrong-key-77f1d2c3", []endpointError{
			{http.StatusUnauthorized, "gemini: the model endpoint refused the API key (HTTP 401; check GEMINI_API_KEY in agents.gemini.env)"},
			{http.StatusTooManyRequests, "gemini: the model endpoint is rate limiting (HTTP 429; retries exhausted)"},
			{http.StatusInternalServerError, "gemini: the model endpoint failed with a server error (HTTP 500; retries exhausted)"},
		}},
		{codexAgent, "sk-codex-err-4c8d0e2f6a", "sk-codex-wrong-1a2b3c4d", []endpointError{
			{http.StatusUnauthorized, "codex: the model endpoint refused the API key (HTTP 401; check OPENAI_API_KEY in agents.codex.env)"},
			{http.StatusTooManyRequests, "codex: the model endpoint is rate limiting (HTTP 429; retries exhausted)"},
			{http.StatusInternalServerError, "codex: the model endpoint failed with a server error"},
		}},
		opencodeErrors,
	}
)

// testEndpointError runs one of tc's agent's tasks against an endpoint
// that answers with e (a 401: refuses the wrong key sent) and checks the
// task fails saying so, the endpoint was asked, and the key sent is
// nowhere in the task's files, events or logs.
func testEndpointError(t *testing.T, tc endpointErrorCase, e endpointError) {
	a := tc.agent
	sent, status := tc.key, e.status
	if e.status == http.StatusUnauthorized {
		sent, status = tc.wrongKey, 0
	}
	ep := a.start(t, tc.key, status, nil)
	s := mustStartForAgent(t, a.name, ep.addr, a.env(sent, ep.url))
	tk := spawnAgent(t, s, a.name, "Say hello", a.model)
	assertAgentFails(t, s, tk.ID, e.want)
	if len(ep.asked()) == 0 {
		t.Errorf("the endpoint was never asked")
	}
	assertSecretAbsent(t, s, tk.ID, sent)
}
