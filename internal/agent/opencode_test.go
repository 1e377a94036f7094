package agent

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestOpencodePrepare(t *testing.T) {
	a, err := Lookup("opencode")
	if err != nil {
		t.Fatal(err)
	}
	got, err := a.Prepare(Invocation{PromptPath: "/task/prompt.md", Model: "openai/gpt-5", ExtraArgs: []string{"--agent", "build"}, Env: []string{"OPENAI_API_KEY=k"}})
	if err != nil {
		t.Fatal(err)
	}
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
	b, _ := a.Prepare(Invocation{Binary: "/opt/opencode", Prompt: "hi"})
	if diff := cmp.Diff([]string{"/opt/opencode", "run", "--format", "json", "--auto"}, b.Args); diff != "" || b.Stdin != "hi" {
		t.Errorf("with a binary and no model (-want +got):\n%s", diff)
	}
}

func TestOpencodeStreamSuccess(t *testing.T) {
	stream := mustRead(t, "testdata/opencode_success.jsonl")
	const cmdline = `mkdir -p output && python3 -c \"open('output/result.txt','w').write('42\\n')\"`
	for _, chunk := range []int{1, 11, len(stream)} {
		var prog []Progress
		p := opencodeAdapter{}.NewParser(func(pr Progress) { prog = append(prog, pr) })
		writeChunks(t, p, stream, chunk)
		got := p.Result()
		want := Result{
			Summary:   "Done: wrote output/result.txt.",
			SessionID: "ses_dfd4c05aeffeRheZGQbjbqnqKI",
			Turns:     1,
			CostUSD:   0.00065,
			Usage:     Usage{InputTokens: 200, OutputTokens: 40},
			Done:      true,
		}
		if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b float64) bool { return a-b < 1e-12 && b-a < 1e-12 })); diff != "" {
			t.Errorf("chunk %d: result (-want +got):\n%s", chunk, diff)
		}
		wantProg := []Progress{
			{Kind: ProgressInit},
			{Kind: ProgressText, Text: "Writing the file."},
			{Kind: ProgressToolUse, Tool: "bash", Input: Truncate(`{"cmd":"`+cmdline+`","command":"`+cmdline+`"}`, MaxInputBytes)},
			{Kind: ProgressToolResult, Tool: "bash", Status: "ok", Text: "(no output)"},
			{Kind: ProgressText, Text: "Done: wrote output/result.txt."},
			{Kind: ProgressResult, Text: "Done: wrote output/result.txt."},
		}
		if diff := cmp.Diff(wantProg, prog); diff != "" {
			t.Errorf("chunk %d: progress (-want +got):\n%s", chunk, diff)
		}
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
	var prog []Progress
	p := opencodeAdapter{}.NewParser(func(pr Progress) { prog = append(prog, pr) })
	p.Write([]byte(`{"type":"tool_use","part":{"tool":"bash","state":{"status":"completed","input":{"command":"false"},"output":"","metadata":{"exit":1}}}}` + "\n"))
	if len(prog) != 2 || prog[1].Status != "error" {
		t.Errorf("failed command: %+v", prog)
	}
}
