//go:build integration

package e2e_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/corral-dev/corral/internal/agent/agenttest"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestCodexAgent runs the real Codex CLI in a bwrap sandbox against a
// scripted Responses API reached through the egress allowlist: the model
// asks for exec_command, Codex runs it (writing output/result.txt), and the
// model's final text becomes the summary.
func TestCodexAgent(t *testing.T) {
	t.Parallel()
	testenv.RequireBinary(t, "codex", "npm install -g @openai/codex")
	testenv.RequireBinary(t, "python3", "apt-get install -y python3")
	const key = "sk-codex-test-9b1f3a7c2e"
	o := agenttest.MustOpenAI(t, agenttest.OpenAIOptions{Addr: agentEndpointAddr, Key: key, Replies: []agenttest.Reply{
		{Text: "I will write the result.", Tool: &agenttest.ToolCall{Name: "exec_command", Input: map[string]any{"cmd": agentScriptCommand}}},
		{Text: agentFinalText},
	}})
	s := mustStartForAgent(t, "codex", o.Addr, map[string]string{"OPENAI_API_KEY": key, "OPENAI_BASE_URL": o.URL})
	tk := spawnAgent(t, s, "codex", "Compute 6*7 into output/result.txt", "gpt-5")
	assertAgentSuccess(t, s, tk.ID, "shell", key, true)

	var main int
	for _, r := range o.Requests() {
		if !r.KeyOK {
			t.Errorf("a request without the key: %+v", r)
		}
		if r.Main {
			main++
			if r.Model != "gpt-5" || !r.Stream {
				t.Errorf("request %+v, want the task's model, streamed", r)
			}
		}
	}
	if main != 2 {
		t.Errorf("%d main requests, want 2 (the tool call, then the answer): %+v", main, o.Requests())
	}
}

// TestCodexAgentEndpointErrors: the endpoint refuses the key (401), rate
// limits (429) or fails (500), and each task fails with a line that says
// which.
func TestCodexAgentEndpointErrors(t *testing.T) {
	t.Parallel()
	testenv.RequireBinary(t, "codex", "npm install -g @openai/codex")
	for _, tc := range []struct {
		status int
		want   []string
	}{
		{http.StatusUnauthorized, []string{"codex: the model endpoint refused the API key (HTTP 401; check OPENAI_API_KEY in agents.codex.env)"}},
		{http.StatusTooManyRequests, []string{"codex: the model endpoint is rate limiting (HTTP 429; retries exhausted)"}},
		{http.StatusInternalServerError, []string{"codex: the model endpoint failed with a server error"}},
	} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			t.Parallel()
			const key = "sk-codex-err-4c8d0e2f6a"
			opts := agenttest.OpenAIOptions{Addr: agentEndpointAddr, Key: key}
			sent := key
			if tc.status == http.StatusUnauthorized {
				sent = "sk-codex-wrong-1a2b3c4d"
			} else {
				opts.Status = tc.status
			}
			o := agenttest.MustOpenAI(t, opts)
			s := mustStartForAgent(t, "codex", o.Addr, map[string]string{"OPENAI_API_KEY": sent, "OPENAI_BASE_URL": o.URL})
			tk := spawnAgent(t, s, "codex", "Say hello", "gpt-5")
			assertAgentFails(t, s, tk.ID, tc.want...)
			if len(o.Requests()) == 0 {
				t.Errorf("the endpoint was never asked")
			}
			scriptedNoKey(t, s, tk.ID, sent)
		})
	}
}
