//go:build integration

package e2e_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/corral-dev/corral/internal/agent/agenttest"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestOpencodeAgent runs the real opencode in a bwrap sandbox with its
// openai provider pointed at a scripted Responses API, reached through the
// egress allowlist: the model asks for the bash tool, opencode runs it
// (writing output/result.txt), and the model's final text becomes the
// summary.
func TestOpencodeAgent(t *testing.T) {
	t.Parallel()
	testenv.RequireBinary(t, "opencode", "npm install -g opencode-ai")
	testenv.RequireBinary(t, "python3", "apt-get install -y python3")
	const key = "sk-opencode-test-3e7a1c9b5d"
	o := agenttest.MustOpenAI(t, agenttest.OpenAIOptions{Addr: agentEndpointAddr, Key: key, Replies: []agenttest.Reply{
		{Text: "I will write the result.", Tool: &agenttest.ToolCall{Name: "bash", Input: map[string]any{"command": agentScriptCommand, "description": "Write the result"}}},
		{Text: agentFinalText},
	}})
	s := mustStartForAgent(t, "opencode", o.Addr, map[string]string{"OPENAI_API_KEY": key, "OPENAI_BASE_URL": o.URL})
	tk := spawnAgent(t, s, "opencode", "Compute 6*7 into output/result.txt", "openai/gpt-5")
	assertAgentSuccess(t, s, tk.ID, "bash", key, true)

	var main int
	for _, r := range o.Requests() {
		if !r.KeyOK {
			t.Errorf("a request without the key: %+v", r)
		}
		if r.Main {
			main++
			if r.Model != "gpt-5" {
				t.Errorf("model %q, want the task's", r.Model)
			}
		}
	}
	if main != 2 {
		t.Errorf("%d main requests, want 2 (the tool call, then the answer): %+v", main, o.Requests())
	}
}

// TestOpencodeAgentEndpointErrors: the endpoint refuses the key (401),
// rate limits (429) or fails (500), and the task fails saying which.
func TestOpencodeAgentEndpointErrors(t *testing.T) {
	t.Parallel()
	testenv.RequireBinary(t, "opencode", "npm install -g opencode-ai")
	for _, tc := range []struct {
		status int
		want   string
	}{
		{http.StatusUnauthorized, "opencode: the model endpoint refused the API key (HTTP 401"},
		{http.StatusTooManyRequests, "opencode: the model endpoint is rate limiting (HTTP 429"},
		// opencode retries a 5xx with backoff for about 90 seconds.
		{http.StatusInternalServerError, "opencode: the model endpoint failed with a server error (HTTP 500"},
	} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			t.Parallel()
			const key = "sk-opencode-err-8f2e4a6c0b"
			opts := agenttest.OpenAIOptions{Addr: agentEndpointAddr, Key: key}
			sent := key
			if tc.status == http.StatusUnauthorized {
				sent = "sk-opencode-wrong-5d6e7f80"
			} else {
				opts.Status = tc.status
			}
			o := agenttest.MustOpenAI(t, opts)
			s := mustStartForAgent(t, "opencode", o.Addr, map[string]string{"OPENAI_API_KEY": sent, "OPENAI_BASE_URL": o.URL})
			tk := spawnAgent(t, s, "opencode", "Say hello", "openai/gpt-5")
			assertAgentFails(t, s, tk.ID, tc.want)
			if len(o.Requests()) == 0 {
				t.Errorf("the endpoint was never asked")
			}
			scriptedNoKey(t, s, tk.ID, sent)
		})
	}
}
