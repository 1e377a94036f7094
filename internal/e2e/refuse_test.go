//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// TestSpawnRefusedWithoutCredentials: a task for an agent the server has
// no credentials for is refused at its spawn, over the API (422) and over
// MCP (an error result), naming the variable to set and where, and no
// task is recorded; with a key, the same spawn is taken.
func TestSpawnRefusedWithoutCredentials(t *testing.T) {
	t.Parallel()
	const want = "set one of ANTHROPIC_API_KEY, ANTHROPIC_AUTH_TOKEN, CLAUDE_CODE_OAUTH_TOKEN in agents.claude.env"
	ctx := context.Background()
	s := MustStart(t, nil)

	status, body := s.do(t, "POST", "/api/tasks", "application/json", strings.NewReader(`{"task_description":"x","agent":"claude"}`))
	var e struct {
		Error  string `json:"error"`
		Fields []struct {
			Field, Message string
		} `json:"fields"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || status != http.StatusUnprocessableEntity || !strings.Contains(e.Error, want) {
		t.Errorf("spawn for claude without a key: %d %s, want 422 saying %q", status, body, want)
	}
	if len(e.Fields) != 1 || e.Fields[0].Field != "agent" {
		t.Errorf("fields %+v, want the one of agent", e.Fields)
	}
	// The default agent is claude: a spawn naming none is refused alike.
	if status, body := s.do(t, "POST", "/api/tasks", "application/json", strings.NewReader(`{"task_description":"x"}`)); status != http.StatusUnprocessableEntity || !strings.Contains(body, want) {
		t.Errorf("spawn for the default agent without a key: %d %s, want 422 saying %q", status, body, want)
	}

	res, err := connectMCP(t, s).CallTool(ctx, &mcp.CallToolParams{Name: "spawn_worker", Arguments: map[string]any{"task_description": "x", "agent": "claude"}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || !strings.Contains(mcpText(res), want) {
		t.Errorf("spawn_worker for claude without a key: error %t %q, want one saying %q", res.IsError, mcpText(res), want)
	}

	var recorded []string
	if err := s.client.Events(ctx, service.EventsRequest{}, func(e eventstore.Event) error {
		if strings.HasPrefix(e.Type, "task_") {
			recorded = append(recorded, e.Type)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(recorded) > 0 {
		t.Errorf("refused spawns recorded %q", recorded)
	}

	withKey := MustStart(t, func(c *config.Config) {
		c.Agents.Claude.Env = map[string]string{"ANTHROPIC_API_KEY": "sk-ant-test-never-sent"}
	})
	tk, _, err := withKey.client.Spawn(ctx, service.SpawnRequest{TaskDescription: "x", Agent: task.AgentClaude})
	if err != nil {
		t.Fatalf("spawn for claude with a key: %v", err)
	}
	if _, err := withKey.client.Cancel(ctx, tk.ID); err != nil {
		t.Errorf("cancel %s: %v", tk.ID, err)
	}
	withKey.wait(t, tk.ID, time.Minute)
}
