package statedir

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/hostproc"
)

// Tail returns the last bytes of a log file, for error messages.
func Tail(path string) string {
	return strings.TrimSpace(string(readTail(path, 512)))
}

// Explain gives es, of a sandbox whose state dir is dir, a Message when it
// has none: the signal that ended the main process, or, for another
// failure, what it said last in dir's output.log (sandbox.LastWords).
func Explain(es *sandbox.ExitStatus, dir string) {
	switch {
	case es.Message != "" || es.Code <= 0:
	case es.Code > 128 && es.Code < 128+65:
		es.Message = hostproc.KilledBy(syscall.Signal(es.Code - 128))
	default:
		es.Message = sandbox.LastWords(readTail(filepath.Join(dir, "output.log"), sandbox.LastWordsWindow))
	}
}

// readTail returns at most the last n bytes of the file at path; none if
// it cannot be read.
func readTail(path string, n int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		f.Seek(fi.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return b
}
