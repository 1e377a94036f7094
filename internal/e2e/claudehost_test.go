//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/agent/agenttest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

var taskIDInText = regexp.MustCompile(`task-[0-9a-z]{26}`)

// TestClaudeCodeAsHost is the whole loop from the assistant's side: Claude
// Code (the real CLI, on the host) has Corral as an MCP server over
// streamable HTTP; a scripted model makes it call spawn_worker, then
// read_task_result on the task id it got back, then answer with what the
// worker found.
func TestClaudeCodeAsHost(t *testing.T) {
	t.Parallel()
	claude := testenv.RequireBinary(t, "claude", "npm install -g @anthropic-ai/claude-code")
	s := MustStartEnv(t, []string{"CORRAL_API_TOKEN=" + mcpToken}, nil)

	var spawned string
	ep := agenttest.MustAnthropic(t, agenttest.AnthropicOptions{
		Key: claudeTestKey,
		Respond: func(r agenttest.AnthropicRequest) agenttest.Reply {
			switch {
			case r.Reply == 0:
				return agenttest.Reply{Text: "I will hand this to a worker.", Tool: &agenttest.ToolCall{
					Name: "mcp__corral__spawn_worker",
					Input: map[string]any{
						"task_description": "Count the words in the phrase and write the count to output/count.txt",
						"agent":            "command",
						"command":          []string{"sh", "-c", "echo one two three | wc -w > output/count.txt"},
					},
				}}
			case spawned == "":
				spawned = taskIDInText.FindString(r.LastUser)
				return agenttest.Reply{Tool: &agenttest.ToolCall{
					Name:  "mcp__corral__read_task_result",
					Input: map[string]any{"task_id": spawned, "include_file_contents": []string{"count.txt"}, "wait_seconds": 60},
				}}
			default:
				return agenttest.Reply{Text: "The worker counted the words."}
			}
		},
	})

	home := t.TempDir()
	mcpConfig := filepath.Join(home, "mcp.json")
	cfg, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{"corral": map[string]any{
		"type": "http", "url": s.url + "/mcp", "headers": map[string]string{"Authorization": "Bearer " + mcpToken},
	}}})
	if err := os.WriteFile(mcpConfig, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, claude, "-p", "Please count the words in 'one two three' using a worker.",
		"--output-format", "stream-json", "--verbose",
		"--mcp-config", mcpConfig, "--strict-mcp-config",
		"--allowedTools", "mcp__corral__spawn_worker", "mcp__corral__read_task_result")
	cmd.Env = []string{
		"HOME=" + home, "PATH=" + os.Getenv("PATH"),
		"ANTHROPIC_BASE_URL=" + ep.URL, "ANTHROPIC_API_KEY=" + claudeTestKey,
		"DISABLE_AUTOUPDATER=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_TELEMETRY=1",
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("claude: %v\n%s", err, out)
	}
	// Requests takes the endpoint's lock, which Respond ran under: after
	// it, spawned is safe to read.
	reqs := ep.Requests()
	if spawned == "" {
		t.Fatalf("the model never saw a task id from spawn_worker; claude said:\n%s", out)
	}
	res, err := s.client.Result(context.Background(), service.ResultRequest{TaskID: spawned, IncludeFileContents: []string{"count.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != task.Success || strings.TrimSpace(res.FileContents["count.txt"].Content) != "3" {
		t.Errorf("the worker's task: %s %q %s", res.Status, res.FileContents["count.txt"].Content, res.ErrorMessage)
	}
	// The read_task_result answer reached the model as a tool result.
	var sawResult bool
	for _, r := range reqs {
		if r.Main && strings.Contains(r.LastUser, spawned) && strings.Contains(r.LastUser, `"status":"success"`) {
			sawResult = true
		}
	}
	if !sawResult {
		t.Errorf("no model request carried read_task_result's answer for %s", spawned)
	}
	if !strings.Contains(string(out), "The worker counted the words.") {
		t.Errorf("claude's final answer is missing:\n%s", out)
	}
	if tk, _ := s.client.Get(context.Background(), spawned); tk.Agent != task.AgentCommand {
		t.Errorf("spawned task has agent %q", tk.Agent)
	}
}
