//go:build integration

package e2e_test

import (
	"net/http"
	"slices"
	"testing"

	"github.com/corral-dev/corral/internal/agent/agenttest"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/task"
)

// TestCodexOverWebSocket runs the real Codex CLI with its WebSocket
// transport to the Responses API turned on (agents.codex.args), in a
// sandbox (bwrap, and gVisor on the runsc scripts/k8s/build.sh builds),
// against a scripted Responses API reached through the worker's relay and
// the egress proxy: the model asks for the shell tool, the CLI runs it,
// and the model's final text becomes the summary, as in
// TestScriptedAgent. Every main request must have come over the WebSocket
// with the key, none as the POST Codex falls back to when its WebSocket
// fails (as it did while the proxy answered upgrades with 502), and the
// task's egress record must show the handshake relayed: 101, the key
// added. The key must be in no file of the task, event or log
// (assertAgentSuccess).
func TestCodexOverWebSocket(t *testing.T) {
	t.Parallel()
	const key = "sk-codex-ws-test-6f2a9d1c4e"
	for _, rt := range []string{"local", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			runsc := codexAgent.require(t, rt)
			call := agenttest.ToolCall{Name: "exec_command", Input: map[string]any{"cmd": agentScriptCommand}}
			ep := agenttest.MustOpenAI(t, agenttest.OpenAIOptions{Addr: agentEndpointAddr, Key: key, Replies: []agenttest.Reply{
				{Text: "I will write the result.", Tool: &call},
				{Text: agentFinalText},
			}})
			s := MustStart(t, func(c *config.Config) {
				c.Runtime = rt
				if runsc != "" {
					c.Gvisor.Runsc = runsc
				}
				c.Egress.Mode = "allowlist"
				c.Egress.Allow = []string{ep.Addr}
				c.Agents.Codex.Env = codexAgent.env(key, ep.URL)
				c.Agents.Codex.Args = []string{"-c", "model_providers.corral.supports_websockets=true"}
			})
			tk := spawnAgent(t, s, codexAgent.name, "Compute 6*7 into output/result.txt", codexAgent.model)
			defer func() {
				if t.Failed() {
					t.Logf("the endpoint was asked: %+v", ep.Requests())
					s.logTask(t, tk.ID)
				}
			}()
			assertAgentSuccess(t, s, tk.ID, "shell", key, true)

			var main []agenttest.OpenAIRequest
			for _, r := range ep.Requests() {
				if !r.KeyOK {
					t.Errorf("a request without the key: %+v", r)
				}
				if !r.WebSocket {
					t.Errorf("a request by POST, not over the WebSocket: %+v", r)
				}
				if r.Main {
					main = append(main, r)
				}
			}
			if len(main) != 2 {
				t.Fatalf("%d main requests, want 2 (the tool call, then the answer): %+v", len(main), main)
			}
			for _, r := range main {
				if r.Model != codexAgent.askedModel || !r.Stream {
					t.Errorf("request %+v, want the task's model %q, streamed", r, codexAgent.askedModel)
				}
			}
			if main[1].LastOutput == "" {
				t.Errorf("the answer's request carried no tool output: %+v", main[1])
			}

			// The record has the path the sandbox asked its relay for, whose
			// base URL stands for the API's, /v1 included: /responses, which
			// the endpoint saw as /v1/responses. It is written when the
			// upgraded connection ends, with the CLI.
			egressEvents(t, s.client, tk.ID, func(cs []task.EgressConnection) bool {
				return slices.ContainsFunc(cs, func(c task.EgressConnection) bool {
					return c.Method == http.MethodGet && c.Path == "/responses" && c.Status == http.StatusSwitchingProtocols &&
						c.Credential && c.Allowed && c.BytesUp > 0 && c.BytesDown > 0
				})
			})
		})
	}
}
