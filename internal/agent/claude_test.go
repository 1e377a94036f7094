package agent

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestClaudePrepareHomeResumeSystemPrompt(t *testing.T) {
	got := mustPrepare(t, "claude", Invocation{PromptPath: "/task/prompt.md", Home: "/task/.home", Resume: "84e52def", SystemPrompt: "Results go to /task/output.", Env: []string{"A=1"}})
	wantArgs := []string{"claude", "-p", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions",
		"--append-system-prompt", "Results go to /task/output.", "--resume", "84e52def"}
	if diff := cmp.Diff(wantArgs, got.Args); diff != "" {
		t.Errorf("args (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"A=1", "HOME=/task/.home"}, got.Env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	for _, kv := range []string{"DISABLE_AUTOUPDATER=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"} {
		if !slices.Contains(got.DefaultEnv, kv) {
			t.Errorf("default env %q lacks %s", got.DefaultEnv, kv)
		}
	}
}

// The result lines Claude Code 2.1.197 prints when the model endpoint
// answers with an HTTP error (after its retries).
func TestClaudeHTTPErrors(t *testing.T) {
	tests := []struct {
		line string
		want string
	}{
		{`{"type":"result","subtype":"success","is_error":true,"api_error_status":401,"num_turns":1,"result":"Invalid API key · Fix external API key","session_id":"s1","total_cost_usd":0}`,
			"claude: the model endpoint refused the API key (HTTP 401; check ANTHROPIC_API_KEY in agents.claude.env): Invalid API key · Fix external API key"},
		{`{"type":"result","subtype":"success","is_error":true,"api_error_status":429,"num_turns":1,"result":"API Error: Request rejected (429) · Number of request tokens has exceeded your per-minute rate limit","session_id":"s1"}`,
			"claude: the model endpoint is rate limiting (HTTP 429; retries exhausted): API Error: Request rejected (429) · Number of request tokens has exceeded your per-minute rate limit"},
		{`{"type":"result","subtype":"success","is_error":true,"api_error_status":500,"num_turns":1,"result":"API Error: 500 Internal server error.\nThis is a server-side issue","session_id":"s1"}`,
			"claude: the model endpoint failed with a server error (HTTP 500; retries exhausted): API Error: 500 Internal server error. This is a server-side issue"},
		{`{"type":"result","subtype":"success","is_error":true,"api_error_status":529,"result":"Overloaded"}`,
			"claude: the model endpoint is overloaded (HTTP 529; retries exhausted): Overloaded"},
	}
	a, _ := Lookup("claude")
	for _, tt := range tests {
		res, _ := feed(t, a, tt.line+"\n", 7)
		if res.Error != tt.want {
			t.Errorf("error = %q\nwant    %q", res.Error, tt.want)
		}
		if strings.Contains(res.Error, "\n") {
			t.Errorf("error %q is not one line", res.Error)
		}
	}
}

func TestClaudeToolResultProgress(t *testing.T) {
	a, _ := Lookup("claude")
	stream := `{"type":"assistant","message":{"content":[{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"false"}}]}}
{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t1","is_error":true,"content":[{"type":"text","text":"Exit code 1"}]}]}}
{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"unknown","content":"` + strings.Repeat("y", 3000) + `"}]}}
`
	_, got := feed(t, a, stream, 5)
	if len(got) != 3 {
		t.Fatalf("progress = %+v", got)
	}
	if diff := cmp.Diff(Progress{Kind: ProgressToolResult, Tool: "Bash", Status: "error", Text: "Exit code 1"}, got[1]); diff != "" {
		t.Errorf("tool result (-want +got):\n%s", diff)
	}
	if got[2].Status != "ok" || got[2].Tool != "" || len(got[2].Text) > MaxProgressBytes {
		t.Errorf("unknown tool result = %+v (text %d bytes)", got[2], len(got[2].Text))
	}
}
