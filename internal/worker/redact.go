package worker

import (
	"bytes"
	"io"

	"github.com/corral-dev/corral/internal/workerproto"
)

// redactor is a writer that replaces secrets in a stream before passing
// it on. A secret may be split across writes, so it holds back the end of
// what it has seen while that end could still be the start of a secret;
// Close writes what is held back.
type redactor struct {
	w       io.Writer
	secrets [][]byte
	buf     []byte
}

func newRedactor(w io.Writer, secrets []string) io.WriteCloser {
	r := &redactor{w: w}
	for _, s := range secrets {
		r.secrets = append(r.secrets, []byte(s))
	}
	return r
}

func (r *redactor) Write(p []byte) (int, error) {
	if len(r.secrets) == 0 {
		return r.w.Write(p)
	}
	r.buf = append(r.buf, p...)
	if err := r.flush(false); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Close writes what is held back.
func (r *redactor) Close() error { return r.flush(true) }

func (r *redactor) flush(final bool) error {
	for {
		at, n := -1, 0
		for _, s := range r.secrets {
			if i := bytes.Index(r.buf, s); i >= 0 && (at < 0 || i < at) {
				at, n = i, len(s)
			}
		}
		if at < 0 {
			break
		}
		if _, err := r.w.Write(r.buf[:at]); err != nil {
			return err
		}
		if _, err := io.WriteString(r.w, workerproto.Redacted); err != nil {
			return err
		}
		r.buf = r.buf[at+n:]
	}
	keep := 0
	if !final {
		keep = r.partial()
	}
	if out := len(r.buf) - keep; out > 0 {
		if _, err := r.w.Write(r.buf[:out]); err != nil {
			return err
		}
		r.buf = append(r.buf[:0], r.buf[out:]...)
	}
	return nil
}

// partial returns the length of the longest end of buf that is the start
// of a secret.
func (r *redactor) partial() int {
	best := 0
	for _, s := range r.secrets {
		for n := min(len(s)-1, len(r.buf)); n > best; n-- {
			if bytes.HasSuffix(r.buf, s[:n]) {
				best = n
				break
			}
		}
	}
	return best
}
