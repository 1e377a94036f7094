package httpapi

import (
	"io"
	"net/http"
	"time"
)

// DefaultBodyStall is how long a request body may send nothing before the
// connection is closed (Options.BodyStall).
const DefaultBodyStall = 30 * time.Second

// stallGuard closes the connection of a request whose body stalls: before
// each read of the body the connection's read deadline moves stall ahead,
// and once the body is read to its end it is cleared (after a stall it is
// left expired, so the connection closes), so a long upload
// that keeps sending is never cut and a response that streams (SSE) is
// not bounded. Header reads are bounded by the http.Server's
// ReadHeaderTimeout, idle keep-alive connections by its IdleTimeout.
//
// The deadline is set before the handler runs too: a request refused
// before its body is read (a Host the web trust check refuses, say) is
// drained by the server after the handler, and without a deadline a body
// that never comes would hold the connection for ever.
func stallGuard(next http.Handler, stall time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			rc := http.NewResponseController(w)
			rc.SetReadDeadline(time.Now().Add(stall))
			r.Body = &stallBody{ReadCloser: r.Body, rc: rc, stall: stall}
		}
		next.ServeHTTP(w, r)
	})
}

type stallBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	stall time.Duration
	done  bool
}

func (b *stallBody) Read(p []byte) (int, error) {
	if b.done {
		return b.ReadCloser.Read(p)
	}
	b.rc.SetReadDeadline(time.Now().Add(b.stall))
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		// Read whole: the deadline no longer applies. After any other
		// error it stays, so the server's own attempt to drain the rest
		// fails at once too and the connection is closed.
		b.done = true
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}
