package statedir

import (
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/corral-dev/corral/internal/sandbox"
)

// Tail returns the last bytes of a log file, for error messages.
func Tail(path string) string {
	return strings.TrimSpace(string(readTail(path, 512)))
}

// Explain gives es, of a sandbox whose state dir is dir, a Message when it
// has none (sandbox.ExitMessage), from the end of dir's output.log.
func Explain(es *sandbox.ExitStatus, dir string) {
	if es.Message == "" {
		es.Message = sandbox.ExitMessage(es.Code, func() []byte {
			return readTail(filepath.Join(dir, "output.log"), sandbox.LastWordsWindow)
		})
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
