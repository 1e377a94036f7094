package egress

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A task's agent reaches its model API without holding its key. The
// worker in the sandbox listens on the sandbox's loopback, points the
// agent's base URL variable there (ANTHROPIC_BASE_URL, ...), and tunnels
// each connection to the proxy with CONNECT ModelHost(i):80. The proxy
// serves that tunnel as plain HTTP itself: it sends each request on to the
// model API the server was configured with (over TLS to the real host, its
// certificate verified), with the agent's key added in the header that API
// reads and every credential the sandbox sent removed. The key lives in
// the server only; the sandbox's environment holds a placeholder.

// Model is a model API the proxy relays for a task's agent.
type Model struct {
	// Base is the API's base URL (http or https, a host, a path or none):
	// a request for /v1/messages goes to Base's path joined with it, and
	// never outside Base's path.
	Base *url.URL
	// Header and Value are the credential added to every request
	// ("x-api-key" and the key; "Authorization" and "Bearer " + the key).
	Header, Value string
	// Placeholder, if set, is what the sandbox holds in the key's place:
	// a query parameter with this value (Google's ?key=) is removed.
	Placeholder string
}

// same reports whether m and o are the same API with the same credential.
func (m Model) same(o Model) bool {
	return m.Base.String() == o.Base.String() && m.Header == o.Header && m.Value == o.Value && m.Placeholder == o.Placeholder
}

// String names the model API without its credential.
func (m Model) String() string { return m.Base.Redacted() }

// ParseModel checks a model API's base URL and returns the Model that adds
// header: value to its requests.
func ParseModel(base, header, value string) (Model, error) {
	u, err := url.Parse(base)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		shown := "that is not one"
		if err == nil {
			shown = clipString(u.Redacted(), 200)
		}
		return Model{}, fmt.Errorf("model API base URL %q: want http(s)://host[:port][/path], without credentials, query or fragment", shown)
	}
	if header == "" || value == "" || strings.ContainsAny(header+value, "\r\n") {
		return Model{}, fmt.Errorf("model API %s: its credential header is empty or spans lines", u.Redacted())
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	return Model{Base: u, Header: header, Value: value}, nil
}

// modelDomain holds the names the relays CONNECT to: under .invalid (RFC
// 6761), which never resolves, so no allow rule can name a real host there.
const modelDomain = ".corral.invalid"

// ModelHost is the host the worker's relay for the task's i-th model API
// CONNECTs to (on port 80).
func ModelHost(i int) string { return "model-" + strconv.Itoa(i) + modelDomain }

// modelIndex reads ModelHost's index back; ok is false for any other host.
func modelIndex(host string) (int, bool) {
	s, ok := strings.CutPrefix(host, "model-")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, modelDomain)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || strconv.Itoa(i) != s {
		return 0, false
	}
	return i, true
}

// credentialHeaders are removed from every relayed request: whatever the
// sandbox sent as a credential goes nowhere.
var credentialHeaders = []string{"Authorization", "Proxy-Authorization", "X-Api-Key", "X-Goog-Api-Key", "Api-Key", "Cookie"}

// ReasonNoModel denies a relay CONNECT for a model API the task has not.
const ReasonNoModel = "no model API of the task's agent has this number"

// ReasonModelPath denies a relayed request for a path outside the model
// API's base path.
const ReasonModelPath = "path outside the model API's base path"

// ReasonUpgrade denies a relayed request that asks to switch its
// connection to a protocol other than WebSocket: h2c, say, whose
// connection would then carry requests the relay never reads or checks.
const ReasonUpgrade = "an upgrade to a protocol other than WebSocket"

// upgradeRefused reports whether a request's header asks to upgrade its
// connection (Connection: upgrade) to anything but WebSocket alone.
func upgradeRefused(h http.Header) bool {
	asked := false
	for _, v := range h.Values("Connection") {
		for tok := range strings.SplitSeq(v, ",") {
			asked = asked || strings.EqualFold(strings.TrimSpace(tok), "upgrade")
		}
	}
	up := h.Values("Upgrade")
	return asked && len(up) > 0 && (len(up) != 1 || !strings.EqualFold(strings.TrimSpace(up[0]), "websocket"))
}

// maxAuditPath bounds the path a Record keeps.
const maxAuditPath = 256

// relayModel serves a CONNECT to ModelHost(i): the tunnel carries the
// agent's HTTP requests to model API i of the policy, each recorded.
func (p *Proxy) relayModel(w http.ResponseWriter, rec *Record, i int) {
	models := p.Policy().Models
	if i >= len(models) {
		p.deny(w, rec, http.StatusForbidden, ReasonNoModel)
		return
	}
	m := models[i]
	client, in, ok := p.takeOver(w, rec, tunnel{model: i, api: m})
	if !ok {
		return
	}
	defer p.untrack(client)
	p.serveTunnel(&tunnelConn{Conn: client, r: in}, p.relayHandler(m.Base.Hostname(), portOf(m.Base), p.modelTransport(), func(r *http.Request) (relayTarget, string) {
		target, ok := joinUnder(m.Base.Path, r.URL.Path)
		if !ok || r.URL.IsAbs() && r.URL.Host != "" {
			return relayTarget{}, ReasonModelPath
		}
		return relayTarget{
			url:    &url.URL{Scheme: m.Base.Scheme, Host: m.Base.Host, Path: target, RawQuery: withoutPlaceholder(r.URL.RawQuery, m.Placeholder)},
			header: m.Header, value: m.Value, strip: true,
		}, ""
	}))
}

// serveTunnel serves HTTP on conn, a tunnel the proxy took over, until it
// closes. The tunnel is not an attempt of its own: each request in it is.
func (p *Proxy) serveTunnel(conn net.Conn, h http.Handler) {
	c := &notifyConn{Conn: conn, closed: make(chan struct{})}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: p.opts.ReadHeaderTimeout,
		IdleTimeout:       p.opts.IdleTimeout,
		MaxHeaderBytes:    p.opts.MaxHeaderBytes,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	srv.Serve(&oneConnListener{conn: c})
	<-c.closed
}

// relayTarget is where relayHandler sends a request, with the credential
// it adds (none when header is ""); strip removes every credential the
// sandbox sent (credentialHeaders) first.
type relayTarget struct {
	url           *url.URL
	header, value string
	strip         bool
}

// maxAuditMethod bounds the method a Record keeps.
const maxAuditMethod = 32

// relayHandler sends each request where route says, or refuses it with
// route's reason, and records it: method, path (never the query), status,
// whether a credential was added, bytes.
func (p *Proxy) relayHandler(host string, port int, transport http.RoundTripper, route func(*http.Request) (relayTarget, string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := Record{TaskID: p.taskID, Method: clipString(r.Method, maxAuditMethod), Host: host, Port: port, Start: p.opts.Now(),
			Path: clipString(r.URL.Path, maxAuditPath)}
		t, reason := route(r)
		if reason == "" && upgradeRefused(r.Header) {
			reason = ReasonUpgrade
		}
		if reason != "" {
			rec.Reason, rec.Status = reason, http.StatusForbidden
			p.finish(&rec)
			http.Error(w, "corral egress: "+reason, http.StatusForbidden)
			return
		}
		rec.Allowed, rec.Credential = true, t.header != ""
		sw := &statusWriter{ResponseWriter: w}
		var addr atomic.Value
		r = r.WithContext(httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { addr.Store(info.Conn.RemoteAddr().String()) },
		}))
		var failed error
		var answer *countingReader // the model API's answer's body
		rp := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				out := pr.Out
				out.URL = t.url
				out.Host = t.url.Host
				if t.strip {
					for _, h := range credentialHeaders {
						out.Header.Del(h)
					}
				}
				if t.header != "" {
					out.Header.Set(t.header, t.value)
				}
			},
			ModifyResponse: func(res *http.Response) error {
				if res.StatusCode == http.StatusSwitchingProtocols {
					return nil // the connection itself, counted as sw's (Hijack)
				}
				answer = &countingReader{r: res.Body}
				res.Body = answer
				return nil
			},
			Transport:     transport,
			FlushInterval: -1,
			ErrorLog:      log.New(io.Discard, "", 0),
			ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
				failed = err
				if d, ok := asDenied(err); ok {
					w.WriteHeader(d.status)
					fmt.Fprintf(w, "corral egress: %s denied: %s\n", net.JoinHostPort(host, strconv.Itoa(port)), d.reason)
					return
				}
				w.WriteHeader(http.StatusBadGateway)
				fmt.Fprintf(w, "corral egress: %s: %s\n", net.JoinHostPort(host, strconv.Itoa(port)), oneLine(err.Error()))
			},
		}
		body := &countingReader{r: r.Body}
		r.Body = body
		// Recorded also when the answer breaks off midway, which the
		// reverse proxy ends by panicking with http.ErrAbortHandler.
		defer func() {
			up, down := sw.upgradedBytes()
			rec.Status, rec.BytesUp, rec.BytesDown = sw.status, body.n.Load()+up, sw.n+down
			rec.Address, _ = addr.Load().(string)
			d, denied := asDenied(failed)
			switch v := recover(); {
			case denied:
				rec.Allowed, rec.Credential, rec.Reason = false, false, d.reason
			case failed != nil:
				rec.Error = failed.Error()
			case v != nil:
				rec.Error = "the answer broke off" + brokeOff(sw, body, answer, r)
				defer panic(v)
			}
			p.finish(&rec)
		}()
		rp.ServeHTTP(sw, r)
	})
}

// brokeOff says why a relayed answer broke off midway: a write to the
// sandbox that failed, a read of the model API's answer that failed, or
// the sandbox's request ended (its connection closed) while the answer
// was on its way. The last shows as the request's context ended, or as a
// read of its body (body) that failed: the transport may still read the
// body, for bytes past its length, when the sandbox leaves, and closes
// the connection to the API on that failure, before the server has ended
// the context; the answer's read then fails too, on a connection the
// relay closed itself.
func brokeOff(sw *statusWriter, body, answer *countingReader, r *http.Request) string {
	switch {
	case sw.err != nil:
		return ": writing it to the sandbox: " + sw.err.Error()
	case r.Context().Err() != nil || body.failed() != nil:
		return ": the sandbox's connection ended first"
	case answer != nil && answer.failed() != nil:
		return ": reading it from the model API: " + answer.failed().Error()
	}
	return ""
}

// modelTransport is how the relay reaches model APIs: the proxy's dialer,
// TLS verified against Options.RootCAs (the system's when nil), and no
// proxy from the server's environment.
func (p *Proxy) modelTransport() *http.Transport {
	return &http.Transport{
		DialContext:           p.opts.Dial,
		TLSClientConfig:       &tls.Config{RootCAs: p.opts.RootCAs, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   p.opts.DialTimeout,
		ResponseHeaderTimeout: p.opts.IdleTimeout,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   4,
	}
}

// joinUnder joins base (a clean path, "" or "/v1") and a request's path,
// refusing a path that, cleaned, leaves base (dot segments).
func joinUnder(base, reqPath string) (string, bool) {
	if reqPath == "" {
		reqPath = "/"
	}
	if !strings.HasPrefix(reqPath, "/") {
		return "", false
	}
	joined := path.Join(base, reqPath)
	if base != "" && joined != base && !strings.HasPrefix(joined, base+"/") {
		return "", false
	}
	if path.Clean(reqPath) != reqPath && path.Clean(reqPath)+"/" != reqPath {
		return "", false // dot segments or doubled slashes: nothing an API client sends
	}
	if strings.HasSuffix(reqPath, "/") && !strings.HasSuffix(joined, "/") {
		joined += "/"
	}
	return joined, true
}

// withoutPlaceholder removes the query parameters whose value is
// placeholder (none when it is "").
func withoutPlaceholder(rawQuery, placeholder string) string {
	if placeholder == "" || !strings.Contains(rawQuery, placeholder) {
		return rawQuery
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return rawQuery
	}
	for k, vs := range q {
		if slices.Contains(vs, placeholder) {
			q.Del(k)
		}
	}
	return q.Encode()
}

func portOf(u *url.URL) int {
	if p, err := strconv.Atoi(u.Port()); err == nil {
		return p
	}
	if u.Scheme == "https" {
		return 443
	}
	return 80
}

func clipString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// statusWriter records the status, the body bytes written and the first
// write that failed, and the bytes each way of a connection upgraded
// (Hijack).
type statusWriter struct {
	http.ResponseWriter
	status   int
	n        int64
	err      error
	upgraded *countingConn // the sandbox's side, once hijacked
}

// Hijack hands the sandbox's connection to the reverse proxy, which takes
// it for an upgrade the API accepted (101 Switching Protocols: a
// WebSocket) and copies bytes both ways until either side ends; they are
// counted as the request's.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	if w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	w.upgraded = &countingConn{Conn: c}
	return w.upgraded, brw, nil
}

// upgradedBytes are the bytes read from the sandbox and written to it
// over the upgraded connection (none if there was none).
func (w *statusWriter) upgradedBytes() (up, down int64) {
	if w.upgraded == nil {
		return 0, 0
	}
	return w.upgraded.read.Load(), w.upgraded.written.Load()
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.n += int64(n)
	if err != nil && w.err == nil {
		w.err = err
	}
	return n, err
}

// Flush lets the reverse proxy flush a stream (server-sent events) at once.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// countingReader counts the bytes read and keeps the first read that
// failed (an end of file is no failure). It is safe for concurrent use: a
// request's body may still be read by the transport's writer (for bytes
// past its length) while the handler records it.
type countingReader struct {
	r   io.ReadCloser
	n   atomic.Int64
	mu  sync.Mutex
	err error
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n.Add(int64(n))
	if err != nil && err != io.EOF {
		c.mu.Lock()
		if c.err == nil {
			c.err = err
		}
		c.mu.Unlock()
	}
	return n, err
}

// failed is the first read that failed, nil if none did.
func (c *countingReader) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *countingReader) Close() error { return c.r.Close() }

// tunnelConn is a hijacked connection whose first bytes may be buffered
// in r.
type tunnelConn struct {
	net.Conn
	r io.Reader
}

func (c *tunnelConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// notifyConn closes closed once the connection is closed.
type notifyConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *notifyConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.closed) })
	return err
}

// oneConnListener hands one connection to an http.Server, then reports
// itself closed once that connection is.
type oneConnListener struct {
	conn *notifyConn
	mu   sync.Mutex
	done bool
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	first := !l.done
	l.done = true
	l.mu.Unlock()
	if first {
		return l.conn, nil
	}
	<-l.conn.closed
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.conn.LocalAddr() }
