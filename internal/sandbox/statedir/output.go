package statedir

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"unicode"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/hostproc"
)

// Tail returns the last bytes of a log file, for error messages.
func Tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 512 {
		b = b[len(b)-512:]
	}
	return strings.TrimSpace(string(b))
}

// Explain gives es, of a sandbox whose state dir is dir, a Message when it
// has none: the signal that ended the main process, or, for another
// failure, what it said last in dir's output.log (LastWords).
func Explain(es *sandbox.ExitStatus, dir string) {
	switch {
	case es.Message != "" || es.Code <= 0:
	case es.Code > 128 && es.Code < 128+65:
		es.Message = hostproc.KilledBy(syscall.Signal(es.Code - 128))
	default:
		es.Message = LastWords(filepath.Join(dir, "output.log"))
	}
}

// LastWords is what a sandbox's main process (or bwrap) said last about
// why it ended, from the end of output.log, their stderr: a Go program's
// "panic:" or "fatal error:" line, with the "runtime:" lines just before
// it (a worker that could not start a thread says why there), else the
// last line. On one line, valid UTF-8, at most 300 bytes; "" for none.
// The sandbox wrote it: it is a message, never parsed.
func LastWords(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const window = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > window {
		f.Seek(fi.Size()-window, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, window))
	lines := strings.Split(strings.ToValidUTF8(string(b), "\uFFFD"), "\n")
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
