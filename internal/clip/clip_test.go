package clip

import (
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly", 7, "exactly"},
		{"too long", 3, "too…"},
		{"héllo", 2, "h…"}, // é is two bytes: not cut in half
		{"日本語", 4, "日…"},
		{"", 0, ""},
	} {
		got := String(c.in, c.n)
		if got != c.want || !utf8.ValidString(got) {
			t.Errorf("String(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
	if got := Line(" a\n\tb  c ", 100); got != "a b c" {
		t.Errorf("Line = %q", got)
	}
	if got := Line("one\ntwo three", 7); got != "one two…" {
		t.Errorf("Line cut = %q", got)
	}
}

func TestTrimPartialRune(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"abc", "abc"}, {"ab\xc3", "ab"}, {"日本\xe8\xaa", "日本"}, {"é", "é"}, {"", ""}, {"\xff\xfe", "\xff\xfe"[:0]},
	} {
		if got := string(TrimPartialRune([]byte(c.in))); got != c.want {
			t.Errorf("TrimPartialRune(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestWriter(t *testing.T) {
	w := &Writer{Max: 5}
	for _, p := range []string{"ab", "cd", "éf"} {
		if n, err := w.Write([]byte(p)); n != len(p) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", p, n, err)
		}
	}
	if w.String() != "abcd\uFFFD" || !w.Cut {
		t.Errorf("kept %q, cut %v; want the first 5 bytes (a rune cut in two replaced) and cut", w.String(), w.Cut)
	}
	small := &Writer{Max: 10}
	small.Write([]byte("hi"))
	if small.String() != "hi" || small.Cut {
		t.Errorf("kept %q, cut %v", small.String(), small.Cut)
	}
}
