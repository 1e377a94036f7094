package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestGeminiPrepare(t *testing.T) {
	got := mustPrepare(t, "gemini", Invocation{PromptPath: "/task/prompt.md", Model: "gemini-2.5-pro", ExtraArgs: []string{"--debug"}, Env: []string{"GEMINI_API_KEY=k"}})
	if got.Args[0] != "/bin/sh" || got.Args[1] != "-c" {
		t.Fatalf("args %q: want a /bin/sh -c setup", got.Args)
	}
	cli := got.Args[6:]
	want := []string{"gemini", "-p", "", "--output-format", "stream-json", "--approval-mode", "yolo", "--model", "gemini-2.5-pro", "--debug"}
	if diff := cmp.Diff(want, cli); diff != "" {
		t.Errorf("CLI argv (-want +got):\n%s", diff)
	}
	if got.StdinPath != "/task/prompt.md" || got.Transcript != "agent.jsonl" || got.InstallHint != "npm install -g @google/gemini-cli" {
		t.Errorf("process %+v", got)
	}
	if diff := cmp.Diff([]string{"GEMINI_API_KEY=k"}, got.Env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	env := strings.Join(got.DefaultEnv, "\n")
	for _, kv := range []string{"GEMINI_SANDBOX=false", "GEMINI_CLI_TRUST_WORKSPACE=true", "GEMINI_CLI_NO_RELAUNCH=true"} {
		if !strings.Contains(env, kv) {
			t.Errorf("default env lacks %s:\n%s", kv, env)
		}
	}

	b := mustPrepare(t, "gemini", Invocation{Binary: "/opt/gemini"})
	if b.Args[6] != "/opt/gemini" || b.Stdin != "" || len(b.Args) != 13 {
		t.Errorf("with a binary and no model: %q", b.Args)
	}
}

// TestGeminiSetupScript runs the setup shell for real with a stand-in CLI:
// it writes settings.json (API-key auth only with GEMINI_API_KEY), keeps an
// existing one, and execs the CLI with its argv intact.
func TestGeminiSetupScript(t *testing.T) {
	if _, err := exec.LookPath("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	p := mustPrepare(t, "gemini", Invocation{Binary: "/bin/echo", Model: "m x"})
	run := func(home string, env ...string) string {
		t.Helper()
		cmd := exec.Command(p.Args[0], p.Args[1:]...)
		cmd.Env = append([]string{"HOME=" + home, "PATH=/usr/bin:/bin"}, env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("setup: %v\n%s", err, out)
		}
		return string(out)
	}
	home := t.TempDir()
	out := run(home, "GEMINI_API_KEY=k")
	if want := "-p  --output-format stream-json --approval-mode yolo --model m x\n"; out != want {
		t.Errorf("the CLI got %q, want %q", out, want)
	}
	settings := filepath.Join(home, ".gemini", "settings.json")
	b, err := os.ReadFile(settings)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"selectedType":"gemini-api-key"`) || !strings.Contains(string(b), `"usageStatisticsEnabled":false`) {
		t.Errorf("settings.json with a key: %s", b)
	}

	vertex := t.TempDir()
	run(vertex, "GEMINI_API_KEY=k", "GOOGLE_GENAI_USE_VERTEXAI=true")
	b, _ = os.ReadFile(filepath.Join(vertex, ".gemini", "settings.json"))
	if strings.Contains(string(b), "selectedType") || !strings.Contains(string(b), `"enableAutoUpdate":false`) {
		t.Errorf("settings.json for vertex: %s", b)
	}

	if err := os.WriteFile(settings, []byte(`{"mine":true}`), 0o644); err != nil {
		t.Fatal(err)
	}
	run(home, "GEMINI_API_KEY=k")
	if b, _ := os.ReadFile(settings); string(b) != `{"mine":true}` {
		t.Errorf("an existing settings.json was replaced: %s", b)
	}
}

func TestGeminiStreamErrors(t *testing.T) {
	got := parseAll(geminiAdapter{}, mustRead(t, "testdata/gemini_401.jsonl"))
	want := "gemini: the model endpoint refused the API key (HTTP 401; check GEMINI_API_KEY in agents.gemini.env): UNAUTHENTICATED API key not valid. Please pass a valid API key."
	if got.Error != want || !got.Done || got.Summary != "" {
		t.Errorf("401: %+v\nwant error %q", got, want)
	}

	got = parseAll(geminiAdapter{}, mustRead(t, "testdata/gemini_429.jsonl"))
	want = "gemini: the model endpoint is rate limiting (HTTP 429; retries exhausted): [API Error: scripted 429] Please wait and try again later. To increase your limits, request a quota increase through AI Studio, or switch to another /auth method"
	if got.Error != want || !got.Done {
		t.Errorf("429 after retries: %+v\nwant error %q", got, want)
	}
	got = parseAll(geminiAdapter{}, mustRead(t, "testdata/gemini_500.jsonl"))
	want = "gemini: the model endpoint failed with a server error (HTTP 500; retries exhausted): INTERNAL scripted 500"
	if got.Error != want || !got.Done {
		t.Errorf("500 after retries: %+v\nwant error %q", got, want)
	}

	for _, tc := range []struct{ stream, want string }{
		{`{"type":"result","status":"error","error":{"type":"unknown","message":"[API Error: {\"error\":{\"code\":429,\"message\":\"Resource has been exhausted.\",\"status\":\"RESOURCE_EXHAUSTED\"}}]"}}`,
			"gemini: the model endpoint is rate limiting (HTTP 429; retries exhausted): RESOURCE_EXHAUSTED Resource has been exhausted."},
		{`{"type":"result","status":"error","error":{"type":"unknown","message":"[API Error: {\"error\":{\"code\":503,\"message\":\"overloaded\",\"status\":\"UNAVAILABLE\"}}]"}}`,
			"gemini: the model endpoint failed with a server error (HTTP 503; retries exhausted): UNAVAILABLE overloaded"},
		{`{"type":"result","status":"error","error":{"type":"FatalTurnLimitedError","message":"Reached max session turns"}}`,
			"gemini: Reached max session turns"},
		{`{"type":"result","status":"error"}`, "gemini: run failed (status error)"},
		// No result: the last error line says why.
		{`{"type":"error","severity":"warning","message":"loop detected"}` + "\n" + `{"type":"error","severity":"error","message":"tool registry\nfailed"}`,
			"gemini: tool registry failed"},
	} {
		if got := parseAll(geminiAdapter{}, tc.stream); got.Error != tc.want {
			t.Errorf("%s:\nerror %q\nwant  %q", tc.stream, got.Error, tc.want)
		}
	}

	// Killed mid-answer: the text so far is the summary, and no error is
	// made up (the exit status says what happened).
	got = parseAll(geminiAdapter{}, `{"type":"message","role":"assistant","content":"Half","delta":true}`+"\n"+`{"type":"message","role":"assistant","content":" done","delta":true}`)
	if got.Summary != "Half done" || got.Done || got.Error != "" {
		t.Errorf("cut short: %+v", got)
	}
}

// parseAll runs a whole stream through a's parser.
func parseAll(a Adapter, stream string) Result {
	p := a.NewParser(nil)
	p.Write([]byte(stream))
	return p.Result()
}
