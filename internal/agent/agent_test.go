package agent

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
)

func TestLookup(t *testing.T) {
	for _, name := range []string{"claude", "command", "gemini", "codex", "opencode"} {
		if _, err := Lookup(name); err != nil {
			t.Errorf("Lookup(%q): %v", name, err)
		}
	}
	for _, name := range []string{"", "gpt", "Claude"} {
		_, err := Lookup(name)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "unknown agent") {
			t.Errorf("Lookup(%q) err = %v, want ErrInvalidArgument", name, err)
		}
	}
}

func TestCommandPrepare(t *testing.T) {
	got := mustPrepare(t, "command", Invocation{PromptPath: "/task/prompt.md", Command: []string{"python3", "run.py"}, ExtraArgs: []string{"-v"}, Env: []string{"A=1"}})
	want := Process{Args: []string{"python3", "run.py", "-v"}, Env: []string{"A=1"}, StdinPath: "/task/prompt.md", Transcript: "stdout.log", SummaryFile: "output/summary.md"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Process (-want +got):\n%s", diff)
	}
	a, _ := Lookup("command")
	for _, argv := range [][]string{nil, {}, {""}} {
		if _, err := a.Prepare(Invocation{Command: argv}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Prepare(%q) err = %v, want ErrInvalidArgument", argv, err)
		}
	}
}

func TestCommandSummaryIsLastLines(t *testing.T) {
	tests := []struct {
		name string
		out  string
		want string
	}{
		{"few lines", "one\ntwo\n\n  \nthree\n\n", "one\ntwo\nthree"},
		{"no final newline", "a\nb", "a\nb"},
		{"empty", "", ""},
		{"bounded to the last lines", strings.Repeat(strings.Repeat("x", 99)+"\n", 100) + "last\n", strings.Repeat(strings.Repeat("x", 99)+"\n", 20) + "last"},
		{"one huge line keeps its end", strings.Repeat("a", 5000) + "END\n", strings.Repeat("a", 2048-3) + "END"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, _ := Lookup("command")
			got, _ := feed(t, a, tt.out, 7)
			if got.Summary != tt.want {
				t.Errorf("summary = %q (%d bytes), want %q (%d bytes)", got.Summary, len(got.Summary), tt.want, len(tt.want))
			}
			if len(got.Summary) > commandSummaryBytes {
				t.Errorf("summary is %d bytes, over %d", len(got.Summary), commandSummaryBytes)
			}
		})
	}
}

func TestCommandProgressLines(t *testing.T) {
	a, _ := Lookup("command")
	_, got := feed(t, a, "hello\r\n\nworld\n"+strings.Repeat("z", 3000)+"\ntail", 5)
	want := []Progress{
		{Kind: ProgressText, Text: "hello"},
		{Kind: ProgressText, Text: "world"},
		{Kind: ProgressText, Text: strings.Repeat("z", MaxProgressBytes) + "…"},
		{Kind: ProgressText, Text: "tail"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("progress (-want +got):\n%s", diff)
	}
}

func TestClaudePrepare(t *testing.T) {
	got := mustPrepare(t, "claude", Invocation{Prompt: "do it", Model: "opus", ExtraArgs: []string{"--max-turns", "5"}})
	want := Process{
		Args:        []string{"claude", "-p", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions", "--model", "opus", "--max-turns", "5"},
		Env:         nil,
		DefaultEnv:  claudeDefaultEnv,
		Stdin:       "do it",
		Transcript:  "agent.jsonl",
		InstallHint: "npm install -g @anthropic-ai/claude-code",
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b []string) bool { return strings.Join(a, "\x00") == strings.Join(b, "\x00") })); diff != "" {
		t.Errorf("Process (-want +got):\n%s", diff)
	}
	got = mustPrepare(t, "claude", Invocation{PromptPath: "/task/prompt.md", Binary: "/opt/claude/bin/claude"})
	if got.Args[0] != "/opt/claude/bin/claude" || got.StdinPath != "/task/prompt.md" || strings.Contains(strings.Join(got.Args, " "), "--model") {
		t.Errorf("with binary and no model: %+v", got)
	}
}

// writeChunks feeds s to p in chunks of n bytes, as a pipe would.
func writeChunks(tb testing.TB, p Parser, s string, n int) {
	tb.Helper()
	for len(s) > 0 {
		k := min(n, len(s))
		if w, err := p.Write([]byte(s[:k])); err != nil || w != k {
			tb.Fatalf("Write = %d, %v", w, err)
		}
		s = s[k:]
	}
}

// feed writes stream to a new parser of a in chunks of n bytes and returns
// the parser's result and the progress it reported.
func feed(tb testing.TB, a Adapter, stream string, n int) (Result, []Progress) {
	tb.Helper()
	var prog []Progress
	p := a.NewParser(func(pr Progress) { prog = append(prog, pr) })
	writeChunks(tb, p, stream, n)
	return p.Result(), prog
}

// mustPrepare looks up the named agent and prepares inv with it.
func mustPrepare(tb testing.TB, name string, inv Invocation) Process {
	tb.Helper()
	a, err := Lookup(name)
	if err != nil {
		tb.Fatal(err)
	}
	p, err := a.Prepare(inv)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func mustRead(tb testing.TB, name string) string {
	tb.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// TestStreamSuccess feeds each agent's transcript of a successful run to
// its parser, a byte at a time, in small chunks and at once: the result and
// the progress must be the same however the stream is cut.
func TestStreamSuccess(t *testing.T) {
	for _, tc := range []struct {
		agent string
		chunk int // a chunk size between a byte and the whole stream
		want  Result
		prog  []Progress
		opts  []cmp.Option // how the result is compared
	}{
		{agent: "claude", chunk: 13, want: Result{Summary: "Created spending analysis: chart.png and summary.md in /task/output.", SessionID: "8f1c2a7e-3b4d-4e5f-9a6b-7c8d9e0f1a2b", CostUSD: 0.0421, Turns: 4, Usage: Usage{InputTokens: 1200, OutputTokens: 420, CacheReadTokens: 3000}, Done: true}, prog: []Progress{
			{Kind: ProgressInit, Text: "claude-sonnet-4-5-20250929"},
			{Kind: ProgressText, Text: "I'll start by looking at the context files."},
			{Kind: ProgressToolUse, Tool: "Bash", Input: `{"command":"ls -la /task/context","description":"List context files"}`},
			{Kind: ProgressToolResult, Tool: "Bash", Status: "ok", Text: "total 8 -rw-r--r-- 1 worker worker 2048 Jan 25 10:00 statement.csv"},
			{Kind: ProgressToolUse, Tool: "Write", Input: `{"file_path":"/task/output/summary.md","content":"Spending went up 12% in March."}`},
			{Kind: ProgressText, Text: "Done: chart and summary are in /task/output."},
			{Kind: ProgressResult, Text: "Created spending analysis: chart.png and summary.md in /task/output."},
		}},
		{agent: "codex", chunk: 13, want: Result{Summary: "Done: wrote output/result.txt.", SessionID: "01a202b1-3c95-78d3-913c-e8429169d20f", Turns: 1, Usage: Usage{InputTokens: 200, OutputTokens: 40}, Done: true}, prog: []Progress{
			{Kind: ProgressInit},
			{Kind: ProgressText, Text: "Writing the file."},
			{Kind: ProgressToolUse, Tool: "shell", Input: `{"command":"/bin/bash -lc \"mkdir -p output && python3 -c \\\"open('output/result.txt','w').write('42\\\\n')\\\"\""}`},
			{Kind: ProgressToolResult, Tool: "shell", Status: "ok"},
			{Kind: ProgressText, Text: "Done: wrote output/result.txt."},
			{Kind: ProgressResult, Text: "Done: wrote output/result.txt."},
		}},
		{agent: "gemini", chunk: 7, want: Result{Summary: "Done: wrote output/result.txt.", SessionID: "b0494c14-800c-4592-b4a4-bf1ed339d7ec", Turns: 1, Usage: Usage{InputTokens: 200, OutputTokens: 40}, Done: true}, prog: []Progress{
			{Kind: ProgressInit, Text: "gemini-2.5-pro"},
			{Kind: ProgressText, Text: "Writing the file."},
			{Kind: ProgressToolUse, Tool: "run_shell_command", Input: `{"command":"mkdir -p output && python3 -c \"open('output/result.txt','w').write('42\\n')\""}`},
			{Kind: ProgressToolResult, Tool: "run_shell_command", Status: "ok"},
			{Kind: ProgressText, Text: "Done: wrote output/result.txt."},
			{Kind: ProgressResult, Text: "Done: wrote output/result.txt."},
		}},
		{agent: "opencode", chunk: 11, want: Result{Summary: "Done: wrote output/result.txt.", SessionID: "ses_dfd4c05aeffeRheZGQbjbqnqKI", Turns: 1, CostUSD: 0.00065, Usage: Usage{InputTokens: 200, OutputTokens: 40}, Done: true}, prog: []Progress{
			{Kind: ProgressInit},
			{Kind: ProgressText, Text: "Writing the file."},
			{Kind: ProgressToolUse, Tool: "bash", Input: Truncate(`{"cmd":"`+opencodeCmdline+`","command":"`+opencodeCmdline+`"}`, MaxInputBytes)},
			{Kind: ProgressToolResult, Tool: "bash", Status: "ok", Text: "(no output)"},
			{Kind: ProgressText, Text: "Done: wrote output/result.txt."},
			{Kind: ProgressResult, Text: "Done: wrote output/result.txt."},
		}, opts: []cmp.Option{cmp.Comparer(func(a, b float64) bool { return a-b < 1e-12 && b-a < 1e-12 })}},
	} {
		t.Run(tc.agent, func(t *testing.T) {
			a, err := Lookup(tc.agent)
			if err != nil {
				t.Fatal(err)
			}
			stream := mustRead(t, "testdata/"+tc.agent+"_success.jsonl")
			for _, chunk := range []int{1, tc.chunk, len(stream)} {
				got, prog := feed(t, a, stream, chunk)
				if diff := cmp.Diff(tc.want, got, tc.opts...); diff != "" {
					t.Errorf("chunk %d: result (-want +got):\n%s", chunk, diff)
				}
				if diff := cmp.Diff(tc.prog, prog); diff != "" {
					t.Errorf("chunk %d: progress (-want +got):\n%s", chunk, diff)
				}
			}
		})
	}
}

// opencodeCmdline is the command of opencode's bash call in its
// transcript, as the call's input quotes it.
const opencodeCmdline = `mkdir -p output && python3 -c \"open('output/result.txt','w').write('42\\n')\"`

func TestClaudeStreamErrors(t *testing.T) {
	tests := []struct {
		file string
		want Result
	}{
		{"testdata/claude_error.jsonl", Result{
			Summary:   "Invalid API key · Please run /login",
			Error:     "claude: error: Invalid API key · Please run /login",
			SessionID: "aa11",
			Turns:     1,
			Done:      true,
		}},
		{"testdata/claude_errors_array.jsonl", Result{
			Error:     "claude: error_during_execution: No conversation found with session ID: d569; second line",
			SessionID: "bb22",
			Done:      true,
		}},
	}
	a, _ := Lookup("claude")
	for _, tt := range tests {
		got, _ := feed(t, a, mustRead(t, tt.file), 64)
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s: result (-want +got):\n%s", tt.file, diff)
		}
	}
}

func TestClaudeStreamCutShort(t *testing.T) {
	// Killed mid-run: no result line; the last assistant text stands in, and
	// an overlong line, a truncated last line and garbage are skipped.
	a, _ := Lookup("claude")
	stream := `{"type":"assistant","message":{"content":[{"type":"text","text":"working on it"}]}}` + "\n" +
		`{"type":"assistant","message":{"content":[{"type":"text","text":"` + strings.Repeat("x", maxLineBytes) + `"}]}}` + "\n" +
		`{"type":"assistant","message":{"content":[{"type":"text","text":"half`
	got, prog := feed(t, a, stream, 1<<16)
	want := Result{Summary: "working on it"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	if len(prog) != 1 {
		t.Errorf("%d progress items, want 1", len(prog))
	}
}

func TestClaudeToolInputIsBounded(t *testing.T) {
	a, _ := Lookup("claude")
	line := `{"type":"assistant","message":{"content":[{"type":"tool_use","name":"Write","input":{"content":"` + strings.Repeat("é", 1000) + `"}}]}}` + "\n"
	_, got := feed(t, a, line, 100)
	if len(got) != 1 || got[0].Tool != "Write" {
		t.Fatalf("progress = %+v", got)
	}
	if len(got[0].Input) > MaxInputBytes || !strings.HasSuffix(got[0].Input, "…") || !strings.HasPrefix(got[0].Input, `{"content":"éé`) {
		t.Errorf("input summary %q (%d bytes) not bounded to %d", got[0].Input, len(got[0].Input), MaxInputBytes)
	}
}

func TestTruncate(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"abcdefghij", 6, "abc…"},
		{"ééé", 5, "é…"},
		{"aééé", 6, "aé…"},
		{"aééé", 5, "a…"},
	}
	for _, tt := range tests {
		if got := Truncate(tt.in, tt.n); got != tt.want || len(got) > max(tt.n, len(tt.in)) {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
}

// TestSessionMCP: claude turns its shell off for the session's MCP server;
// every other agent refuses a session.
func TestSessionMCP(t *testing.T) {
	inv := Invocation{PromptPath: "/task/prompt.md", SessionMCP: "/tmp/corral-mcp-1.json"}
	p := mustPrepare(t, "claude", inv)
	args := strings.Join(p.Args, " ")
	if !strings.Contains(args, "--mcp-config /tmp/corral-mcp-1.json --strict-mcp-config --disallowedTools Bash") {
		t.Errorf("claude args %q: want the session's MCP config alone and Bash denied", args)
	}
	if !slices.Contains(p.Env, "MCP_CONNECTION_NONBLOCKING=0") {
		t.Errorf("claude env %q: want its MCP servers connected before its first request", p.Env)
	}
	for _, name := range []string{"gemini", "codex", "opencode", "command"} {
		a, _ := Lookup(name)
		if _, err := a.Prepare(Invocation{PromptPath: "/task/prompt.md", Command: []string{"true"}, SessionMCP: "x"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s with a session: %v, want refused", name, err)
		}
	}
}
