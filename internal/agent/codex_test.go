package agent

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCodexPrepare(t *testing.T) {
	got := mustPrepare(t, "codex", Invocation{PromptPath: "/task/prompt.md", Model: "gpt-5", ExtraArgs: []string{"-c", "x=1"}, Env: []string{"OPENAI_API_KEY=k"}})
	if got.Args[0] != "/bin/sh" || got.Args[1] != "-c" || got.Args[3] != "codex-setup" {
		t.Fatalf("args %q: want a /bin/sh -c setup", got.Args)
	}
	want := []string{"codex", "exec", "--json", "--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check", "--color", "never", "--model", "gpt-5", "-c", "x=1"}
	if diff := cmp.Diff(want, got.Args[4:]); diff != "" {
		t.Errorf("CLI argv (-want +got):\n%s", diff)
	}
	if got.StdinPath != "/task/prompt.md" || got.Transcript != "agent.jsonl" || got.InstallHint != "npm install -g @openai/codex" || strings.Join(got.Env, " ") != "OPENAI_API_KEY=k" {
		t.Errorf("process %+v", got)
	}
}

// TestCodexSetupScript runs the setup shell with a stand-in CLI: with
// OPENAI_BASE_URL it adds the provider options right after the
// subcommand, before the adapter's flags and the configured arguments
// (whose -c options so win), without it nothing, and the prompt argument
// "-" comes last either way.
func TestCodexSetupScript(t *testing.T) {
	p := mustPrepare(t, "codex", Invocation{Binary: "/usr/bin/printf", Model: "m", ExtraArgs: []string{"-c", "model_providers.corral.supports_websockets=true"}})
	// printf's format is "exec": print it, then one argument a line.
	p.Args[4], p.Args[5] = "/usr/bin/printf", "%s\\n"
	run := func(env ...string) (string, error) {
		cmd := exec.Command(p.Args[0], p.Args[1:]...)
		cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run()
	if err != nil {
		t.Fatal(err, out)
	}
	flags := "--json\n--dangerously-bypass-approvals-and-sandbox\n--skip-git-repo-check\n--color\nnever\n--model\nm\n-c\nmodel_providers.corral.supports_websockets=true\n-\n"
	if out != flags {
		t.Errorf("without a base URL: %q, want %q", out, flags)
	}
	out, err = run("OPENAI_BASE_URL=http://127.0.0.2:9/v1")
	if err != nil {
		t.Fatal(err, out)
	}
	if want := "-c\nmodel_providers.corral={name=\"corral\",base_url=\"http://127.0.0.2:9/v1\",env_key=\"OPENAI_API_KEY\",wire_api=\"responses\"}\n-c\nmodel_provider=corral\n" + flags; out != want {
		t.Errorf("with a base URL: %q, want %q", out, want)
	}
	if out, err := run(`OPENAI_BASE_URL=http://x/"]`); err == nil || !strings.Contains(out, "must not contain quotes") {
		t.Errorf("a quote in the URL: %v %q", err, out)
	}
}

func TestCodexStreamErrors(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"testdata/codex_401.jsonl", "codex: the model endpoint refused the API key (HTTP 401; check OPENAI_API_KEY in agents.codex.env): unexpected status 401 Unauthorized: Incorrect API key provided., url: http://127.0.0.1:18620/v1/responses"},
		{"testdata/codex_429.jsonl", "codex: the model endpoint is rate limiting (HTTP 429; retries exhausted): exceeded retry limit, last status: 429 Too Many Requests"},
		{"testdata/codex_500.jsonl", "codex: the model endpoint failed with a server error (retries exhausted): We’re currently experiencing high demand, which may cause temporary errors."},
	} {
		got := parseAll(codexAdapter{}, mustRead(t, tc.file))
		if got.Error != tc.want || !got.Done {
			t.Errorf("%s: %+v\nwant error %q", tc.file, got, tc.want)
		}
	}
	// Killed while reconnecting: the last error says why.
	got := parseAll(codexAdapter{}, `{"type":"turn.started"}`+"\n"+`{"type":"error","message":"Reconnecting... 2/5 (unexpected status 503 Service Unavailable: busy)"}`)
	if want := "codex: the model endpoint failed with a server error (HTTP 503; retries exhausted): Reconnecting... 2/5 (unexpected status 503 Service Unavailable: busy)"; got.Error != want || got.Done {
		t.Errorf("cut short: %+v\nwant error %q", got, want)
	}
	// A failed command is a tool result with status error, not a failed run.
	got = parseAll(codexAdapter{}, `{"type":"item.completed","item":{"type":"command_execution","command":"false","aggregated_output":"","exit_code":1,"status":"failed"}}`+"\n"+`{"type":"item.completed","item":{"type":"agent_message","text":"It failed."}}`+"\n"+`{"type":"turn.completed","usage":{"input_tokens":5,"cached_input_tokens":2,"output_tokens":1}}`)
	if want := (Result{Summary: "It failed.", Done: true, Usage: Usage{InputTokens: 3, CacheReadTokens: 2, OutputTokens: 1}}); !cmp.Equal(want, got) {
		t.Errorf("failed command: %+v", got)
	}
}
