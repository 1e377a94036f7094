// Package termsafe makes text that a worker controls safe to print on a
// terminal. A worker chooses its summary, its error message, its output
// files' names and contents, its transcript and its progress text; printed
// raw, an escape sequence in any of them could clear the screen, set the
// window title, write the clipboard (OSC 52) or forge lines of Corral's own
// output. Here every character a terminal could act on is shown escaped
// instead: C0 and C1 control characters, DEL, invalid UTF-8, the Unicode
// line separators and the bidirectional overrides and isolates.
//
// Escapes are written as Go writes them: \x1b for a byte below 0x80 or one
// that is not UTF-8, \u009b for a code point, and \n, \r, \t by name.
package termsafe

import (
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// Line returns s as one line: every control character, the newline
// included, escaped. It is for single-line fields such as an error
// message, a description or a MIME type.
func Line(s string) string {
	b, _ := appendSafe(nil, []byte(s), false, true)
	return string(b)
}

// Text returns s as text of many lines: newlines, tabs and a carriage
// return before a newline kept, every other control character escaped. It
// is for summaries, file contents and transcripts.
func Text(s string) string {
	b, _ := appendSafe(nil, []byte(s), true, true)
	return string(b)
}

// Name returns a name (a file name, a path, a skill's name) as is when it
// is plain, and otherwise quoted as a Go string, so that nothing in it can
// act on the terminal and a space, a quote or a newline cannot make it
// look like two names or two lines.
func Name(s string) string {
	if plain(s) {
		return s
	}
	return strconv.Quote(s)
}

// JSON escapes, as JSON \u escapes, the characters that encoding/json
// leaves raw and a terminal may act on: DEL, the C1 controls, the
// bidirectional overrides and isolates. b must be JSON as encoding/json
// writes it (valid UTF-8, controls below 0x20 escaped): such characters
// then only appear inside strings, where the escape means the same.
func JSON(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r >= 0x7f && unsafe(r) {
			out = fmt.Appendf(out, `\u%04x`, r)
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return out
}

// plain reports whether s is a non-empty run of printable characters with
// no space, quote or backslash.
func plain(s string) bool {
	if s == "" || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unsafe(r) || !unicode.IsGraphic(r) || unicode.IsSpace(r) || r == '"' || r == '\\' || r == '\'' {
			return false
		}
	}
	return true
}

// unsafe reports whether a terminal may act on r rather than show it.
func unsafe(r rune) bool {
	switch {
	case unicode.Is(unicode.Cc, r): // C0, DEL, C1
		return true
	case r == '\u2028' || r == '\u2029': // line and paragraph separators
		return true
	case r >= '\u202a' && r <= '\u202e', r >= '\u2066' && r <= '\u2069': // bidi embeddings, overrides, isolates
		return true
	}
	return false
}

// appendSafe appends p to dst with every unsafe character escaped, and
// returns how much of p it consumed. With multiline, \n, \t and a \r
// right before \n stay as they are. Unless final, it leaves unconsumed an
// incomplete UTF-8 sequence or a \r at the end of p, which the next write
// may complete.
func appendSafe(dst, p []byte, multiline, final bool) ([]byte, int) {
	i := 0
	for i < len(p) {
		r, n := utf8.DecodeRune(p[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			if !final && !utf8.FullRune(p[i:]) {
				return dst, i
			}
			dst = fmt.Appendf(dst, `\x%02x`, p[i])
		case multiline && (r == '\n' || r == '\t'):
			dst = append(dst, p[i])
		case multiline && r == '\r' && i+1 == len(p) && !final:
			return dst, i
		case multiline && r == '\r' && i+1 < len(p) && p[i+1] == '\n':
			dst = append(dst, '\r')
		case unsafe(r):
			dst = appendEscape(dst, r)
		default:
			dst = append(dst, p[i:i+n]...)
		}
		i += n
	}
	return dst, i
}

// appendEscape appends r written visibly: \n, \r and \t by name, other
// ASCII as \x1b, the rest as \u009b.
func appendEscape(dst []byte, r rune) []byte {
	switch r {
	case '\n':
		return append(dst, `\n`...)
	case '\r':
		return append(dst, `\r`...)
	case '\t':
		return append(dst, `\t`...)
	}
	if r < utf8.RuneSelf {
		return fmt.Appendf(dst, `\x%02x`, r)
	}
	return fmt.Appendf(dst, `\u%04x`, r)
}
