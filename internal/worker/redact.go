package worker

import (
	"bytes"
	"io"
	"sort"
	"strings"
)

// Redacted replaces a secret in a transcript, a summary or an error.
const Redacted = "[REDACTED]"

// secretWords mark an environment variable whose value is a secret.
var secretWords = []string{"KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH"}

// minSecret is the shortest value taken as a secret: shorter values
// ("1", "true") would redact ordinary text.
const minSecret = 8

// Secrets returns the values of the variables in environ whose names say
// they are secrets (ANTHROPIC_API_KEY, GITHUB_TOKEN, ...), longest first.
func Secrets(environ []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || len(v) < minSecret || seen[v] {
			continue
		}
		name := strings.ToUpper(k)
		for _, w := range secretWords {
			if strings.Contains(name, w) {
				seen[v] = true
				out = append(out, v)
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// RedactString replaces every secret in s.
func RedactString(s string, secrets []string) string {
	for _, sec := range secrets {
		s = strings.ReplaceAll(s, sec, Redacted)
	}
	return s
}

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
		if _, err := io.WriteString(r.w, Redacted); err != nil {
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
