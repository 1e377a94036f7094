package termsafe

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/testenv"
)

func TestLineAndText(t *testing.T) {
	for _, c := range []struct {
		name, in, line, text string
	}{
		{"plain", "report ready: 3 rows", "report ready: 3 rows", "report ready: 3 rows"},
		{"unicode kept", "café 日本 ✓ \ufffd", "café 日本 ✓ \ufffd", "café 日本 ✓ \ufffd"},
		{"clear screen (ESC, CSI)", "a\x1b[2J\x1b[Hb", `a\x1b[2J\x1b[Hb`, `a\x1b[2J\x1b[Hb`},
		{"OSC 52 clipboard write ended by BEL", "\x1b]52;c;cm0gLXJmIH4K\x07", `\x1b]52;c;cm0gLXJmIH4K\x07`, `\x1b]52;c;cm0gLXJmIH4K\x07`},
		{"window title ended by ST", "\x1b]0;pwned\x1b\\", `\x1b]0;pwned\x1b\`, `\x1b]0;pwned\x1b\`},
		{"C1 CSI as UTF-8", "x\u009b31mred", `x\u009b31mred`, `x\u009b31mred`},
		{"C1 CSI as a raw byte", "x\x9b31mred", `x\x9b31mred`, `x\x9b31mred`},
		{"C1 OSC and NEL", "\u009d0;t\u009c\u0085", `\u009d0;t\u009c\u0085`, `\u009d0;t\u009c\u0085`},
		{"carriage return overwrites the line", "ok\rFAILED", `ok\rFAILED`, `ok\rFAILED`},
		{"CRLF line ending", "a\r\nb\r\n", `a\r\nb\r\n`, "a\r\nb\r\n"},
		{"backspace and DEL", "passed\b\b\b\b\b\bfailed\x7f", `passed\x08\x08\x08\x08\x08\x08failed\x7f`, `passed\x08\x08\x08\x08\x08\x08failed\x7f`},
		{"newline and tab", "name\nstatus:   success\tx", `name\nstatus:   success\tx`, "name\nstatus:   success\tx"},
		{"NUL", "a\x00b", `a\x00b`, `a\x00b`},
		{"invalid UTF-8", "a\xff\xc3(b\xe2\x82", `a\xff\xc3(b\xe2\x82`, `a\xff\xc3(b\xe2\x82`},
		{"overlong ESC", "\xc0\x9b", `\xc0\x9b`, `\xc0\x9b`},
		{"bidi override and line separator", "txt.\u202eexe\u2028", `txt.\u202eexe\u2028`, `txt.\u202eexe\u2028`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Line(c.in); got != c.line {
				t.Errorf("Line(%q) = %q, want %q", c.in, got, c.line)
			}
			if got := Text(c.in); got != c.text {
				t.Errorf("Text(%q) = %q, want %q", c.in, got, c.text)
			}
			if hasControl(Line(c.in)) {
				t.Errorf("Line(%q) = %q still holds a control character", c.in, Line(c.in))
			}
		})
	}
}

// hasControl reports whether s is not valid UTF-8 or holds a character
// that unsafe lets no field print raw.
func hasControl(s string) bool {
	return !utf8.ValidString(s) || strings.IndexFunc(s, func(r rune) bool {
		return r < 0x20 || (r >= 0x7f && r <= 0x9f) || r == '\u202e' || r == '\u2028'
	}) >= 0
}

func TestName(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"report.md", "report.md"},
		{"charts/été.png", "charts/été.png"},
		{"", `""`},
		{"my report.md", `"my report.md"`},
		{"a\n  forged.txt 12 text/plain", `"a\n  forged.txt 12 text/plain"`},
		{"x\x1b]52;c;AAAA\x07", `"x\x1b]52;c;AAAA\a"`},
		{"q\"uote", `"q\"uote"`},
		{`back\slash`, `"back\\slash"`},
		{"c1\u009b2J", `"c1\u009b2J"`},
		{"bad\xffutf8", `"bad\xffutf8"`},
		{"gnp.\u202eexe", `"gnp.\u202eexe"`},
		{"nbsp\u00a0x", `"nbsp\u00a0x"`},
		{"zero\u200bwidth", `"zero\u200bwidth"`},
	} {
		if got := Name(c.in); got != c.want || hasControl(got) {
			t.Errorf("Name(%q) = %s, want %s", c.in, got, c.want)
		}
	}
}

func TestJSON(t *testing.T) {
	v := map[string]string{"summary": "a\x1b[2J b\u009b31m c\x7f d\u202e e\x9b f\u2028"}
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	got := JSON(raw)
	if hasControl(string(got)) {
		t.Errorf("JSON left a control character raw: %q", got)
	}
	var back map[string]string
	if err := json.Unmarshal(got, &back); err != nil {
		t.Fatalf("JSON made invalid JSON %q: %v", got, err)
	}
	want := "a\x1b[2J b\u009b31m c\x7f d\u202e e\ufffd f\u2028"
	if back["summary"] != want {
		t.Errorf("JSON changed the value: %q, want %q", back["summary"], want)
	}
}

// TestWriterSplits writes a stream in every split into two writes: a UTF-8
// sequence or a CRLF cut by a split must come out as Text makes it whole.
func TestWriterSplits(t *testing.T) {
	in := "log é\u009b\r\nnext\r\x1b[2Jend\xe2\x82"
	want := Text(in)
	for i := 0; i <= len(in); i++ {
		var out bytes.Buffer
		w := NewWriter(&out)
		w.Write([]byte(in[:i]))
		w.Write([]byte(in[i:]))
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if out.String() != want {
			t.Errorf("split at %d: %q, want %q", i, out.String(), want)
		}
	}
}

func TestForTerminal(t *testing.T) {
	const content = "exact \x1b[2J bytes\n"
	f, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := ForTerminal(f)
	w.Write([]byte(content))
	w.Close()
	if b, _ := os.ReadFile(f.Name()); string(b) != content {
		t.Errorf("to a file: %q, want the exact bytes %q", b, content)
	}

	pty, tty := testenv.OpenPTY(t)
	if !IsTerminal(tty) || IsTerminal(f) || IsTerminal(&bytes.Buffer{}) {
		t.Fatalf("IsTerminal: pty %v, file %v, buffer %v; want true, false, false", IsTerminal(tty), IsTerminal(f), IsTerminal(&bytes.Buffer{}))
	}
	w = ForTerminal(tty)
	w.Write([]byte(content))
	w.Close()
	tty.Close()
	b := make([]byte, 256)
	n, _ := pty.Read(b)
	if got := string(b[:n]); !strings.Contains(got, `exact \x1b[2J bytes`) || strings.Contains(got, "\x1b") {
		t.Errorf("to a terminal: %q, want the escape shown as \\x1b", got)
	}
}
