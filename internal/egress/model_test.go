package egress

import (
	"bufio"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// modelClient is an HTTP client whose every connection is a relay tunnel
// to model API i of the task behind sock, as the worker's relay makes.
func modelClient(t *testing.T, sock string, i int) *http.Client {
	t.Helper()
	return &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				c, err := net.Dial("unix", sock)
				if err != nil {
					return nil, err
				}
				fmt.Fprintf(c, "CONNECT %s:80 HTTP/1.1\r\nHost: %[1]s:80\r\n\r\n", ModelHost(i))
				br := bufio.NewReader(c)
				resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
				if err != nil {
					c.Close()
					return nil, err
				}
				if resp.StatusCode != http.StatusOK {
					c.Close()
					return nil, fmt.Errorf("CONNECT: %s", resp.Status)
				}
				return c, nil
			},
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       10 * time.Second,
	}
}

// seen is what a model API's test server was sent.
type seen struct {
	path, query string
	header      http.Header
}

func modelServer(t *testing.T, tls bool, h http.HandlerFunc) (*httptest.Server, chan seen) {
	t.Helper()
	ch := make(chan seen, 10)
	wrapped := func(w http.ResponseWriter, r *http.Request) {
		ch <- seen{path: r.URL.Path, query: r.URL.RawQuery, header: r.Header.Clone()}
		h(w, r)
	}
	var s *httptest.Server
	if tls {
		s = httptest.NewTLSServer(http.HandlerFunc(wrapped))
	} else {
		s = httptest.NewServer(http.HandlerFunc(wrapped))
	}
	t.Cleanup(s.Close)
	return s, ch
}

func mustModel(t *testing.T, base, header, value string) Model {
	t.Helper()
	m, err := ParseModel(base, header, value)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestModelRelayAddsTheKey: a request through the relay reaches the model
// API under its base path with the server's key in the API's header, and
// none of the credentials the sandbox sent; it is recorded with its
// method, host, path and status.
func TestModelRelayAddsTheKey(t *testing.T) {
	srv, got := modelServer(t, false, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "answer") })
	m := mustModel(t, srv.URL+"/v1", "x-api-key", "sk-real")
	sock, recs := MustProxy(t, Policy{Models: []Model{m}}, Options{})
	req, _ := http.NewRequest("POST", "http://127.0.0.1:9/messages?beta=true", strings.NewReader(`{"q":1}`))
	req.Header.Set("x-api-key", "placeholder")
	req.Header.Set("Authorization", "Bearer placeholder")
	req.Header.Set("X-Goog-Api-Key", "placeholder")
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := modelClient(t, sock, 0).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "answer" {
		t.Fatalf("relayed: %s %q", resp.Status, body)
	}
	s := <-got
	if s.path != "/v1/messages" || s.query != "beta=true" {
		t.Errorf("the API was asked %s?%s, want /v1/messages?beta=true", s.path, s.query)
	}
	if k := s.header.Values("X-Api-Key"); len(k) != 1 || k[0] != "sk-real" {
		t.Errorf("x-api-key %q, want the server's key alone", k)
	}
	if a, g := s.header.Get("Authorization"), s.header.Get("X-Goog-Api-Key"); a != "" || g != "" {
		t.Errorf("the sandbox's credentials went on: Authorization %q, X-Goog-Api-Key %q", a, g)
	}
	if v := s.header.Get("Anthropic-Version"); v != "2023-06-01" {
		t.Errorf("other headers must pass: anthropic-version %q", v)
	}
	rec := recs.next(t)
	if !rec.Allowed || rec.Method != "POST" || rec.Path != "/messages" || rec.Status != 200 || rec.Host != "127.0.0.1" || !rec.Credential || rec.Address != srv.Listener.Addr().String() || rec.BytesUp != 7 || rec.BytesDown != 6 {
		t.Errorf("record %+v", rec)
	}
}

// TestModelRelayStreams: a streamed answer (server-sent events) reaches the
// agent as it is written, not once it ends.
func TestModelRelayStreams(t *testing.T) {
	resp, _ := firstEventRelayed(t)
	resp.Body.Close()
}

// firstEventRelayed starts a model API that streams one event and then
// waits for the test's end, asks it through the relay, and returns the
// answer once its first event has been read (before the stream ends), and
// the proxy's records.
func firstEventRelayed(t *testing.T) (*http.Response, *records) {
	t.Helper()
	release := make(chan struct{})
	srv, _ := modelServer(t, false, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, "data: last\n\n")
	})
	t.Cleanup(func() { close(release) }) // before the server's close, which waits for its handler
	sock, recs := MustProxy(t, Policy{Models: []Model{mustModel(t, srv.URL, "Authorization", "Bearer k")}}, Options{})
	resp, err := modelClient(t, sock, 0).Post("http://x/v1/stream", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "data: first\n" {
		resp.Body.Close()
		t.Fatalf("first event %q, %v: want it before the stream ends", line, err)
	}
	return resp, recs
}

// TestModelRelayVerifiesTLS: the relay speaks TLS to an https model API
// and refuses a certificate its roots do not trust.
func TestModelRelayVerifiesTLS(t *testing.T) {
	srv, _ := modelServer(t, true, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "over tls") })
	m := mustModel(t, srv.URL, "x-api-key", "k")
	for _, trusted := range []bool{false, true} {
		var opts Options
		if trusted {
			opts.RootCAs = x509.NewCertPool()
			opts.RootCAs.AddCert(srv.Certificate())
		}
		sock, recs := MustProxy(t, Policy{Models: []Model{m}}, opts)
		resp, err := modelClient(t, sock, 0).Get("http://x/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		rec := recs.next(t)
		switch {
		case trusted && (resp.StatusCode != 200 || string(body) != "over tls"):
			t.Errorf("trusted certificate: %s %q", resp.Status, body)
		case !trusted && (resp.StatusCode != http.StatusBadGateway || !strings.Contains(rec.Error, "certificate")):
			t.Errorf("untrusted certificate: %s %q, record error %q; want 502, a certificate error", resp.Status, body, rec.Error)
		}
	}
}

// TestModelRelayRefuses: a relay for a model API the task has not, a path
// that leaves the API's base path, and an absolute URL for another host
// are refused; a redirect is passed back, never followed with the key.
func TestModelRelayRefuses(t *testing.T) {
	srv, got := modelServer(t, false, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://elsewhere.example/steal", http.StatusFound)
	})
	sock, recs := MustProxy(t, Policy{Models: []Model{mustModel(t, srv.URL+"/v1", "x-api-key", "k")}}, Options{})
	if _, _, status, _ := connect(t, sock, ModelHost(1)+":80"); status != http.StatusForbidden {
		t.Errorf("relay of a model API the task has not: %d, want 403", status)
	}
	if rec := recs.next(t); rec.Allowed || rec.Reason != ReasonNoModel {
		t.Errorf("record %+v", rec)
	}
	c := modelClient(t, sock, 0)
	for _, p := range []string{"/../admin", "/v1/../../admin", "//evil.example/x", "/./messages"} {
		req, _ := http.NewRequest("GET", "http://x/", nil)
		req.URL.Opaque = p // sent as is
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("path %q: %s, want 403", p, resp.Status)
		}
		if rec := recs.next(t); rec.Allowed || rec.Reason != ReasonModelPath {
			t.Errorf("path %q: record %+v", p, rec)
		}
	}
	select {
	case s := <-got:
		t.Errorf("the API was asked %s", s.path)
	default:
	}
	resp, err := c.Get("http://x/messages")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "http://elsewhere.example/steal" {
		t.Errorf("redirect: %s %q, want the 302 passed back", resp.Status, resp.Header.Get("Location"))
	}
	if s := <-got; s.path != "/v1/messages" {
		t.Errorf("asked %s", s.path)
	}
}

func TestParseModel(t *testing.T) {
	for _, bad := range []string{"", "ftp://h", "https://", "https://u:p@h", "https://h/?q=1", "https://h/#f", "h/v1"} {
		if _, err := ParseModel(bad, "x-api-key", "k"); err == nil {
			t.Errorf("ParseModel(%q) accepted", bad)
		}
	}
	if _, err := ParseModel("https://h", "x-api-key", "k\r\nX: y"); err == nil {
		t.Error("a credential spanning lines accepted")
	}
	m, err := ParseModel("https://api.example.com/v1/", "Authorization", "Bearer k")
	if err != nil || m.Base.Path != "/v1" || m.String() != "https://api.example.com/v1" {
		t.Errorf("ParseModel: %+v %v", m, err)
	}
	for host, want := range map[string]int{ModelHost(0): 0, ModelHost(12): 12, "model-01.corral.invalid": -1, "model-x.corral.invalid": -1, "model-1.example.com": -1} {
		i, ok := modelIndex(host)
		if !ok {
			i = -1
		}
		if i != want {
			t.Errorf("modelIndex(%q) = %d, want %d", host, i, want)
		}
	}
}

// TestModelRelayRecordsABrokenAnswer: an answer that breaks off midway
// ends the agent's response and is recorded, saying so.
func TestModelRelayRecordsABrokenAnswer(t *testing.T) {
	srv, _ := modelServer(t, false, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		io.WriteString(w, "partial")
		w.(http.Flusher).Flush()
		c, _, _ := http.NewResponseController(w).Hijack()
		c.Close()
	})
	sock, recs := MustProxy(t, Policy{Models: []Model{mustModel(t, srv.URL, "x-api-key", "k")}}, Options{})
	resp, err := modelClient(t, sock, 0).Get("http://x/v1/models")
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Error("a broken answer read whole")
	}
	if rec := recs.next(t); !rec.Allowed || rec.Error != "the answer broke off: reading it from the model API: unexpected EOF" || rec.Status != 200 {
		t.Errorf("record %+v: want the request, allowed, with why it broke off", rec)
	}
}

// TestModelRelayRecordsAnAnswerLeft: the sandbox closes its connection
// while a streamed answer is on its way; the record says the answer broke
// off because the sandbox's side ended.
func TestModelRelayRecordsAnAnswerLeft(t *testing.T) {
	resp, recs := firstEventRelayed(t)
	resp.Body.Close() // the client leaves mid-answer: its connection closes
	if rec := recs.next(t); !rec.Allowed || rec.Error != "the answer broke off: the sandbox's connection ended first" {
		t.Errorf("record %+v: want why the answer broke off", rec)
	}
}

// wsEcho is a model API's WebSocket endpoint: it answers an upgrade to
// websocket with 101 and then sends back each line it reads, upper-cased.
func wsEcho(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		http.Error(w, "want a websocket upgrade", http.StatusBadRequest)
		return
	}
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	for {
		line, err := brw.ReadString('\n')
		if err != nil {
			return
		}
		io.WriteString(c, strings.ToUpper(line))
	}
}

// TestModelRelayUpgradesToWebSocket: an agent that speaks WebSocket to its
// model API (a Realtime API, an agent's streaming session) gets the
// API's 101 through the relay, with the server's key added to the
// handshake and the sandbox's credentials removed, over TLS too (where
// the API offers HTTP/2, the handshake goes over HTTP/1.1); then bytes
// flow both ways until the sandbox closes, and the record says 101 and
// counts them.
func TestModelRelayUpgradesToWebSocket(t *testing.T) {
	for _, overTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "https"}[overTLS], func(t *testing.T) {
			got := make(chan http.Header, 1)
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got <- r.Header.Clone()
				wsEcho(w, r)
			}))
			var opts Options
			if overTLS {
				srv.EnableHTTP2 = true
				srv.StartTLS()
				opts.RootCAs = x509.NewCertPool()
				opts.RootCAs.AddCert(srv.Certificate())
			} else {
				srv.Start()
			}
			t.Cleanup(srv.Close)
			sock, recs := MustProxy(t, Policy{Models: []Model{mustModel(t, srv.URL+"/v1", "Authorization", "Bearer sk-real")}}, opts)
			req, _ := http.NewRequest("GET", "http://x/realtime", nil)
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "websocket")
			req.Header.Set("Authorization", "Bearer placeholder")
			client := modelClient(t, sock, 0)
			client.Timeout = 0 // its timer's body would hide the connection's Write
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusSwitchingProtocols {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Fatalf("upgrade answered %s %q, want 101", resp.Status, body)
			}
			if h := <-got; h.Get("Authorization") != "Bearer sk-real" || len(h.Values("Authorization")) != 1 {
				t.Errorf("the handshake reached the API with Authorization %q, want the server's key alone", h.Values("Authorization"))
			}
			conn := resp.Body.(io.ReadWriteCloser)
			br := bufio.NewReader(conn)
			for _, line := range []string{"hello\n", "again\n"} {
				io.WriteString(conn, line)
				back, err := br.ReadString('\n')
				if err != nil || back != strings.ToUpper(line) {
					t.Fatalf("sent %q over the upgraded connection, read back %q, %v", line, back, err)
				}
			}
			conn.Close()
			rec := recs.next(t)
			if !rec.Allowed || rec.Status != http.StatusSwitchingProtocols || !rec.Credential || rec.Path != "/realtime" || rec.BytesUp != 12 || rec.BytesDown != 12 || rec.Error != "" {
				t.Errorf("record %+v: want the upgrade, allowed, 101, with the key, 12 bytes each way", rec)
			}
		})
	}
}

// TestModelRelayRefusesOtherUpgrades: an upgrade to anything but WebSocket
// (h2c, whose connection would then carry requests for any path of the
// API, unchecked) is refused and never reaches the API.
func TestModelRelayRefusesOtherUpgrades(t *testing.T) {
	srv, got := modelServer(t, false, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "asked") })
	sock, recs := MustProxy(t, Policy{Models: []Model{mustModel(t, srv.URL, "x-api-key", "k")}}, Options{})
	for _, up := range []string{"h2c", "websocket, h2c", "tls/1.0"} {
		req, _ := http.NewRequest("GET", "http://x/v1/models", nil)
		req.Header.Set("Connection", "Upgrade, HTTP2-Settings")
		req.Header.Set("Upgrade", up)
		resp, err := modelClient(t, sock, 0).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if rec := recs.next(t); resp.StatusCode != http.StatusForbidden || rec.Allowed || rec.Reason != ReasonUpgrade {
			t.Errorf("Upgrade: %s answered %s, record %+v; want 403 for %q", up, resp.Status, rec, ReasonUpgrade)
		}
	}
	select {
	case s := <-got:
		t.Errorf("a refused upgrade reached the API: %+v", s)
	default:
	}
}
