package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// hostile is a result whose every worker-chosen text tries to act on the
// terminal or forge a line of the output.
func hostile() service.Result {
	forged := "a.txt\nstatus:   success\x1b[H"
	return service.Result{
		Task: task.Task{
			ID:           "t_1",
			Status:       task.Failed,
			Summary:      "done \x1b]52;c;cm0gLXJmIH4K\x07 \u009b2J \x9b2J\nsecond line",
			ErrorMessage: "exit code 3: boom\x1b[2J\r",
			OutputFiles:  []task.OutputFile{{Name: forged, Size: 3, Type: "text/plain\x1b]0;title\x07"}},
			Changes:      &task.Changes{Added: []string{forged}, Commits: []task.Commit{{Hash: "abc\x1b[2J", Subject: "fix\nstatus:   success"}}},
		},
		Done:         true,
		FileContents: map[string]service.File{forged: {Path: forged, Content: "red \x1b[31m\u009b0m\r\nline\tcol\n"}},
	}
}

// rawControl returns the first character of s that a terminal would act
// on (newline and tab aside), or "" if there is none.
func rawControl(s string) string {
	if !utf8.ValidString(s) {
		return "invalid UTF-8"
	}
	for _, r := range s {
		if r != '\n' && r != '\t' && (r < 0x20 || (r >= 0x7f && r <= 0x9f)) {
			return string(r)
		}
	}
	return ""
}

func TestPrintResultEscapes(t *testing.T) {
	var buf bytes.Buffer
	if err := printResult(&buf, hostile()); err != nil {
		t.Fatal(err)
	}
	out := strings.ReplaceAll(buf.String(), "\r\n", "\n") // a CRLF in file content is kept
	if c := rawControl(out); c != "" {
		t.Errorf("result printed %q raw:\n%s", c, out)
	}
	var status int
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "status:") {
			status++
		}
	}
	if status != 1 {
		t.Errorf("%d status lines, want 1 (a file name forged one):\n%s", status, out)
	}
	for _, want := range []string{
		`"a.txt\nstatus:   success\x1b[H"`,
		`done \x1b]52;c;cm0gLXJmIH4K\x07 \u009b2J \x9b2J`,
		"\n  second line\n",
		`boom\x1b[2J\r`,
		"red \\x1b[31m\\u009b0m\nline\tcol",
		`  A "a.txt\nstatus:   success\x1b[H"`,
		`  commit abc\x1b[2J fix\nstatus:   success`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("result lacks %q:\n%s", want, out)
		}
	}
}

func TestPrintJSONEscapes(t *testing.T) {
	var buf bytes.Buffer
	if err := printJSON(&buf, hostile()); err != nil {
		t.Fatal(err)
	}
	if c := rawControl(buf.String()); c != "" {
		t.Errorf("--json printed %q raw:\n%s", c, buf.String())
	}
	var back service.Result
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	// The JSON is exact: only the byte that is not UTF-8 comes back as U+FFFD.
	want := "done \x1b]52;c;cm0gLXJmIH4K\x07 \u009b2J \ufffd2J\nsecond line"
	if back.Summary != want {
		t.Errorf("summary through --json = %q, want %q", back.Summary, want)
	}
}

func TestOneLine(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"a  b\n\tc", 10, "a b c"},
		{"ééééé", 3, "éé…"},
		{"\x1b[2J and more", 8, `\x1b[2J an…`},
		{"x\u0085\u009by", 10, `x \u009by`},
	} {
		if got := oneLine(c.in, c.n); got != c.want {
			t.Errorf("oneLine(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

// -o yaml escapes what a terminal acts on, bidi overrides among them
// (printable to YAML), and decodes to the exact text.
func TestPrintYAMLEscapes(t *testing.T) {
	res := hostile()
	res.Summary += " \u202eevil\u2066"
	var buf bytes.Buffer
	if err := printYAML(&buf, res); err != nil {
		t.Fatal(err)
	}
	if c := rawControl(buf.String()); c != "" || strings.ContainsAny(buf.String(), "\u202e\u2066") {
		t.Errorf("-o yaml printed %q raw:\n%s", c, buf.String())
	}
	var back map[string]any
	if err := yaml.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if want := "done \x1b]52;c;cm0gLXJmIH4K\x07 \u009b2J \ufffd2J\nsecond line \u202eevil\u2066"; back["summary"] != want {
		t.Errorf("summary through -o yaml = %q, want %q", back["summary"], want)
	}
	if files, _ := back["file_contents"].(map[string]any); len(files) != 1 || files["a.txt\nstatus:   success\x1b[H"] == nil {
		t.Errorf("file_contents through -o yaml: %v, want the forged name as the key", back["file_contents"])
	}
}
