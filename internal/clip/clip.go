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
