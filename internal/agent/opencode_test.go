package agent

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestOpencodePrepare(t *testing.T) {
	got := mustPrepare(t, "opencode", Invocation{PromptPath: "/task/prompt.md", Model: "openai/gpt-5", ExtraArgs: []string{"--agent", "build"}, Env: []string{"OPENAI_API_KEY=k"}})
	want := Process{
		Args:        []string{"opencode", "run", "--format", "json", "--auto", "--model", "openai/gpt-5", "--agent", "build"},
		Env:         []string{"OPENAI_API_KEY=k"},
		DefaultEnv:  opencodeDefaultEnv,
		StdinPath:   "/task/prompt.md",
		Transcript:  "agent.jsonl",
		InstallHint: "npm install -g opencode-ai",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("process (-want +got):\n%s", diff)
	}
	b := mustPrepare(t, "opencode", Invocation{Binary: "/opt/opencode", Prompt: "hi"})
	if diff := cmp.Diff([]string{"/opt/opencode", "run", "--format", "json", "--auto"}, b.Args); diff != "" || b.Stdin != "hi" {
		t.Errorf("with a binary and no model (-want +got):\n%s", diff)
	}
}

func TestOpencodeStreamErrors(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"testdata/opencode_401.jsonl", "opencode: the model endpoint refused the API key (HTTP 401; check the provider's API key in agents.opencode.env): Incorrect API key provided."},
		{"testdata/opencode_429.jsonl", "opencode: the model endpoint is rate limiting (HTTP 429; retries exhausted): Rate limit reached for requests."},
	} {
		got := parseAll(opencodeAdapter{}, mustRead(t, tc.file))
		if got.Error != tc.want || got.Done {
			t.Errorf("%s: %+v\nwant error %q", tc.file, got, tc.want)
		}
	}
	got := parseAll(opencodeAdapter{}, `{"type":"error","error":{"name":"UnknownError","data":{"message":"Model not found:\nopenai/nope"}}}`)
	if want := "opencode: Model not found: openai/nope"; got.Error != want {
		t.Errorf("error %q, want %q", got.Error, want)
	}
	// A failing command is a tool result with status error.
	line := `{"type":"tool_use","part":{"tool":"bash","state":{"status":"completed","input":{"command":"false"},"output":"","metadata":{"exit":1}}}}` + "\n"
	_, prog := feed(t, opencodeAdapter{}, line, len(line))
	if len(prog) != 2 || prog[1].Status != "error" {
		t.Errorf("failed command: %+v", prog)
	}
}
