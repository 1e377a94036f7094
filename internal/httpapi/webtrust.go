package httpapi

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// A web page the user visits can send requests to the server: a "simple"
// cross-site request (a form's POST, a fetch with a text/plain body) goes
// out without asking, and a page whose name the attacker rebinds to
// 127.0.0.1 can even read the answers. Without a token, nothing else stands
// in its way. So every route but the worker's (signed, and reached over the
// unix socket) answers only requests whose Host names this server and whose
// Origin, if any, is this server's own or a listed one, and JSON routes
// take only bodies declared JSON, which a page cannot send without a CORS
// preflight that this server never grants.

// errUnsupportedMediaType is a request body of a type the route does not
// take: 415.
var errUnsupportedMediaType = fmt.Errorf("unsupported media type: %w", errdefs.ErrInvalidArgument)

// webTrust holds what checkWebTrust accepts besides the loopback names.
type webTrust struct {
	listenHost string     // the configured listen address's host, if it is a name
	hosts      []hostPort // Options.AllowedHosts
	origins    []string   // Options.AllowedOrigins, lowercased
}

// hostPort is a Host header value; port "" matches any port.
type hostPort struct{ host, port string }

func newWebTrust(opts Options) webTrust {
	var t webTrust
	if host, _, err := net.SplitHostPort(opts.Listen); err == nil {
		if _, err := netip.ParseAddr(host); err != nil && host != "" {
			t.listenHost = strings.ToLower(host)
		}
	}
	for _, h := range opts.AllowedHosts {
		host, port := splitHost(h)
		t.hosts = append(t.hosts, hostPort{host, port})
	}
	for _, o := range opts.AllowedOrigins {
		t.origins = append(t.origins, strings.TrimSuffix(strings.ToLower(o), "/"))
	}
	return t
}

// splitHost splits a Host header value, lowercased, into its host (IPv6
// without brackets) and its port ("" if none).
func splitHost(v string) (host, port string) {
	v = strings.ToLower(v)
	if h, p, err := net.SplitHostPort(v); err == nil {
		return h, p
	}
	return strings.TrimSuffix(strings.TrimPrefix(v, "["), "]"), ""
}

// checkWebTrust refuses a request a web page may have made against the
// user's will: a Host that is not a name of this server (DNS rebinding) or
// an Origin of another site (a cross-site request).
func (s *Server) checkWebTrust(r *http.Request) error {
	if !s.trust.hostAllowed(r) {
		return fmt.Errorf("the Host header %q is not a name of this server: use 127.0.0.1, localhost or the listen address, or add the name to http.allowed_hosts (behind a reverse proxy, for a LAN name): %w", r.Host, errdefs.ErrPermissionDenied)
	}
	for _, o := range r.Header.Values("Origin") {
		if !s.trust.originAllowed(o, r.Host) {
			return fmt.Errorf("the Origin header %q is not this server's: requests from other sites' pages are refused; add the origin to http.allowed_origins to allow it: %w", o, errdefs.ErrPermissionDenied)
		}
	}
	return nil
}

// hostAllowed reports whether r's Host names this server: a listed host;
// or, with the port the request came in on, localhost, a loopback
// address, the address the request came in on, or the listen address's
// name.
func (t webTrust) hostAllowed(r *http.Request) bool {
	host, port := splitHost(r.Host)
	if host == "" {
		return false
	}
	for _, h := range t.hosts {
		if h.host == host && (h.port == "" || h.port == port) {
			return true
		}
	}
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	localAddr, err := netip.ParseAddrPort(local.String())
	if err != nil {
		return false
	}
	if port == "" {
		port = "80"
	}
	if port != fmt.Sprint(localAddr.Port()) {
		return false
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		ip = ip.Unmap()
		return ip.IsLoopback() || ip == localAddr.Addr().Unmap()
	}
	return host == "localhost" || host == t.listenHost
}

// originAllowed reports whether origin is the server's own (the page was
// served from the Host the request names, already checked) or listed.
func (t webTrust) originAllowed(origin, host string) bool {
	o := strings.ToLower(origin)
	h := strings.ToLower(host)
	return o == "http://"+h || o == "https://"+h || slices.Contains(t.origins, strings.TrimSuffix(o, "/"))
}

// checkJSONBody refuses a POST, PUT or PATCH whose body is not declared
// application/json (with at most charset=utf-8). A request with no body
// may leave Content-Type out.
func checkJSONBody(r *http.Request) error {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
	default:
		return nil
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		if r.ContentLength == 0 {
			return nil
		}
		return fmt.Errorf("the request body has no Content-Type: send Content-Type: application/json: %w", errUnsupportedMediaType)
	}
	mt, params, err := mime.ParseMediaType(ct)
	ok := err == nil && mt == "application/json"
	for k, v := range params {
		ok = ok && k == "charset" && strings.EqualFold(v, "utf-8")
	}
	if !ok {
		return fmt.Errorf("the Content-Type %q is not accepted here: send Content-Type: application/json: %w", ct, errUnsupportedMediaType)
	}
	return nil
}
