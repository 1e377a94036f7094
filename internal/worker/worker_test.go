package worker

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/agent"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

const testPrompt = "Analyse the statement in /task/context.\n"

// MustTaskDir returns a task directory with a prompt.md and an empty
// output/ directory.
func MustTaskDir(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "prompt.md"), []byte(testPrompt), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "output"), 0o755); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// shOptions are Options for running script with sh -c in dir.
func shOptions(dir, script string) Options {
	return Options{
		Args: workerproto.Args{TaskID: "task-1", TaskDir: dir, Command: []string{"sh", "-c", script}, Grace: 2 * time.Second},
		Env:  os.Environ(),
	}
}

// MustRun runs opts and returns the exit code and the status.json it wrote.
func MustRun(tb testing.TB, opts Options) (int, workerproto.Status) {
	tb.Helper()
	code := Run(tb.Context(), opts, nil)
	return code, mustReadStatus(tb, opts.TaskDir)
}

func mustReadStatus(tb testing.TB, dir string) workerproto.Status {
	tb.Helper()
	root, err := os.OpenRoot(dir)
	if err != nil {
		tb.Fatal(err)
	}
	defer root.Close()
	st, err := workerproto.ReadStatus(root, 1<<20)
	if err != nil {
		tb.Fatalf("ReadStatus: %v", err)
	}
	return st
}

func mustReadFile(tb testing.TB, name string) string {
	tb.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

func TestRunCommandSuccess(t *testing.T) {
	dir := MustTaskDir(t)
	script := `
cat > output/prompt-copy.txt
mkdir -p output/sub/deep
printf 'a,b\n1,2\n' > output/sub/deep/data.csv
printf '\211PNG\r\n\032\n0000IHDR' > output/chart.png
printf 'hello world' > output/noext
ln -s /etc/passwd output/escape-link
ln -s ../prompt.md output/inside-link
ln -s sub output/dir-link
echo "working"
echo
echo "done: 3 files"
echo "a warning" >&2
`
	before := time.Now().UTC().Truncate(time.Second)
	code, st := MustRun(t, shOptions(dir, script))
	after := time.Now().UTC()
	if code != 0 {
		t.Fatalf("exit code %d, status %+v", code, st)
	}
	want := workerproto.Status{
		Status:   "success",
		ExitCode: 0,
		OutputFiles: []workerproto.OutputFile{
			{Name: "chart.png", Size: 16, Type: "image/png"},
			{Name: "noext", Size: 11, Type: "text/plain"},
			{Name: "prompt-copy.txt", Size: int64(len(testPrompt)), Type: "text/plain"},
			{Name: "sub/deep/data.csv", Size: 8, Type: "text/csv"},
		},
		Summary: "working\ndone: 3 files",
	}
	got := st
	got.StartedAt, got.CompletedAt, got.DurationSeconds, got.DurationMS = time.Time{}, time.Time{}, 0, 0
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("status (-want +got):\n%s", diff)
	}
	if st.StartedAt.Before(before) || st.CompletedAt.After(after) || st.CompletedAt.Before(st.StartedAt) {
		t.Errorf("times %s .. %s outside the run %s .. %s", st.StartedAt, st.CompletedAt, before, after)
	}
	if st.DurationMS <= 0 || st.DurationMS > after.Sub(before).Milliseconds()+1 || st.DurationSeconds != (st.DurationMS+500)/1000 {
		t.Errorf("duration_seconds = %v, duration_ms = %v", st.DurationSeconds, st.DurationMS)
	}
	if got := mustReadFile(t, filepath.Join(dir, "output", "prompt-copy.txt")); got != testPrompt {
		t.Errorf("agent's stdin was %q, want the prompt", got)
	}
	if got := mustReadFile(t, filepath.Join(dir, "logs", "stdout.log")); got != "working\n\ndone: 3 files\n" {
		t.Errorf("stdout.log = %q", got)
	}
	if got := mustReadFile(t, filepath.Join(dir, "logs", "stderr.log")); got != "a warning\n" {
		t.Errorf("stderr.log = %q", got)
	}

	// The file itself is in the SPEC's format.
	raw := mustReadFile(t, filepath.Join(dir, "status.json"))
	var m map[string]any
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	wantKeys := []string{"completed_at", "duration_ms", "duration_seconds", "error_message", "exit_code", "logs_truncated", "output_files", "started_at", "status", "summary"}
	if diff := cmp.Diff(wantKeys, keys, cmp.Transformer("sort", func(s []string) []string {
		s = append([]string(nil), s...)
		sort.Strings(s)
		return s
	})); diff != "" {
		t.Errorf("status.json keys (-want +got):\n%s", diff)
	}
	if m["error_message"] != nil {
		t.Errorf("error_message = %v, want null", m["error_message"])
	}
	rfc3339 := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`)
	for _, k := range []string{"started_at", "completed_at"} {
		if s, _ := m[k].(string); !rfc3339.MatchString(s) {
			t.Errorf("%s = %v, want RFC 3339 UTC to the second", k, m[k])
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "logs", "agent.jsonl")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the command agent wrote agent.jsonl: %v", err)
	}
}

func TestRunSummaryFile(t *testing.T) {
	dir := MustTaskDir(t)
	code, st := MustRun(t, shOptions(dir, `printf '\n# Result\nSpending went up.\n\n' > output/summary.md; echo noise`))
	if code != 0 || st.Summary != "# Result\nSpending went up." {
		t.Errorf("exit %d, summary %q, want summary.md's content", code, st.Summary)
	}
}

func TestRunCommandFailure(t *testing.T) {
	dir := MustTaskDir(t)
	code, st := MustRun(t, shOptions(dir, `echo partial > output/part.txt; echo starting; echo "Traceback (most recent call last):" >&2; echo "ValueError: bad input" >&2; exit 3`))
	if code != 3 || st.ExitCode != 3 || st.Status != "failed" {
		t.Fatalf("exit %d, status %+v, want 3 and failed", code, st)
	}
	if want := "exit code 3: Traceback (most recent call last): | ValueError: bad input"; st.ErrorMessage != want {
		t.Errorf("error_message = %q, want %q", st.ErrorMessage, want)
	}
	if len(st.OutputFiles) != 1 || st.OutputFiles[0].Name != "part.txt" {
		t.Errorf("output files of a failed run = %+v, want part.txt", st.OutputFiles)
	}
}

func TestRunFailureKeepsStderrTail(t *testing.T) {
	dir := MustTaskDir(t)
	code, st := MustRun(t, shOptions(dir, `i=0; while [ $i -lt 200 ]; do echo "noise line $i" >&2; i=$((i+1)); done; echo "fatal: the real reason" >&2; exit 1`))
	if code != 1 {
		t.Fatalf("exit %d", code)
	}
	if !strings.HasPrefix(st.ErrorMessage, "exit code 1: …") || !strings.HasSuffix(st.ErrorMessage, "fatal: the real reason") {
		t.Errorf("error_message = %q, want the end of stderr", st.ErrorMessage)
	}
	if n := len(st.ErrorMessage); n > stderrTailBytes+len("exit code 1: …") {
		t.Errorf("error_message is %d bytes, over the bound", n)
	}
	if strings.Contains(st.ErrorMessage, "\n") {
		t.Errorf("error_message has newlines: %q", st.ErrorMessage)
	}
}

func TestRunLogTruncation(t *testing.T) {
	dir := MustTaskDir(t)
	opts := shOptions(dir, `i=0; while [ $i -lt 500 ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); done; echo "the end"`)
	opts.MaxLogBytes = 1000
	code, st := MustRun(t, opts)
	if code != 0 || !st.LogsTruncated {
		t.Fatalf("exit %d, logs_truncated %v, want 0 and true", code, st.LogsTruncated)
	}
	for _, name := range []string{"stdout.log", "stderr.log"} {
		got := mustReadFile(t, filepath.Join(dir, "logs", name))
		if len(got) != 1000 {
			t.Errorf("%s is %d bytes, want 1000", name, len(got))
		}
		if !strings.HasPrefix(got, "out 0\n") && !strings.HasPrefix(got, "err 0\n") {
			t.Errorf("%s does not keep the beginning: %.20q", name, got)
		}
	}
	// The summary still sees the whole stream.
	if !strings.HasSuffix(st.Summary, "out 499\nthe end") {
		t.Errorf("summary = %q, want the end of stdout", st.Summary)
	}

	dir = MustTaskDir(t)
	opts = shOptions(dir, `echo short`)
	opts.MaxLogBytes = 1000
	if _, st := MustRun(t, opts); st.LogsTruncated {
		t.Error("logs_truncated set for a short log")
	}
}

func TestRunMissingBinary(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // nothing to find
	dir := MustTaskDir(t)
	opts := Options{Args: workerproto.Args{TaskID: "task-1", TaskDir: dir, Agent: "claude"}, Env: os.Environ()}
	code, st := MustRun(t, opts)
	want := `agent binary "claude" not found in the sandbox (install: npm install -g @anthropic-ai/claude-code)`
	if code != ExitNotFound || st.ExitCode != ExitNotFound || st.Status != "failed" || st.ErrorMessage != want {
		t.Errorf("exit %d, status %+v; want %d, failed, %q", code, st, ExitNotFound, want)
	}
}

func TestRunCommandNotRunnable(t *testing.T) {
	dir := MustTaskDir(t)
	if err := os.WriteFile(filepath.Join(dir, "script.sh"), []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		argv []string
		code int
		msg  string
	}{
		{[]string{"./missing.sh"}, ExitNotFound, `agent binary "./missing.sh" not found in the sandbox`},
		{[]string{"./script.sh"}, ExitCannotExecute, `agent binary "./script.sh" cannot be executed`},
	}
	for _, tt := range tests {
		opts := Options{Args: workerproto.Args{TaskID: "task-1", TaskDir: dir, Command: tt.argv}, Env: os.Environ()}
		code, st := MustRun(t, opts)
		if code != tt.code || !strings.HasPrefix(st.ErrorMessage, tt.msg) {
			t.Errorf("%q: exit %d, error %q; want %d, %q", tt.argv, code, st.ErrorMessage, tt.code, tt.msg)
		}
	}
}

func TestRunAgentEnvHasNoCorralVariables(t *testing.T) {
	dir := MustTaskDir(t)
	opts := shOptions(dir, `env > output/env.txt`)
	opts.Env = append(opts.Env, "CORRAL_WEBHOOK_KEY=00112233445566778899aabbccddeeff", "CORRAL_API_TOKEN=t", "ANTHROPIC_API_KEY=sk-test")
	if code, _ := MustRun(t, opts); code != 0 {
		t.Fatalf("exit %d", code)
	}
	env := mustReadFile(t, filepath.Join(dir, "output", "env.txt"))
	if strings.Contains(env, "CORRAL_") {
		t.Errorf("agent saw CORRAL_ variables:\n%s", env)
	}
	if !strings.Contains(env, "ANTHROPIC_API_KEY=sk-test") {
		t.Errorf("agent lost ANTHROPIC_API_KEY:\n%s", env)
	}
}

func TestRunClaudeStream(t *testing.T) {
	// A stand-in claude that checks its arguments and prints a stream.
	dir := MustTaskDir(t)
	bin := filepath.Join(t.TempDir(), "claude")
	script := `#!/bin/sh
[ "$*" = "-p --output-format stream-json --verbose --dangerously-skip-permissions --model opus" ] || { echo "bad args: $*" >&2; exit 9; }
cat > /dev/null
echo '{"type":"system","subtype":"init","session_id":"s1","model":"opus"}'
echo '{"type":"assistant","message":{"content":[{"type":"tool_use","name":"Write","input":{"file_path":"/task/output/a.txt"}}]}}'
echo hi > output/a.txt
echo '{"type":"result","subtype":"success","is_error":false,"result":"Wrote a.txt.","session_id":"s1"}'
`
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	var tools []string
	opts := Options{Args: workerproto.Args{TaskID: "task-1", TaskDir: dir, Agent: "claude", Binary: bin, Model: "opus"}, Env: os.Environ()}
	opts.OnProgress = func(p agent.Progress) { tools = append(tools, p.Kind+":"+p.Tool) }
	code, st := MustRun(t, opts)
	if code != 0 || st.Status != "success" || st.Summary != "Wrote a.txt." {
		t.Fatalf("exit %d, status %+v", code, st)
	}
	if diff := cmp.Diff([]string{"init:", "tool_use:Write", "result:"}, tools); diff != "" {
		t.Errorf("progress (-want +got):\n%s", diff)
	}
	if got := mustReadFile(t, filepath.Join(dir, "logs", "agent.jsonl")); strings.Count(got, "\n") != 3 {
		t.Errorf("agent.jsonl = %q, want the 3 lines", got)
	}
}

func TestRunClaudeReportedError(t *testing.T) {
	// Claude Code can print an is_error result and still exit 0.
	dir := MustTaskDir(t)
	bin := filepath.Join(t.TempDir(), "claude")
	script := "#!/bin/sh\necho '{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":true,\"result\":\"Invalid API key · Please run /login\"}'\necho 'some stderr' >&2\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	opts := Options{Args: workerproto.Args{TaskID: "task-1", TaskDir: dir, Agent: "claude", Binary: bin}, Env: os.Environ()}
	// The worker then exits 1 (ExitSetup): 0 is a success's alone; the
	// agent's own 0 stays in status.json.
	code, st := MustRun(t, opts)
	if code != ExitSetup || st.ExitCode != 0 || st.Status != "failed" || st.ErrorMessage != "claude: error: Invalid API key · Please run /login" {
		t.Errorf("exit %d, status %q, error %q", code, st.Status, st.ErrorMessage)
	}
}

func TestRunStopKillsAfterGrace(t *testing.T) {
	// An agent that ignores SIGTERM (and so do its children) is killed
	// after the grace period.
	dir := MustTaskDir(t)
	opts := shOptions(dir, `trap '' TERM; sleep 100 & echo $! > bg.pid; echo started > started; wait`)
	opts.Grace = 300 * time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		waitForFile(t, filepath.Join(dir, "started"))
		cancel()
	}()
	start := time.Now()
	code := Run(ctx, opts, nil)
	elapsed := time.Since(start)
	if code != 128+9 {
		t.Errorf("exit code %d, want 137 (SIGKILL)", code)
	}
	if elapsed < opts.Grace {
		t.Errorf("killed after %s, before the grace period", elapsed)
	}
	st := mustReadStatus(t, dir)
	if st.Status != "failed" || !strings.HasPrefix(st.ErrorMessage, "stopped before the agent finished: exit code 137 (signal: killed)") {
		t.Errorf("status %q, error %q", st.Status, st.ErrorMessage)
	}
	mustBeDead(t, readPid(t, filepath.Join(dir, "bg.pid")))
}

func TestReadStatusRejects(t *testing.T) {
	dir := t.TempDir()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	write := func(s string) {
		os.Remove(filepath.Join(dir, workerproto.StatusFile))
		if err := os.WriteFile(filepath.Join(dir, workerproto.StatusFile), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := workerproto.ReadStatus(root, 1024); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing: err = %v, want ErrNotFound", err)
	}
	write(`{"status":"success","summary":"` + strings.Repeat("x", 2000) + `"}`)
	if _, err := workerproto.ReadStatus(root, 1024); !errors.Is(err, workspace.ErrTooLarge) {
		t.Errorf("too large: err = %v, want ErrTooLarge", err)
	}
	write(`{"status":"running"}`)
	if _, err := workerproto.ReadStatus(root, 1024); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad status: err = %v, want ErrInvalidArgument", err)
	}
	write(`not json`)
	if _, err := workerproto.ReadStatus(root, 1024); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("not json: err = %v, want ErrInvalidArgument", err)
	}
	// A worker may not point the server at another file.
	os.WriteFile(filepath.Join(dir, "other.json"), []byte(`{"status":"success"}`), 0o644)
	os.Remove(filepath.Join(dir, workerproto.StatusFile))
	if err := os.Symlink("other.json", filepath.Join(dir, workerproto.StatusFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := workerproto.ReadStatus(root, 1024); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("symlink: err = %v, want ErrPermissionDenied", err)
	}
	write(`{"status":"failed","started_at":"2025-01-25T10:00:00Z","completed_at":"2025-01-25T10:02:25Z","duration_seconds":145,"exit_code":2,"output_files":[{"name":"a.png","size":3,"type":"image/png"}],"summary":"s","error_message":"boom","logs_truncated":true}`)
	got, err := workerproto.ReadStatus(root, 1024)
	if err != nil {
		t.Fatal(err)
	}
	want := workerproto.Status{Status: "failed", StartedAt: time.Date(2025, 1, 25, 10, 0, 0, 0, time.UTC), CompletedAt: time.Date(2025, 1, 25, 10, 2, 25, 0, time.UTC),
		DurationSeconds: 145, DurationMS: 145000, ExitCode: 2, OutputFiles: []workerproto.OutputFile{{Name: "a.png", Size: 3, Type: "image/png"}}, Summary: "s", ErrorMessage: "boom", LogsTruncated: true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("status (-want +got):\n%s", diff)
	}
	// As SPEC §6 writes it, and as workers before 2026-11-29 did: a
	// fraction of a second, no duration_ms.
	for in, want := range map[string][2]int64{`"duration_seconds":145,"duration_ms":145210`: {145, 145210}, `"duration_seconds":2.5`: {3, 2500}} {
		write(`{"status":"success","started_at":"2025-01-25T10:00:00Z","completed_at":"2025-01-25T10:02:25Z",` + in + `,"exit_code":0,"output_files":[],"summary":"","error_message":null,"logs_truncated":false}`)
		got, err := workerproto.ReadStatus(root, 1024)
		if err != nil || got.DurationSeconds != want[0] || got.DurationMS != want[1] {
			t.Errorf("%s: read %d s, %d ms, %v; want %v", in, got.DurationSeconds, got.DurationMS, err, want)
		}
	}
	if b, _ := json.Marshal(workerproto.Status{Status: "success", DurationSeconds: 145, DurationMS: 145210}); !strings.Contains(string(b), `"duration_seconds":145,"duration_ms":145210,`) {
		t.Errorf("status.json as written: %s", b)
	}
}

func TestParseArgs(t *testing.T) {
	env := []string{"PATH=/usr/bin", "CORRAL_WEBHOOK_KEY=00112233445566778899aabbccddeeff"}
	got, err := ParseArgs([]string{"--prompt", "/task/prompt.md", "--task-id", "t1", "--webhook", "unix:///run/corral.sock", "--grace", "3s", "--", "python3", "-c", "print(1)"}, env)
	if err != nil {
		t.Fatal(err)
	}
	want := Options{
		Args: workerproto.Args{
			TaskID: "t1", TaskDir: "/task", PromptPath: "/task/prompt.md", Agent: "command",
			Command: []string{"python3", "-c", "print(1)"}, WebhookURL: "unix:///run/corral.sock",
			Source: "local", MaxLogBytes: workerproto.DefaultMaxLogBytes, Grace: 3 * time.Second,
			EgressListen: workerproto.DefaultEgressListen,
		},
		WebhookKey: []byte{0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff},
		Env:        env,
	}
	if diff := cmp.Diff(want, got, cmp.FilterPath(func(p cmp.Path) bool {
		s := p.String()
		return s == "OnProgress" || s == "Now" || s == "Webhook"
	}, cmp.Ignore())); diff != "" {
		t.Errorf("Options (-want +got):\n%s", diff)
	}

	got, err = ParseArgs([]string{"--task-id", "t1", "--agent", "claude", "--model", "opus"}, nil)
	if err != nil || got.Agent != "claude" || got.Model != "opus" || len(got.Command) != 0 {
		t.Errorf("claude: %+v, %v", got, err)
	}

	_, err = ParseArgs([]string{"--agent", "gpt", "--webhook", "http://x", "--grace", "-1s"}, []string{"CORRAL_WEBHOOK_KEY=zz"})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("err = %v, want ErrInvalidArgument", err)
	}
	for _, field := range []string{"--task-id", "--agent", "--grace", "CORRAL_WEBHOOK_KEY"} {
		if !strings.Contains(err.Error(), field+": ") {
			t.Errorf("error %q does not name %s", err, field)
		}
	}
	if _, err := ParseArgs([]string{"--task-id", "t1", "--agent", "command"}, nil); err == nil || !strings.Contains(err.Error(), "argv after --") {
		t.Errorf("command without argv: err = %v", err)
	}
	if _, err := ParseArgs([]string{"--task-id", "t1", "--webhook", "http://x"}, nil); err == nil || !strings.Contains(err.Error(), "required with --webhook") {
		t.Errorf("webhook without key: err = %v", err)
	}
	if _, err := ParseArgs([]string{"--bogus"}, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("unknown flag: err = %v", err)
	}
}

// The worker exits 0 for a success alone, so the sandbox's exit tells the
// server how a run ended when status.json could not be written.
func TestWorkerExitZeroOnlyForSuccess(t *testing.T) {
	for _, tc := range []struct {
		status string
		code   int
		want   int
	}{
		{"success", 0, 0},
		{"failed", 3, 3},
		{"failed", 0, ExitSetup}, // an agent that exited 0 with an error result
		{"failed", 137, 137},
	} {
		if got := workerExit(workerproto.Status{Status: tc.status, ExitCode: tc.code}); got != tc.want {
			t.Errorf("%s with code %d: exits %d, want %d", tc.status, tc.code, got, tc.want)
		}
	}
}
