package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// records collects the proxy's Records.
type records struct {
	ch chan Record
}

func newRecords() *records { return &records{ch: make(chan Record, 100)} }

func (r *records) add(rec Record) { r.ch <- rec }

// next waits for the next record.
func (r *records) next(t *testing.T) Record {
	t.Helper()
	select {
	case rec := <-r.ch:
		return rec
	case <-time.After(10 * time.Second):
		t.Fatal("no record within 10s")
		return Record{}
	}
}

// fakeResolver answers from a map and counts its questions.
type fakeResolver struct {
	mu    sync.Mutex
	addrs map[string][]string
	asked []string
}

func (f *fakeResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, host)
	ss, ok := f.addrs[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out, nil
}

func (f *fakeResolver) questions() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.asked...)
}

// MustProxy starts a Server with opts, opens task "t1" under policy and
// returns the socket's path and the records.
func MustProxy(tb testing.TB, policy Policy, opts Options) (string, *records) {
	tb.Helper()
	_, sock, recs := mustServer(tb, policy, opts)
	return sock, recs
}

// mustServer is MustProxy with the server, whose task is "t1".
func mustServer(tb testing.TB, policy Policy, opts Options) (*Server, string, *records) {
	tb.Helper()
	// t.TempDir's long names would not fit a unix socket path.
	dir, err := os.MkdirTemp("", "egress")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	recs := newRecords()
	opts.OnConnection = recs.add
	srv, err := NewServer(dir, opts, slog.New(slog.DiscardHandler))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(srv.Shutdown)
	tdir, err := srv.Open("t1", policy)
	if err != nil {
		tb.Fatal(err)
	}
	return srv, filepath.Join(tdir, SocketName), recs
}

// proxyClient is an HTTP client whose proxy is the unix socket sock.
func proxyClient(sock string) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy: http.ProxyURL(&url1),
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			},
			DisableKeepAlives: true,
		},
		Timeout: 10 * time.Second,
	}
}

var url1 = mustURL("http://proxy.invalid:3128")

// echoServer listens on loopback and echoes every connection.
func echoServer(tb testing.TB) (port int) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	tb.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// connect sends CONNECT for hostport over a new connection to sock and
// returns the connection and the response status.
func connect(t *testing.T, sock, hostport string) (net.Conn, *bufio.Reader, int, string) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	return connectOn(t, c, hostport)
}

// connectOn sends CONNECT for hostport over c, a connection to a proxy.
func connectOn(t *testing.T, c net.Conn, hostport string) (net.Conn, *bufio.Reader, int, string) {
	t.Helper()
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", hostport, hostport)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", hostport, err)
	}
	var body string
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
	}
	return c, br, resp.StatusCode, body
}

func TestConnectTunnelsBothWays(t *testing.T) {
	port := echoServer(t)
	hostport := "127.0.0.1:" + strconv.Itoa(port)
	sock, recs := MustProxy(t, Policy{Allow: MustParseRules(hostport)}, Options{})
	c, br, status, body := connect(t, sock, hostport)
	if status != 200 {
		t.Fatalf("CONNECT status %d: %s", status, body)
	}
	msg := strings.Repeat("0123456789", 100)
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(br, got); err != nil {
		t.Fatal(err)
	}
	if string(got) != msg {
		t.Errorf("echo came back different")
	}
	c.(*net.UnixConn).CloseWrite() // the echo server sees EOF and closes
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after close: %v, want EOF", err)
	}
	rec := recs.next(t)
	if !rec.Allowed || rec.TaskID != "t1" || rec.Method != "CONNECT" || rec.Host != "127.0.0.1" || rec.Port != port ||
		rec.Address != hostport || rec.Status != 200 || rec.Error != "" {
		t.Errorf("record %+v", rec)
	}
	if rec.BytesUp != 1000 || rec.BytesDown != 1000 {
		t.Errorf("bytes up %d down %d, want 1000 and 1000", rec.BytesUp, rec.BytesDown)
	}
	if rec.Duration <= 0 || rec.Start.IsZero() {
		t.Errorf("duration %s, start %s", rec.Duration, rec.Start)
	}
}

func TestConnectSendsBytesBufferedWithTheRequest(t *testing.T) {
	port := echoServer(t)
	hostport := "localhost:" + strconv.Itoa(port)
	sock, _ := MustProxy(t, Policy{Allow: MustParseRules(hostport)}, Options{})
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The request and the first bytes of the tunnel in one write, as a TLS
	// client that does not wait for the answer would send them.
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\nhello", hostport, hostport)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	got := make([]byte, 5)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != "hello" {
		t.Errorf("got %q, %v", got, err)
	}
}

func TestForwardPlainHTTP(t *testing.T) {
	var gotHeader http.Header
	var gotURI string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotHeader, gotURI = r.Header.Clone(), r.RequestURI
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Up", "yes")
		fmt.Fprintf(w, "hello %s %s", r.Method, body)
	}))
	defer up.Close()
	hostport := up.Listener.Addr().String()
	sock, recs := MustProxy(t, Policy{Allow: MustParseRules(hostport)}, Options{})
	req, _ := http.NewRequest("POST", "http://"+hostport+"/path?q=1", strings.NewReader("body"))
	req.Header.Set("Proxy-Authorization", "Basic c2VjcmV0")
	resp, err := proxyClient(sock).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "hello POST body" || resp.Header.Get("X-Up") != "yes" {
		t.Errorf("status %d, body %q, header %v", resp.StatusCode, b, resp.Header)
	}
	if gotURI != "/path?q=1" {
		t.Errorf("upstream saw request URI %q, want the origin form", gotURI)
	}
	if gotHeader.Get("Proxy-Authorization") != "" {
		t.Errorf("hop-by-hop header Proxy-Authorization reached the upstream")
	}
	rec := recs.next(t)
	if !rec.Allowed || rec.Method != "POST" || rec.Status != 200 || rec.Address != hostport || rec.Error != "" {
		t.Errorf("record %+v", rec)
	}
	if rec.BytesUp < int64(len("POST /path?q=1 HTTP/1.1\r\n")+len("body")) || rec.BytesDown < int64(len("hello POST body")) {
		t.Errorf("bytes up %d down %d: too few", rec.BytesUp, rec.BytesDown)
	}
}

func TestUnlistedHostIsRefused(t *testing.T) {
	res := &fakeResolver{addrs: map[string][]string{"evil.example": {"1.2.3.4"}}}
	sock, recs := MustProxy(t, Policy{Allow: MustParseRules("api.anthropic.com")}, Options{Resolver: res})
	for _, tc := range []struct{ method, target string }{{"CONNECT", "evil.example:443"}, {"GET", "http://evil.example/"}} {
		var status int
		var body string
		if tc.method == "CONNECT" {
			_, _, status, body = connect(t, sock, tc.target)
		} else {
			resp, err := proxyClient(sock).Get(tc.target)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			status, body = resp.StatusCode, string(b)
		}
		if status != 403 || !strings.Contains(body, ReasonNotAllowed) || strings.Count(body, "\n") != 1 {
			t.Errorf("%s %s: status %d, body %q; want 403 with a one-line reason", tc.method, tc.target, status, body)
		}
		rec := recs.next(t)
		if rec.Allowed || rec.Reason != ReasonNotAllowed || rec.Host != "evil.example" || rec.Status != 403 || rec.Address != "" {
			t.Errorf("record %+v", rec)
		}
	}
	if q := res.questions(); len(q) != 0 {
		t.Errorf("resolved %v for a host it refuses by name", q)
	}
}

func TestListedNameResolvingToPrivateAddressIsRefused(t *testing.T) {
	port := echoServer(t)
	p := strconv.Itoa(port)
	res := &fakeResolver{addrs: map[string][]string{
		"rebind.example": {"127.0.0.1"},
		"mixed.example":  {"93.184.216.34", "10.0.0.7"},
		"meta.example":   {"169.254.169.254"},
	}}
	// 127.0.0.1:PORT is listed too: a literal entry lets only that literal
	// through, never a name that resolves to it.
	sock, recs := MustProxy(t, Policy{Allow: MustParseRules("rebind.example:"+p, "mixed.example", "meta.example", "127.0.0.1:"+p)}, Options{Resolver: res})
	for _, target := range []string{"rebind.example:" + p, "mixed.example:443", "meta.example:80"} {
		_, _, status, body := connect(t, sock, target)
		if status != 403 || !strings.Contains(body, ReasonSpecialAddress) {
			t.Errorf("CONNECT %s: status %d, body %q; want 403 %s", target, status, body, ReasonSpecialAddress)
		}
		if rec := recs.next(t); rec.Allowed || rec.Reason != ReasonSpecialAddress {
			t.Errorf("CONNECT %s: record %+v", target, rec)
		}
	}
	// Listed by address, the same place is reachable.
	for _, target := range []string{"127.0.0.1:" + p} {
		if _, _, status, body := connect(t, sock, target); status != 200 {
			t.Errorf("CONNECT %s: status %d, body %q", target, status, body)
		}
	}
}

func TestOpenModeDialsTheCheckedAddress(t *testing.T) {
	port := echoServer(t)
	res := &fakeResolver{addrs: map[string][]string{"public.example": {"93.184.216.34"}, "private.example": {"192.168.1.10"}}}
	var mu sync.Mutex
	var dialed []string
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, addr)
		mu.Unlock()
		// Any public address lands on the local echo server: there is no
		// internet here.
		var d net.Dialer
		return d.DialContext(ctx, "tcp", "127.0.0.1:"+strconv.Itoa(port))
	}
	sock, recs := MustProxy(t, Policy{Open: true}, Options{Resolver: res, Dial: dial})
	c, _, status, body := connect(t, sock, "public.example:8443")
	if status != 200 {
		t.Fatalf("open mode: CONNECT public.example: %d %s", status, body)
	}
	c.Close()
	if rec := recs.next(t); !rec.Allowed || rec.Address != "93.184.216.34:8443" {
		t.Errorf("record %+v", rec)
	}
	for _, target := range []string{"private.example:443", "127.0.0.1:" + strconv.Itoa(port), "[::1]:443", "169.254.169.254:80"} {
		if _, _, status, _ := connect(t, sock, target); status != 403 {
			t.Errorf("open mode: CONNECT %s: status %d, want 403", target, status)
		}
		if rec := recs.next(t); rec.Allowed || rec.Reason != ReasonSpecialAddress {
			t.Errorf("open mode: CONNECT %s: record %+v", target, rec)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(dialed) != 1 || dialed[0] != "93.184.216.34:8443" {
		t.Errorf("dialed %v, want only the checked public address", dialed)
	}
	if q := res.questions(); len(q) != 2 {
		t.Errorf("questions %v: each name must be resolved once, by the proxy", q)
	}
}

func TestBadRequests(t *testing.T) {
	sock, recs := MustProxy(t, Policy{Open: true}, Options{MaxHeaderBytes: 4 << 10})
	send := func(raw string) (int, string) {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, raw)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%q: %v", raw[:min(len(raw), 40)], err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, _ := send("GET /relative HTTP/1.1\r\nHost: x\r\n\r\n"); status != 400 {
		t.Errorf("origin-form request: %d, want 400", status)
	}
	if rec := recs.next(t); rec.Allowed || !strings.HasPrefix(rec.Reason, ReasonBadRequest) {
		t.Errorf("record %+v", rec)
	}
	if status, _ := send("CONNECT bad_host!:443 HTTP/1.1\r\nHost: bad_host!:443\r\n\r\n"); status != 400 {
		t.Errorf("bad host: %d, want 400", status)
	}
	recs.next(t)
	if status, _ := send("GET http://x/ HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 64<<10) + "\r\n\r\n"); status != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("huge header: %d, want 431", status)
	}
}

func TestResolveFailureIsRecorded(t *testing.T) {
	sock, recs := MustProxy(t, Policy{Open: true}, Options{Resolver: &fakeResolver{}})
	if _, _, status, _ := connect(t, sock, "nowhere.example:443"); status != 502 {
		t.Errorf("status %d, want 502", status)
	}
	if rec := recs.next(t); rec.Allowed || rec.Reason != ReasonResolve {
		t.Errorf("record %+v", rec)
	}
}

func TestDialFailureIsRecorded(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	hostport := ln.Addr().String()
	ln.Close() // nothing listens there now
	sock, recs := MustProxy(t, Policy{Allow: MustParseRules(hostport)}, Options{})
	if _, _, status, _ := connect(t, sock, hostport); status != 502 {
		t.Errorf("status %d, want 502", status)
	}
	if rec := recs.next(t); !rec.Allowed || rec.Error == "" || rec.Status != 502 {
		t.Errorf("record %+v", rec)
	}
}

func TestIdleTunnelIsClosed(t *testing.T) {
	port := echoServer(t)
	hostport := "127.0.0.1:" + strconv.Itoa(port)
	sock, recs := MustProxy(t, Policy{Allow: MustParseRules(hostport)}, Options{IdleTimeout: 200 * time.Millisecond})
	c, br, status, _ := connect(t, sock, hostport)
	if status != 200 {
		t.Fatal(status)
	}
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on an idle tunnel: %v, want the proxy to close it", err)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("closed after %s, before the idle timeout", d)
	}
	if rec := recs.next(t); !rec.Allowed || !strings.Contains(rec.Error, "idle") {
		t.Errorf("record %+v", rec)
	}
}

func TestBusyTunnelIsNotIdle(t *testing.T) {
	port := echoServer(t)
	hostport := "127.0.0.1:" + strconv.Itoa(port)
	sock, recs := MustProxy(t, Policy{Allow: MustParseRules(hostport)}, Options{IdleTimeout: 300 * time.Millisecond, MaxDuration: 1500 * time.Millisecond})
	c, br, status, _ := connect(t, sock, hostport)
	if status != 200 {
		t.Fatal(status)
	}
	// A byte every 50ms keeps it alive past several idle timeouts, until
	// the longest connection time ends it.
	start := time.Now()
	buf := make([]byte, 1)
	var err error
	for time.Since(start) < 20*time.Second {
		if _, err = c.Write([]byte("x")); err != nil {
			break
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err = io.ReadFull(br, buf); err != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if d := time.Since(start); d < time.Second {
		t.Errorf("a busy tunnel ended after %s (%v), before its longest time", d, err)
	}
	rec := recs.next(t)
	if !strings.Contains(rec.Error, "longest allowed") || rec.BytesUp < 5 || rec.BytesUp != rec.BytesDown {
		t.Errorf("record %+v", rec)
	}
}

func TestConcurrentConnectionsAreCapped(t *testing.T) {
	port := echoServer(t)
	hostport := "127.0.0.1:" + strconv.Itoa(port)
	sock, recs := MustProxy(t, Policy{Allow: MustParseRules(hostport)}, Options{MaxConns: 1})
	c, _, status, _ := connect(t, sock, hostport)
	if status != 200 {
		t.Fatal(status)
	}
	if _, _, status, body := connect(t, sock, hostport); status != 503 || !strings.Contains(body, ReasonTooMany) {
		t.Errorf("second connection: %d %q, want 503", status, body)
	}
	if rec := recs.next(t); rec.Allowed || rec.Reason != ReasonTooMany {
		t.Errorf("record %+v", rec)
	}
	c.Close()
	recs.next(t) // the first tunnel's record
	// The slot is free again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, _, status, _ := connect(t, sock, hostport)
		if status == 200 {
			break
		}
		recs.next(t)
		if time.Now().After(deadline) {
			t.Fatalf("slot never freed: %d", status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestServerLifecycle(t *testing.T) {
	dir, err := os.MkdirTemp("", "egress")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	port := echoServer(t)
	policy := Policy{Allow: MustParseRules("127.0.0.1:" + strconv.Itoa(port))}
	log := slog.New(slog.DiscardHandler)
	s1, err := NewServer(dir, Options{}, log)
	if err != nil {
		t.Fatal(err)
	}
	d1, err := s1.Open("task-a", policy)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := s1.Open("task-a", policy); err != nil || d != d1 {
		t.Errorf("second Open = %q, %v; want the same directory", d, err)
	}
	if _, err := s1.Open("../x", policy); err == nil {
		t.Errorf("Open accepted a task id with a slash")
	}
	sock := filepath.Join(d1, SocketName)
	if _, _, status, _ := connect(t, sock, "127.0.0.1:"+strconv.Itoa(port)); status != 200 {
		t.Errorf("status %d", status)
	}

	// A server that stops keeps the directory, which sandboxes mount.
	s1.Shutdown()
	if _, err := os.Stat(d1); err != nil {
		t.Errorf("Shutdown removed the task directory: %v", err)
	}
	if _, err := net.Dial("unix", sock); err == nil {
		t.Errorf("the socket still answers after Shutdown")
	}
	// A stale socket file (a server killed with SIGKILL leaves one) does
	// not stop the next server from listening again.
	if l, err := net.Listen("unix", sock); err == nil {
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		l.Close()
	}
	s2, err := NewServer(dir, Options{}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Shutdown()
	if ids, err := s2.Tasks(); err != nil || len(ids) != 1 || ids[0] != "task-a" {
		t.Errorf("Tasks = %v, %v", ids, err)
	}
	if _, err := s2.Open("task-a", policy); err != nil {
		t.Fatal(err)
	}
	if _, _, status, _ := connect(t, sock, "127.0.0.1:"+strconv.Itoa(port)); status != 200 {
		t.Errorf("after restart: status %d", status)
	}
	if err := s2.Close("task-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d1); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Close left the directory: %v", err)
	}
	if s2.Listening("task-a") {
		t.Errorf("still listening after Close")
	}
	if err := s2.Close("task-a"); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestCloseEndsTunnels(t *testing.T) {
	dir, err := os.MkdirTemp("", "egress")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	port := echoServer(t)
	s, err := NewServer(dir, Options{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	d, err := s.Open("task-b", Policy{Allow: MustParseRules("127.0.0.1:" + strconv.Itoa(port))})
	if err != nil {
		t.Fatal(err)
	}
	c, br, status, _ := connect(t, filepath.Join(d, SocketName), "127.0.0.1:"+strconv.Itoa(port))
	if status != 200 {
		t.Fatal(status)
	}
	s.Close("task-b")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("tunnel still open after Close: %v", err)
	}
}

func mustURL(s string) url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return *u
}

// TestLongDataRoot opens a proxy whose socket path is longer than a unix
// socket address holds, as a deep data root makes it.
func TestLongDataRoot(t *testing.T) {
	base, err := os.MkdirTemp("", "egress")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	dir := filepath.Join(base, strings.Repeat("d", 60), strings.Repeat("e", 60))
	port := echoServer(t)
	hostport := "127.0.0.1:" + strconv.Itoa(port)
	s, err := NewServer(dir, Options{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	tdir, err := s.Open("task-01m8195e9sajg5xacew4wphtxr", Policy{Allow: MustParseRules(hostport)})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(tdir, SocketName)
	if len(sock) <= maxSocketPath {
		t.Fatalf("socket path %d bytes: not long enough for this test", len(sock))
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o666 {
		t.Fatalf("socket %s: %v %v", sock, fi, err)
	}
	// A client reaches it the same way (a sandbox mounts the directory at
	// a short path).
	d, err := os.Open(tdir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	short := fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), SocketName)
	c, _, status, body := connect(t, short, hostport)
	if status != 200 {
		t.Fatalf("CONNECT: %d %s", status, body)
	}
	c.Close()
	s.Shutdown()
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket outlived Shutdown: %v", err)
	}
}
