package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Credential is a credential rule: on HTTPS requests to Host:Port whose
// path is PathPrefix or below it, the proxy sets header Header to Value.
// The sandbox never holds Value; it reaches the host through the proxy,
// which ends its TLS with a certificate of the server's CA (CA) and speaks
// TLS to the host itself, verifying the host's certificate.
type Credential struct {
	// Name names the rule in configuration and events; never the value.
	Name string
	// Host is the host name or IP literal, normalized (canonicalHost).
	Host string
	// Port is the host's port, 443 when 0.
	Port int
	// PathPrefix, if not "" or "/", limits the rule to that path and the
	// paths below it (segment by segment: "/org" covers "/org/x", not
	// "/orgx"). Only a plain path gets the credential: one with dot
	// segments, doubled slashes, encoded slashes, dots or backslashes, or
	// semicolons, which a server might read as another path, does not.
	PathPrefix string
	// Header and Value are what is set.
	Header, Value string
}

// ParseCredential checks a rule's fields and returns it normalized.
func ParseCredential(name, hostport, pathPrefix, header, value string) (Credential, error) {
	c := Credential{Name: name, Header: http.CanonicalHeaderKey(header), Value: value, Port: 443}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	} else if c.Port, err = strconv.Atoi(port); err != nil || c.Port < 1 || c.Port > 65535 {
		return c, fmt.Errorf("credential %s: bad port in %q", name, hostport)
	}
	h, ok := canonicalHost(host)
	if !ok || strings.HasPrefix(h, "*") {
		return c, fmt.Errorf("credential %s: %q is not a host name or IP address (wildcards are not taken)", name, hostport)
	}
	if _, model := modelIndex(h); model {
		return c, fmt.Errorf("credential %s: %q is a name the proxy keeps for itself", name, hostport)
	}
	c.Host = h
	if pathPrefix != "" {
		if !strings.HasPrefix(pathPrefix, "/") || !plainPath(pathPrefix) {
			return c, fmt.Errorf("credential %s: path_prefix %q: want an absolute, clean path (/org/repo)", name, pathPrefix)
		}
		c.PathPrefix = strings.TrimSuffix(pathPrefix, "/")
	}
	if !validHeaderName(c.Header) || forbiddenCredentialHeader(c.Header) {
		return c, fmt.Errorf("credential %s: %q cannot be the header (want a request header such as Authorization)", name, header)
	}
	if value == "" || strings.ContainsAny(value, "\r\n\x00") {
		return c, fmt.Errorf("credential %s: its secret is empty or spans lines", name)
	}
	return c, nil
}

func validHeaderName(h string) bool {
	if h == "" {
		return false
	}
	for _, r := range h {
		if r > 0x7e || r <= ' ' || strings.ContainsRune("\"(),/:;<=>?@[\\]{}", r) {
			return false
		}
	}
	return true
}

// forbiddenCredentialHeader: headers that route or frame a request (the
// hop-by-hop ones among them, Proxy-Authorization too), which a rule
// must not set.
func forbiddenCredentialHeader(h string) bool {
	switch h {
	case "Host", "Content-Length", "Content-Type", "Content-Encoding", "Expect":
		return true
	}
	return slices.Contains(hopHeaders, h)
}

// String names the rule without its value.
func (c Credential) String() string {
	return fmt.Sprintf("%s (%s on %s%s)", c.Name, c.Header, net.JoinHostPort(c.Host, strconv.Itoa(c.Port)), c.PathPrefix)
}

// covers reports whether the rule gives its credential to a request for
// this path (as sent: escaped).
func (c Credential) covers(u *url.URL) bool {
	if c.PathPrefix == "" {
		return true
	}
	p, esc := u.Path, strings.ToLower(u.EscapedPath())
	if !plainPath(p) || strings.Contains(esc, "%2f") || strings.Contains(esc, "%2e") || strings.Contains(esc, "%5c") {
		return false
	}
	return p == c.PathPrefix || strings.HasPrefix(p, c.PathPrefix+"/")
}

// plainPath: absolute, no dot segments, doubled slashes, backslashes or
// semicolons.
func plainPath(p string) bool {
	if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "\\;\x00") {
		return false
	}
	return path.Clean(p) == p || path.Clean(p)+"/" == p
}

// credentialsFor are the policy's rules for host on port.
func (p Policy) credentialsFor(host string, port int) []Credential {
	var out []Credential
	for _, c := range p.Credentials {
		if c.Host == host && c.Port == port {
			out = append(out, c)
		}
	}
	return out
}

// deniedError is a dial the policy refused.
type deniedError struct {
	status int
	reason string
}

func (e *deniedError) Error() string { return e.reason }

// intercept serves a CONNECT to a host with credential rules: the worker's
// TLS ends here, under a certificate of the CA, and each request in the
// tunnel is sent on to the host over TLS (its certificate verified), with
// the credential of the first rule that covers its path, and recorded.
func (p *Proxy) intercept(w http.ResponseWriter, rec *Record) {
	if !p.Policy().decide(rec.Host, rec.Port).allowed {
		p.deny(w, rec, http.StatusForbidden, ReasonNotAllowed)
		return
	}
	leaf, err := p.opts.CA.leaf(rec.Host)
	if err != nil {
		p.fail(w, rec, http.StatusInternalServerError, err)
		return
	}
	tn := tunnel{host: rec.Host, port: rec.Port, model: -1, special: specialLiteral(rec.Host)}
	client, in, ok := p.takeOver(w, rec, tn)
	if !ok {
		return
	}
	defer p.untrack(client)
	tc := tls.Server(&tunnelConn{Conn: client, r: in}, &tls.Config{
		Certificates: []tls.Certificate{*leaf},
		NextProtos:   []string{"http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.ReadHeaderTimeout)
	err = tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		// No request came: the tunnel is the attempt to record.
		client.Close()
		rec.Allowed = true
		rec.Error = "the worker's TLS handshake failed (does it trust the egress CA?): " + err.Error()
		p.finish(rec)
		return
	}
	transport := p.interceptTransport(rec.Host, rec.Port)
	defer transport.CloseIdleConnections()
	base := &url.URL{Scheme: "https", Host: net.JoinHostPort(rec.Host, strconv.Itoa(rec.Port))}
	if rec.Port == 443 {
		base.Host = hostForURL(rec.Host)
	}
	p.serveTunnel(tc, p.relayHandler(rec.Host, rec.Port, transport, func(r *http.Request) (relayTarget, string) {
		t := relayTarget{url: &url.URL{Scheme: base.Scheme, Host: base.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}}
		for _, c := range p.Policy().credentialsFor(rec.Host, rec.Port) {
			if c.covers(r.URL) {
				t.header, t.value = c.Header, c.Value
				break
			}
		}
		return t, ""
	}))
}

// specialLiteral: host names an address no name may reach (loopback,
// private, ...) by itself, so only a rule naming it lets it through.
func specialLiteral(host string) bool {
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && Special(a)
}

func hostForURL(h string) string {
	if strings.Contains(h, ":") {
		return "[" + h + "]"
	}
	return h
}

// interceptTransport reaches host:port over TLS verified against
// Options.RootCAs, each connection dialled through the policy (which may
// have changed since the tunnel opened).
func (p *Proxy) interceptTransport(host string, port int) *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			rec := Record{Host: host, Port: port}
			conn, status, reason, err := p.dialChecked(ctx, &rec)
			if reason != "" {
				return nil, &deniedError{status: status, reason: reason}
			}
			return conn, err
		},
		TLSClientConfig:       &tls.Config{RootCAs: p.opts.RootCAs, ServerName: host, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   p.opts.DialTimeout,
		ResponseHeaderTimeout: p.opts.IdleTimeout,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   2,
	}
}

// asDenied tells a dial the policy refused from other upstream errors.
func asDenied(err error) (*deniedError, bool) {
	var d *deniedError
	return d, errors.As(err, &d)
}
