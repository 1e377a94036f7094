package egress

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/logkey"
)

// Defaults of Options.
const (
	DefaultDialTimeout       = 10 * time.Second
	DefaultIdleTimeout       = 5 * time.Minute
	DefaultMaxDuration       = time.Hour
	DefaultMaxConns          = 64
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultReadHeaderTimeout = 30 * time.Second
)

// Reasons a Record gives for a denied attempt.
const (
	ReasonNotAllowed     = "host not in the allowlist"
	ReasonSpecialAddress = "resolves to a loopback, private or other non-public address"
	ReasonTooMany        = "too many concurrent connections"
	ReasonBadRequest     = "not a proxy request"
	ReasonResolve        = "cannot resolve host"
)

// Resolver looks up a host's addresses; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Options configure a Proxy. Zero values take the defaults.
type Options struct {
	// Resolver resolves host names; net.DefaultResolver when nil.
	Resolver Resolver
	// Dial connects to an address the proxy checked (an IP and a port);
	// a net.Dialer when nil.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// OnConnection receives one Record per attempt when it ends (or is
	// refused). It is called on the connection's goroutine and must not
	// block.
	OnConnection func(Record)
	// DialTimeout bounds resolving and connecting.
	DialTimeout time.Duration
	// IdleTimeout ends a connection with no bytes in either direction.
	IdleTimeout time.Duration
	// MaxDuration ends any connection, busy or not.
	MaxDuration time.Duration
	// MaxConns bounds one task's concurrent connections and requests.
	MaxConns int
	// MaxHeaderBytes bounds a request's header.
	MaxHeaderBytes int
	// ReadHeaderTimeout bounds reading a request's header.
	ReadHeaderTimeout time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// RootCAs verify the certificates of the model APIs (Model) and of
	// the hosts with credential rules (Credential); the system's when nil.
	RootCAs *x509.CertPool
	// CA signs the certificates the proxy presents to a worker for the
	// hosts with credential rules. Without one, no host is intercepted
	// and credential rules add nothing.
	CA *CA
}

func (o *Options) defaults() {
	if o.Resolver == nil {
		o.Resolver = net.DefaultResolver
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.Dial == nil {
		d := &net.Dialer{}
		o.Dial = d.DialContext
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxDuration <= 0 {
		o.MaxDuration = DefaultMaxDuration
	}
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.MaxHeaderBytes <= 0 {
		o.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if o.ReadHeaderTimeout <= 0 {
		o.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.OnConnection == nil {
		o.OnConnection = func(Record) {}
	}
}

// Record is one connection attempt through the proxy.
type Record struct {
	TaskID string
	// Method is CONNECT or the forwarded request's method.
	Method string
	Host   string // as the worker asked, normalized
	Port   int
	// Path is the path of a plain HTTP request, a relayed model API
	// request or an intercepted HTTPS request (at most 256 bytes, never
	// its query): what was asked of the host, where the proxy sees it.
	// "" for a tunnel, whose requests the proxy does not read.
	Path string
	// Credential says the proxy added a credential to the request: the
	// agent's key (a model API's relay) or a credential rule's header
	// (an intercepted HTTPS request).
	Credential bool
	// Address is the IP and port the proxy connected to ("" if none).
	Address string
	// Allowed is the policy's decision; Reason says why it denied.
	Allowed bool
	Reason  string
	// Error is why an allowed connection failed or ended early ("" if it
	// did not): a failed dial, a timeout.
	Error string
	// Status is the HTTP status the worker got: the proxy's own refusal,
	// 200 for an established tunnel, or the upstream's for plain HTTP.
	Status int
	// BytesUp and BytesDown count the bytes sent to and received from the
	// upstream host.
	BytesUp, BytesDown int64
	Start              time.Time
	Duration           time.Duration
}

// Proxy serves one task's proxy requests. It is an http.Handler meant for
// an http.Server (Server sets one up per task, with the header limits of
// Options). It is safe for concurrent use.
type Proxy struct {
	taskID string
	policy atomic.Pointer[Policy]
	opts   Options
	log    *slog.Logger
	sem    chan struct{}

	mu      sync.Mutex
	tunnels map[net.Conn]tunnel // connections in use, closed by CloseTunnels and by a policy that no longer allows them
	closed  bool
}

// NewProxy returns the proxy of task taskID under policy.
func NewProxy(taskID string, policy Policy, opts Options, log *slog.Logger) *Proxy {
	opts.defaults()
	p := &Proxy{
		taskID:  taskID,
		opts:    opts,
		log:     log.With(logkey.TaskID, taskID),
		sem:     make(chan struct{}, opts.MaxConns),
		tunnels: map[net.Conn]tunnel{},
	}
	p.policy.Store(&policy)
	return p
}

// Policy is the proxy's policy now.
func (p *Proxy) Policy() Policy { return *p.policy.Load() }

// ServeHTTP handles CONNECT and absolute-URI HTTP requests.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := Record{TaskID: p.taskID, Method: r.Method, Start: p.opts.Now()}
	select {
	case p.sem <- struct{}{}:
		defer func() { <-p.sem }()
	default:
		host, port, _ := target(r)
		rec.Host, rec.Port = host, port
		p.deny(w, &rec, http.StatusServiceUnavailable, ReasonTooMany)
		return
	}
	if r.Method == http.MethodConnect {
		if host, port, err := target(r); err == nil {
			if i, ok := modelIndex(host); ok {
				rec.Host, rec.Port = host, 80
				p.relayModel(w, &rec, i)
				return
			}
			if p.opts.CA != nil && len(p.Policy().credentialsFor(host, port)) > 0 {
				rec.Host, rec.Port = host, port
				p.intercept(w, &rec)
				return
			}
		}
		p.connect(w, r, &rec)
		return
	}
	p.forward(w, r, &rec)
}

// target is the host and port a request asks for.
func target(r *http.Request) (host string, port int, err error) {
	hostport, def := r.Host, 443
	if r.Method != http.MethodConnect {
		if r.URL.Scheme != "http" || r.URL.Host == "" {
			return "", 0, errors.New("only absolute http:// URLs are forwarded; use CONNECT for https")
		}
		hostport, def = r.URL.Host, 80
	}
	host, portStr, err := net.SplitHostPort(hostport)
	if err != nil {
		host, portStr = hostport, strconv.Itoa(def)
	}
	port, err = strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return host, 0, fmt.Errorf("bad port %q", portStr)
	}
	h, ok := canonicalHost(host)
	if !ok {
		return host, port, fmt.Errorf("bad host %q", host)
	}
	return h, port, nil
}

// deny answers with status and a one-line reason, and records it.
func (p *Proxy) deny(w http.ResponseWriter, rec *Record, status int, reason string) {
	rec.Reason, rec.Status = reason, status
	p.finish(rec)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Connection", "close")
	w.WriteHeader(status)
	fmt.Fprintf(w, "corral egress: %s denied: %s\n", net.JoinHostPort(rec.Host, strconv.Itoa(rec.Port)), reason)
}

// fail answers an allowed request that could not be served with 502 or 504.
func (p *Proxy) fail(w http.ResponseWriter, rec *Record, status int, err error) {
	rec.Error, rec.Status = err.Error(), status
	p.finish(rec)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	fmt.Fprintf(w, "corral egress: %s: %s\n", net.JoinHostPort(rec.Host, strconv.Itoa(rec.Port)), oneLine(rec.Error))
}

func (p *Proxy) finish(rec *Record) {
	rec.Duration = p.opts.Now().Sub(rec.Start)
	p.opts.OnConnection(*rec)
	lvl := slog.LevelDebug
	if !rec.Allowed {
		lvl = slog.LevelInfo
	}
	p.log.Log(context.Background(), lvl, "egress connection", "host", rec.Host, "port", rec.Port, "allowed", rec.Allowed,
		"reason", rec.Reason, "bytes_up", rec.BytesUp, "bytes_down", rec.BytesDown)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// dialChecked decides, resolves, checks the addresses and dials one of
// them. It returns the HTTP status and denial reason when the policy
// refuses, or the status and error when the dial fails.
func (p *Proxy) dialChecked(ctx context.Context, rec *Record) (net.Conn, int, string, error) {
	d := p.Policy().decide(rec.Host, rec.Port)
	if !d.allowed {
		return nil, http.StatusForbidden, ReasonNotAllowed, nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.DialTimeout)
	defer cancel()
	var addrs []netip.Addr
	switch a, err := netip.ParseAddr(rec.Host); {
	case err == nil:
		addrs = []netip.Addr{a}
	case rec.Host == "localhost":
		// RFC 6761: localhost is loopback, never a DNS question.
		addrs = []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}
	default:
		addrs, err = p.opts.Resolver.LookupNetIP(ctx, "ip", rec.Host)
		if err != nil || len(addrs) == 0 {
			return nil, http.StatusBadGateway, ReasonResolve, nil
		}
	}
	// Every address must pass: a name that answers with a public and a
	// private address is refused, whichever would be dialled.
	for _, a := range addrs {
		if Special(a) && !d.literal {
			return nil, http.StatusForbidden, ReasonSpecialAddress, nil
		}
	}
	rec.Allowed = true
	var errs []error
	for _, a := range addrs {
		addr := netip.AddrPortFrom(a.Unmap(), uint16(rec.Port)).String()
		c, err := p.opts.Dial(ctx, "tcp", addr)
		if err == nil {
			rec.Address = addr
			return c, 0, "", nil
		}
		errs = append(errs, err)
	}
	status := http.StatusBadGateway
	if ctx.Err() != nil {
		status = http.StatusGatewayTimeout
	}
	return nil, status, "", fmt.Errorf("connect: %w", errors.Join(errs...))
}

// open reads the request's target into rec, checks it and dials it; nil
// when it was refused or could not be reached, which it has answered.
func (p *Proxy) open(w http.ResponseWriter, r *http.Request, rec *Record) net.Conn {
	host, port, err := target(r)
	rec.Host, rec.Port = host, port
	if err != nil {
		p.deny(w, rec, http.StatusBadRequest, ReasonBadRequest+": "+err.Error())
		return nil
	}
	conn, status, reason, err := p.dialChecked(r.Context(), rec)
	switch {
	case reason != "":
		p.deny(w, rec, status, reason)
		return nil
	case err != nil:
		p.fail(w, rec, status, err)
		return nil
	}
	return conn
}

// connect serves CONNECT: it checks and dials the target, then tunnels
// bytes both ways until either side ends, the connection idles for
// IdleTimeout or it has lasted MaxDuration.
func (p *Proxy) connect(w http.ResponseWriter, r *http.Request, rec *Record) {
	up := p.open(w, r, rec)
	if up == nil {
		return
	}
	defer up.Close()
	client, in, ok := p.takeOver(w, rec, tunnelTo(rec))
	if !ok {
		return
	}
	defer client.Close()
	defer p.untrack(client)
	rec.Error = p.pipe(client, in, up, rec)
	p.finish(rec)
}

// takeOver hijacks a CONNECT's connection, tracks it (CloseTunnels ends
// it) and answers 200; in reads what the worker sends next, bytes it sent
// after its CONNECT (a TLS hello) included. When it cannot, it has
// answered or recorded why, and ok is false.
func (p *Proxy) takeOver(w http.ResponseWriter, rec *Record, tn tunnel) (client net.Conn, in io.Reader, ok bool) {
	rc := http.NewResponseController(w)
	client, brw, err := rc.Hijack()
	if err != nil {
		p.fail(w, rec, http.StatusInternalServerError, fmt.Errorf("take over the connection: %w", err))
		return nil, nil, false
	}
	if !p.track(client, tn) {
		client.Close()
		rec.Error = "proxy closed"
		p.finish(rec)
		return nil, nil, false
	}
	rec.Status = http.StatusOK
	client.SetDeadline(time.Time{}) // the server's read and write deadlines no longer apply
	if _, err := client.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		p.untrack(client)
		client.Close()
		rec.Error = "write to worker: " + err.Error()
		p.finish(rec)
		return nil, nil, false
	}
	in = client
	if n := brw.Reader.Buffered(); n > 0 {
		buffered, _ := brw.Reader.Peek(n)
		in = io.MultiReader(strings.NewReader(string(buffered)), client)
	}
	return client, in, true
}

// pipe copies client→up and up→client until both directions end, or the
// pair idles for IdleTimeout, or MaxDuration passes. It counts the bytes
// in rec and returns why it stopped early ("" when both sides ended).
func (p *Proxy) pipe(client net.Conn, in io.Reader, up net.Conn, rec *Record) string {
	var last atomic.Int64 // unix nanoseconds of the last byte either way
	last.Store(p.opts.Now().UnixNano())
	var (
		mu      sync.Mutex
		why     string
		stopped bool
	)
	// stop ends both directions: a deadline in the past wakes their reads.
	stop := func(reason string) {
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			stopped, why = true, reason
		}
		client.SetDeadline(time.Unix(1, 0))
		up.SetDeadline(time.Unix(1, 0))
	}
	isStopped := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return stopped
	}
	total := time.AfterFunc(p.opts.MaxDuration, func() {
		stop(fmt.Sprintf("ended after the longest allowed connection time, %s", p.opts.MaxDuration))
	})
	defer total.Stop()

	var up64, down64 atomic.Int64
	copyDir := func(dst net.Conn, src io.Reader, srcConn net.Conn, n *atomic.Int64) {
		buf := make([]byte, 32<<10)
		for {
			srcConn.SetReadDeadline(p.opts.Now().Add(p.opts.IdleTimeout))
			// stop marks the pair stopped before it sets its deadline in
			// the past, so a stop that raced the line above is seen here.
			if isStopped() {
				return
			}
			k, err := src.Read(buf)
			if k > 0 {
				last.Store(p.opts.Now().UnixNano())
				if _, werr := dst.Write(buf[:k]); werr != nil {
					stop("")
					return
				}
				n.Add(int64(k))
			}
			if err == nil {
				continue
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !isStopped() {
				if idle := p.opts.Now().Sub(time.Unix(0, last.Load())); idle < p.opts.IdleTimeout {
					continue // the other direction is busy
				}
				stop(fmt.Sprintf("idle for %s", p.opts.IdleTimeout))
				return
			}
			// EOF or an error: pass the end on and let the other direction finish.
			if cw, ok := dst.(interface{ CloseWrite() error }); ok && err == io.EOF {
				cw.CloseWrite()
			} else {
				stop("")
			}
			return
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); copyDir(up, in, client, &up64) }()
	go func() { defer wg.Done(); copyDir(client, up, up, &down64) }()
	wg.Wait()
	rec.BytesUp, rec.BytesDown = up64.Load(), down64.Load()
	mu.Lock()
	defer mu.Unlock()
	return why
}

// tunnel is what a tracked connection reaches: a host and port (with
// whether its address is a special one), or the policy's model API number
// model (from 0), api.
type tunnel struct {
	host    string
	port    int
	special bool
	model   int
	api     Model
}

// tunnelTo is the tunnel of a connection rec let through.
func tunnelTo(rec *Record) tunnel {
	special := true
	if ap, err := netip.ParseAddrPort(rec.Address); err == nil {
		special = Special(ap.Addr())
	}
	return tunnel{host: rec.Host, port: rec.Port, special: special, model: -1}
}

// allowedBy reports whether pol lets the tunnel through, as it would let
// a new connection (for a model API: the same API at the same number).
func (tn tunnel) allowedBy(pol Policy) bool {
	if tn.model >= 0 {
		return tn.model < len(pol.Models) && pol.Models[tn.model].same(tn.api)
	}
	d := pol.decide(tn.host, tn.port)
	return d.allowed && (!tn.special || d.literal)
}

// track tracks c, unless the proxy closed or its policy changed since c's
// target was checked and no longer lets it through.
func (p *Proxy) track(c net.Conn, tn tunnel) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || !tn.allowedBy(p.Policy()) {
		return false
	}
	p.tunnels[c] = tn
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.tunnels, c)
	p.mu.Unlock()
}

// CloseTunnels ends every open CONNECT tunnel and refuses new ones; an
// http.Server does not track hijacked connections, so Server calls this
// when the task's listener closes.
func (p *Proxy) CloseTunnels() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for c := range p.tunnels {
		c.Close()
	}
}

// SetPolicy gives the proxy pol from now on: every new connection meets
// it, and the open ones it does not let through are closed before it
// returns (tunnels, relays to a model API it no longer has, plain HTTP
// requests being forwarded).
func (p *Proxy) SetPolicy(pol Policy) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.policy.Store(&pol)
	for c, tn := range p.tunnels {
		if !tn.allowedBy(pol) {
			c.Close()
			delete(p.tunnels, c)
		}
	}
}

// hopHeaders are removed from forwarded requests and responses (RFC 9110
// §7.6.1), with the headers a Connection header names.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// forward serves a plain HTTP request with an absolute URI: one upstream
// connection per request, closed after the response.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, rec *Record) {
	rec.Path = clipString(r.URL.Path, maxAuditPath)
	conn := p.open(w, r, rec)
	if conn == nil {
		return
	}
	up := &countingConn{Conn: conn}
	defer up.Close()
	if !p.track(up, tunnelTo(rec)) {
		p.fail(w, rec, http.StatusServiceUnavailable, errors.New("proxy closed"))
		return
	}
	defer p.untrack(up)
	ctx, cancel := context.WithTimeout(r.Context(), p.opts.MaxDuration)
	defer cancel()
	stopTimer := context.AfterFunc(ctx, func() { up.SetDeadline(time.Unix(1, 0)) })
	defer stopTimer()

	out := r.Clone(ctx)
	out.RequestURI = ""
	out.Header = r.Header.Clone()
	removeHop(out.Header)
	out.Close = true
	out.Host = r.URL.Host
	if out.Header.Get("User-Agent") == "" {
		out.Header["User-Agent"] = []string{""} // Write would add Go's
	}
	idle := func() { up.SetDeadline(p.opts.Now().Add(p.opts.IdleTimeout)) }
	idle()
	if err := out.Write(up); err != nil {
		p.upstreamFailed(w, rec, up, ctx, fmt.Errorf("send request: %w", err))
		return
	}
	idle()
	resp, err := http.ReadResponse(bufio.NewReader(up), out)
	if err != nil {
		p.upstreamFailed(w, rec, up, ctx, fmt.Errorf("read response: %w", err))
		return
	}
	defer resp.Body.Close()
	removeHop(resp.Header)
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	rec.Status = resp.StatusCode
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		idle()
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				rec.Error = "write to worker: " + werr.Error()
				break
			}
			rc.Flush()
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			rec.Error = "read response body: " + err.Error()
			if ctx.Err() != nil {
				rec.Error = fmt.Sprintf("ended after the longest allowed connection time, %s", p.opts.MaxDuration)
			}
			break
		}
	}
	rec.BytesUp, rec.BytesDown = up.written.Load(), up.read.Load()
	p.finish(rec)
}

func (p *Proxy) upstreamFailed(w http.ResponseWriter, rec *Record, up *countingConn, ctx context.Context, err error) {
	rec.BytesUp, rec.BytesDown = up.written.Load(), up.read.Load()
	status := http.StatusBadGateway
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || ctx.Err() != nil {
		status = http.StatusGatewayTimeout
	}
	p.fail(w, rec, status, err)
}

// countingConn counts the bytes read from and written to a connection.
type countingConn struct {
	net.Conn
	read, written atomic.Int64
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.read.Add(int64(n))
	return n, err
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.written.Add(int64(n))
	return n, err
}
