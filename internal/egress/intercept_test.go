package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// ruledServer is an HTTPS server on 127.0.0.1 that reports the
// Authorization header each request brought.
func ruledServer(t *testing.T) (*httptest.Server, chan seen) {
	t.Helper()
	ch := make(chan seen, 20)
	s := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ch <- seen{path: r.URL.EscapedPath(), query: r.URL.RawQuery, header: r.Header.Clone()}
		if r.URL.Path == "/allowed/redirect" {
			http.Redirect(w, r, "https://elsewhere.example/x", http.StatusFound)
			return
		}
		io.WriteString(w, "host "+r.Host)
	}))
	t.Cleanup(s.Close)
	return s, ch
}

func mustCA(t *testing.T) *CA {
	t.Helper()
	ca, err := LoadCA(filepath.Join(t.TempDir(), "ca"))
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// trustingClient is a client through the proxy at sock that trusts the
// CAs in pem.
func trustingClient(sock string, pems ...[]byte) *http.Client {
	pool := x509.NewCertPool()
	for _, p := range pems {
		pool.AppendCertsFromPEM(p)
	}
	c := proxyClient(sock)
	c.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: pool}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return c
}

func certPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func ruledPolicy(t *testing.T, srv *httptest.Server, prefix string) (Policy, int) {
	t.Helper()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	rules, err := ParseRules([]string{"127.0.0.1:" + strconv.Itoa(port)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseCredential("git", "127.0.0.1:"+strconv.Itoa(port), prefix, "authorization", "Bearer s3cret")
	if err != nil {
		t.Fatal(err)
	}
	return Policy{Allow: rules, Credentials: []Credential{c}}, port
}

// ruledProxy is a task's proxy with a credential rule for srv, an HTTPS
// server on 127.0.0.1 whose requests come out on got.
type ruledProxy struct {
	srv   *httptest.Server
	got   chan seen
	ca    *CA
	proxy *Server
	sock  string
	recs  *records
	port  int
}

// newRuledProxy gives the rule the path prefix prefix; the proxy trusts
// the server's certificate if trust; edit, if set, changes the policy.
func newRuledProxy(t *testing.T, prefix string, trust bool, edit func(*Policy)) *ruledProxy {
	t.Helper()
	r := &ruledProxy{ca: mustCA(t)}
	r.srv, r.got = ruledServer(t)
	opts := Options{CA: r.ca}
	if trust {
		opts.RootCAs = x509.NewCertPool()
		opts.RootCAs.AddCert(r.srv.Certificate())
	}
	var pol Policy
	pol, r.port = ruledPolicy(t, r.srv, prefix)
	if edit != nil {
		edit(&pol)
	}
	r.proxy, r.sock, r.recs = mustServer(t, pol, opts)
	return r
}

func (r *ruledProxy) url(path string) string {
	return "https://127.0.0.1:" + strconv.Itoa(r.port) + path
}

// noRequest fails t if the server got a request.
func (r *ruledProxy) noRequest(t *testing.T, why string) {
	t.Helper()
	select {
	case s := <-r.got:
		t.Errorf("%s: %+v", why, s)
	default:
	}
}

// TestInterceptAddsTheCredential: a request to a host with a rule gets the
// rule's header on the rule's paths only (replacing the sandbox's own),
// goes to the host the CONNECT named whatever its Host header says, and
// is recorded with its method, path and status; a redirect is passed
// back, never followed.
func TestInterceptAddsTheCredential(t *testing.T) {
	r := newRuledProxy(t, "/allowed/", true, nil)
	got, recs, port := r.got, r.recs, r.port
	client := trustingClient(r.sock, r.ca.CertPEM())
	base := r.url("")

	cases := []struct {
		path     string
		own      string // the sandbox's own Authorization
		host     string // a Host header of the sandbox's
		withCred bool
	}{
		{path: "/allowed/repo.git/info/refs?service=git-upload-pack", withCred: true},
		{path: "/allowed", withCred: true},
		{path: "/allowed/x", own: "Bearer mine", withCred: true},
		{path: "/allowed/x", host: "evil.example", withCred: true},
		{path: "/other"},
		{path: "/other", own: "Bearer mine"},
		{path: "/allowedx"},
		{path: "/allowed/../other"},
		{path: "/allowed/%2e%2e/other"},
		{path: "/allowed%2f..%2fother"},
		{path: "/allowed//x"},
		{path: "/allowed/..;/other"},
		{path: "/allowed\\..\\other"},
	}
	for _, c := range cases {
		req, err := http.NewRequest("GET", base+c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.own != "" {
			req.Header.Set("Authorization", c.own)
		}
		if c.host != "" {
			req.Host = c.host
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		s := <-got
		rec := recs.next(t)
		auth := s.header.Get("Authorization")
		switch {
		case c.withCred && auth != "Bearer s3cret":
			t.Errorf("%s: the host got Authorization %q, want the rule's", c.path, auth)
		case !c.withCred && auth != c.own:
			t.Errorf("%s: the host got Authorization %q, want the sandbox's own %q", c.path, auth, c.own)
		}
		if want := "host 127.0.0.1:" + strconv.Itoa(port); string(body) != want {
			t.Errorf("%s: answer %q, want %q (the CONNECT's host)", c.path, body, want)
		}
		path, _, _ := strings.Cut(c.path, "?")
		if rec.Method != "GET" || rec.Host != "127.0.0.1" || rec.Port != port || rec.Status != 200 || !rec.Allowed || rec.Credential != c.withCred || rec.Address == "" {
			t.Errorf("%s: record %+v", c.path, rec)
		}
		if p, _ := strings.CutPrefix(path, "/"); !strings.Contains(rec.Path, strings.SplitN(p, "%", 2)[0]) || strings.Contains(rec.Path, "?") {
			t.Errorf("%s: recorded path %q", c.path, rec.Path)
		}
	}

	resp, err := client.Get(base + "/allowed/redirect")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	<-got
	if rec := recs.next(t); resp.StatusCode != http.StatusFound || rec.Status != http.StatusFound {
		t.Errorf("redirect: %s, recorded %d; want 302 passed back", resp.Status, rec.Status)
	}
	r.noRequest(t, "the proxy followed the redirect")
}

// TestInterceptVerifiesTheHost: the proxy speaks TLS to the host with the
// rule and checks its certificate; one it does not trust is a 502, and no
// credential is sent.
func TestInterceptVerifiesTheHost(t *testing.T) {
	r := newRuledProxy(t, "", false, nil)
	resp, err := trustingClient(r.sock, r.ca.CertPEM()).Get(r.url("/x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	rec := r.recs.next(t)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(rec.Error, "certificate") {
		t.Errorf("untrusted host: %s, record error %q; want 502 and a certificate error", resp.Status, rec.Error)
	}
	r.noRequest(t, "the host got a request")
}

// TestHostsWithoutARuleStayEndToEnd: a host without a rule is tunnelled:
// the worker sees the host's own certificate, not one of the CA.
func TestHostsWithoutARuleStayEndToEnd(t *testing.T) {
	r := newRuledProxy(t, "", false, func(p *Policy) { p.Credentials[0].Port++ }) // the rule is for another port
	srv, recs := r.srv, r.recs
	resp, err := trustingClient(r.sock, r.ca.CertPEM(), certPEM(srv.Certificate())).Get(r.url("/x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !resp.TLS.PeerCertificates[0].Equal(srv.Certificate()) {
		t.Errorf("the worker saw %s's certificate, want the host's own", resp.TLS.PeerCertificates[0].Issuer)
	}
	if rec := recs.next(t); rec.Method != http.MethodConnect || rec.Path != "" || rec.Credential {
		t.Errorf("record %+v, want a tunnel's", rec)
	}
}

// TestInterceptRecordsADistrustingWorker: a worker that does not trust the
// CA sends no request; the tunnel is recorded with why.
func TestInterceptRecordsADistrustingWorker(t *testing.T) {
	r := newRuledProxy(t, "", true, nil)
	_, err := trustingClient(r.sock, certPEM(r.srv.Certificate())).Get(r.url("/x"))
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a worker without the CA: %v, want a certificate error", err)
	}
	if rec := r.recs.next(t); !strings.Contains(rec.Error, "egress CA") || rec.Credential {
		t.Errorf("record %+v", rec)
	}
	r.noRequest(t, "the host got a request")
}

// TestInterceptFollowsThePolicy: an intercepted tunnel to a host the
// policy no longer allows is closed; a rule taken away adds nothing to
// the next request of a tunnel that stays.
func TestInterceptFollowsThePolicy(t *testing.T) {
	r := newRuledProxy(t, "", true, nil)
	got, recs, srvObj, ca := r.got, r.recs, r.proxy, r.ca
	pol := srvObj.tasks["t1"].proxy.Policy()
	c, br, status, _ := connect(t, r.sock, "127.0.0.1:"+strconv.Itoa(r.port))
	if status != 200 {
		t.Fatalf("CONNECT: %d", status)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM())
	tc := tls.Client(&tunnelConn{Conn: c, r: br}, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	tr := bufio.NewReader(tc)
	get := func() (string, error) {
		req, _ := http.NewRequest("GET", "https://127.0.0.1/x", nil)
		if err := req.Write(tc); err != nil {
			return "", err
		}
		resp, err := http.ReadResponse(tr, req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		s := <-got
		recs.next(t)
		return s.header.Get("Authorization"), nil
	}
	if a, err := get(); err != nil || a != "Bearer s3cret" {
		t.Fatalf("first request: %q %v", a, err)
	}
	without := pol
	without.Credentials = nil
	if err := srvObj.SetPolicy("t1", without); err != nil {
		t.Fatal(err)
	}
	if a, err := get(); err != nil || a != "" {
		t.Fatalf("after the rule went: Authorization %q (%v), want none", a, err)
	}
	if err := srvObj.SetPolicy("t1", Policy{}); err != nil {
		t.Fatal(err)
	}
	tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := get(); err == nil {
		t.Fatalf("the tunnel outlived a policy that no longer allows its host")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the tunnel was not closed: %v", err)
	}
}

// TestLoadCA: servers sharing a directory that start together get the
// same CA; its key is the owner's only, and refused otherwise; its leaves
// verify for their host.
func TestLoadCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	cas := make([]*CA, 4)
	var wg sync.WaitGroup
	for i := range cas {
		wg.Go(func() {
			ca, err := LoadCA(dir)
			if err != nil {
				t.Error(err)
			}
			cas[i] = ca
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, ca := range cas[1:] {
		if !bytes.Equal(ca.CertPEM(), cas[0].CertPEM()) {
			t.Fatalf("servers starting together made different CAs")
		}
	}
	fi, err := os.Stat(filepath.Join(dir, caKeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi.Mode(), err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cas[0].CertPEM())
	for _, host := range []string{"git.example.com", "127.0.0.1", "::1"} {
		l, err := cas[1].leaf(host)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: pool}); err != nil {
			t.Errorf("leaf for %s: %v", host, err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, caKeyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(dir); err == nil || !strings.Contains(err.Error(), "0600") {
		t.Errorf("a key others can read: %v, want refused", err)
	}
}

func TestParseCredential(t *testing.T) {
	good := []struct{ host, prefix, header, wantHost, wantPrefix string }{
		{"GIT.example.com.", "", "authorization", "git.example.com", ""},
		{"git.example.com:8443", "/org/", "X-Token", "git.example.com", "/org"},
		{"[::1]:443", "/", "Private-Token", "::1", ""},
	}
	for _, g := range good {
		c, err := ParseCredential("n", g.host, g.prefix, g.header, "v")
		if err != nil || c.Host != g.wantHost || c.PathPrefix != g.wantPrefix {
			t.Errorf("ParseCredential(%q, %q) = %+v, %v", g.host, g.prefix, c, err)
		}
	}
	bad := []struct{ host, prefix, header, value, want string }{
		{"*.example.com", "", "Authorization", "v", "wildcards"},
		{"model-0.corral.invalid", "", "Authorization", "v", "keeps for itself"},
		{"h:0", "", "Authorization", "v", "bad port"},
		{"h", "org", "Authorization", "v", "absolute"},
		{"h", "/a/../b", "Authorization", "v", "clean"},
		{"h", "", "Host", "v", "cannot be the header"},
		{"h", "", "Proxy-Authorization", "v", "cannot be the header"},
		{"h", "", "Bad Header", "v", "cannot be the header"},
		{"h", "", "Authorization", "", "empty"},
		{"h", "", "Authorization", "a\r\nX: y", "spans lines"},
	}
	for _, b := range bad {
		if _, err := ParseCredential("n", b.host, b.prefix, b.header, b.value); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("ParseCredential(%q, %q, %q): %v, want %q", b.host, b.prefix, b.header, err, b.want)
		} else if strings.Contains(err.Error(), b.value) && b.value != "" && len(b.value) > 1 {
			t.Errorf("the error shows the secret: %v", err)
		}
	}
}

// TestInterceptRefusesOtherUpgrades: on an intercepted host too, an upgrade
// to anything but WebSocket (h2c: requests on any path, the rule's
// credential unchecked) is refused before it reaches the host.
func TestInterceptRefusesOtherUpgrades(t *testing.T) {
	r := newRuledProxy(t, "/allowed/", true, nil)
	client := trustingClient(r.sock, r.ca.CertPEM())
	req, err := http.NewRequest("GET", r.url("/allowed/x"), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Connection", "Upgrade, HTTP2-Settings")
	req.Header.Set("Upgrade", "h2c")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if rec := r.recs.next(t); resp.StatusCode != http.StatusForbidden || rec.Allowed || rec.Reason != ReasonUpgrade {
		t.Errorf("Upgrade: h2c answered %s, record %+v; want 403 for %q", resp.Status, rec, ReasonUpgrade)
	}
	r.noRequest(t, "a refused upgrade reached the host")
}
