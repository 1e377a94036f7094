//go:build integration

package e2e_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/testenv"
)

// hostileScript is a worker that puts terminal escapes everywhere the CLI
// shows: its transcript and progress (stdout), its summary, an output
// file's content, an output file's name (with a newline that would forge
// a "status:" line), and its error message (stderr, then exit 3). The
// escapes clear the screen, set the window title, write the clipboard
// (OSC 52), move the cursor, and use the C1 CSI.
const hostileScript = `printf 'progress \033[2J\033]0;pwned\007 \302\2332J\n'
printf 'summary \033]52;c;cm0gLXJmIH4K\007 \302\2332J\n' > output/summary.md
printf 'red \033[31m \302\2330m\n' > output/notes.txt
printf x > "output/$(printf 'a.txt\nstatus:   success\033[H')"
printf 'boom \033[2J\n' >&2
exit 3`

// forgedName is the output file name hostileScript makes.
const forgedName = "a.txt\nstatus:   success\x1b[H"

// TestCLIEscapesWorkerText runs a real worker that writes terminal escapes
// and reads its task with the real CLI, through a pipe: run --follow,
// result, logs and result --json must print no character a terminal would
// act on, and the forged name no second status line.
func TestCLIEscapesWorkerText(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)

	stdout, stderr, err := s.cli(t, nil, "run", "--server", s.url, "--follow", "a hostile worker", "--", "sh", "-c", hostileScript)
	if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("corral run --follow: %v (want exit 3: the task's own exit code)\n%s", err, stderr)
	}
	m := regexp.MustCompile(`task (\S+) queued`).FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("corral run --follow printed no task id:\n%s", stderr)
	}
	id := m[1]
	noRawControl(t, "run --follow (result)", stdout)
	noRawControl(t, "run --follow (progress)", stderr)
	if !strings.Contains(stderr, "pwned") {
		t.Errorf("run --follow showed no progress text:\n%s", stderr)
	}

	res := s.runCLI(t, "result", "--server", s.url, id, "--file", "notes.txt", "--file", forgedName)
	noRawControl(t, "result", res)
	if n := len(regexp.MustCompile(`(?m)^status:`).FindAllString(res, -1)); n != 1 {
		t.Errorf("result has %d status lines, want 1:\n%s", n, res)
	}
	for _, want := range []string{
		`"a.txt\nstatus:   success\x1b[H"`,
		`summary \x1b]52;c;cm0gLXJmIH4K\x07 \u009b2J`,
		`red \x1b[31m \u009b0m`,
		`boom \x1b[2J`,
	} {
		if !strings.Contains(res, want) {
			t.Errorf("result lacks %s:\n%s", want, res)
		}
	}

	logs := s.runCLI(t, "logs", "--server", s.url, id)
	noRawControl(t, "logs", logs)
	if want := `progress \x1b[2J\x1b]0;pwned\x07 \u009b2J`; !strings.Contains(logs, want) {
		t.Errorf("logs lack %s:\n%s", want, logs)
	}
	logs = s.runCLI(t, "logs", "--server", s.url, "--stream", "stderr", id)
	noRawControl(t, "logs --stream stderr", logs)
	if want := `boom \x1b[2J`; !strings.Contains(logs, want) {
		t.Errorf("stderr logs lack %s:\n%s", want, logs)
	}

	// --json escapes, in JSON's own notation: the values are exact.
	out := s.runCLI(t, "result", "--server", s.url, "--json", id)
	noRawControl(t, "result --json", out)
	var r service.Result
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("result --json: %v\n%s", err, out)
	}
	if want := "summary \x1b]52;c;cm0gLXJmIH4K\x07 \u009b2J"; r.Summary != want {
		t.Errorf("result --json summary %q, want %q", r.Summary, want)
	}
	found := false
	for _, f := range r.OutputFiles {
		found = found || f.Name == forgedName
	}
	if !found {
		t.Errorf("result --json output files %+v lack %q", r.OutputFiles, forgedName)
	}
}

// TestCLICatExactUnlessTerminal: ws cat writes a file's exact bytes to a
// pipe, and shows its escapes escaped on a terminal.
func TestCLICatExactUnlessTerminal(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	const content = "exact \x1b[2J \u009b bytes\n"
	s.mustWriteWorkspace(t, "esc.txt", []byte(content))
	if out := s.runCLI(t, "ws", "cat", "--server", s.url, "esc.txt"); out != content {
		t.Errorf("ws cat to a pipe: %q, want the exact %q", out, content)
	}

	pty, tty := testenv.OpenPTY(t)
	if _, stderr, err := s.cli(t, tty, "ws", "cat", "--server", s.url, "esc.txt"); err != nil {
		t.Fatalf("ws cat to a terminal: %v\n%s", err, stderr)
	}
	tty.Close()
	got, _ := io.ReadAll(pty) // ends in EIO once the terminal side is closed
	if want := `exact \x1b[2J \u009b bytes`; !strings.Contains(string(got), want) || bytes.ContainsAny(got, "\x1b\u009b") {
		t.Errorf("ws cat to a terminal: %q, want %s and no escape", got, want)
	}
}

// cli runs the corral binary against s, with stdout to tty if not nil, and
// returns its output and exit error.
func (s *server) cli(t *testing.T, tty *os.File, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command(corralBin, args...)
	cmd.Env = append(os.Environ(), "CORRAL_API_TOKEN="+s.app.Token())
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if tty != nil {
		cmd.Stdout = tty
	}
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// noRawControl fails t if out holds a character a terminal acts on: a
// control character other than newline and tab, a C1 control, or bytes
// that are not UTF-8.
func noRawControl(t *testing.T, what, out string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Errorf("%s printed bytes that are not UTF-8: %q", what, out)
		return
	}
	for i, r := range out {
		if r != '\n' && r != '\t' && (r < 0x20 || (r >= 0x7f && r <= 0x9f)) {
			t.Errorf("%s printed %q raw at byte %d: %q", what, r, i, out)
			return
		}
	}
}
