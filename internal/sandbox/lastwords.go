package sandbox

import (
	"strings"
	"unicode"

	"github.com/corral-dev/corral/internal/clip"
)

// LastWords is what a sandbox's main process said last about why it
// ended, in out, the end of its output: a Go program's "panic:" or "fatal
// error:" line, with the "runtime:" lines just before it (a worker that
// could not start a thread says why there), else the last line. On one
// line, valid UTF-8, without control characters, at most 300 bytes; ""
// for none. Only the last LastWordsWindow bytes of out are read. The
// sandbox wrote them: it is a message, never parsed.
func LastWords(out []byte) string {
	out = out[max(len(out)-LastWordsWindow, 0):]
	lines := strings.Split(strings.ToValidUTF8(string(out), "\uFFFD"), "\n")
	said := ""
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if strings.HasPrefix(l, "panic: ") || strings.HasPrefix(l, "fatal error: ") {
			j := i
			for j > 0 && strings.HasPrefix(lines[j-1], "runtime: ") {
				j--
			}
			said = strings.Join(lines[j:i+1], "; ")
			break
		}
		if said == "" && l != "" {
			said = l
		}
	}
	return clip.Line(strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, said), 300)
}

// LastWordsWindow is how much of the end of a sandbox's output LastWords
// reads.
const LastWordsWindow = 64 << 10
