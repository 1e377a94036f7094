// Package clip shortens text for messages and listings: a caller's input
// quoted back in an error, a title on one line of a prompt. It always cuts
// on a rune boundary, so valid UTF-8 stays valid.
package clip

import (
	"strings"
	"unicode/utf8"
)

// String returns s cut to at most n bytes, on a rune boundary, with "…"
// appended when anything was cut.
func String(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// Line returns s on one line, its runs of white space (newlines included)
// made one space, cut as String cuts it.
func Line(s string, n int) string {
	return String(strings.Join(strings.Fields(s), " "), n)
}

// TrimPartialRune drops an incomplete UTF-8 sequence at the end of b, as
// cutting text at a byte limit leaves one.
func TrimPartialRune(b []byte) []byte {
	for i := 0; i < utf8.UTFMax && len(b) > 0; i++ {
		r, size := utf8.DecodeLastRune(b)
		if r != utf8.RuneError || size > 1 {
			return b
		}
		b = b[:len(b)-1]
	}
	return b
}

// Writer keeps the first Max bytes written to it and drops the rest,
// setting Cut; a write never fails. String is what it kept, as valid UTF-8.
type Writer struct {
	Max int
	Cut bool
	b   strings.Builder
}

func (w *Writer) Write(p []byte) (int, error) {
	if room := w.Max - w.b.Len(); room < len(p) {
		w.b.Write(p[:max(room, 0)])
		w.Cut = true
	} else {
		w.b.Write(p)
	}
	return len(p), nil
}

// String is what w kept, with invalid UTF-8 (a rune cut at Max) replaced.
func (w *Writer) String() string { return strings.ToValidUTF8(w.b.String(), "\uFFFD") }
