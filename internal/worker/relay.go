package worker

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/egress"
	"github.com/corral-dev/corral/internal/logkey"
)

// Egress relay defaults.
const (
	// relayMaxConns bounds the relay's concurrent connections; the
	// server's proxy has its own, lower, per-task bound.
	relayMaxConns = 256
	// relayDialTimeout bounds connecting to the server's proxy.
	relayDialTimeout = 5 * time.Second
)

// Relay accepts TCP connections on a loopback address inside the sandbox
// and pipes each one to the server's egress proxy on a unix socket. It
// does not look at the bytes: the proxy decides what is allowed. The
// socket is dialled per connection, so a server that restarts (and
// listens on the same path again) is reached by the next connection.
//
// Start it with StartRelay, or StartForward for one host:port; Close
// stops accepting, ends every open connection and waits for them. It is
// safe for concurrent use.
type Relay struct {
	ln   net.Listener // guarded by mu: Hold closes it, Release listens again
	addr string
	dial Upstream // the upstream of one connection
	log  *slog.Logger
	sem  chan struct{}

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	held   bool // Hold: no connection carried, none taken
	wg     sync.WaitGroup
}

// Upstream dials the server's egress proxy, once per connection.
type Upstream func() (net.Conn, error)

// SocketUpstream dials the proxy's unix socket, mounted in the sandbox.
func SocketUpstream(socket string) Upstream {
	return func() (net.Conn, error) { return net.DialTimeout("unix", socket, relayDialTimeout) }
}

// TCPUpstream dials the server's egress listener at addr as task id with
// its key, for a sandbox on another machine.
func TCPUpstream(addr, id string, key []byte) Upstream {
	return func() (net.Conn, error) { return egress.DialTask(addr, id, key, relayDialTimeout) }
}

// StartForward listens on addr, a loopback host:port inside the sandbox,
// and carries each connection to the same address as the server sees it
// (a model server on the host's loopback) through the egress proxy up
// reaches, with an HTTP CONNECT: the proxy decides and records it as any
// other connection. An agent pointed at http://127.0.0.1:PORT reaches the
// host's 127.0.0.1:PORT this way although its sandbox has a loopback of
// its own.
func StartForward(addr string, up Upstream, log *slog.Logger) (*Relay, error) {
	return StartForwardTo(addr, addr, up, log)
}

// StartForwardTo listens on addr and tunnels each connection to target
// through the proxy up reaches.
func StartForwardTo(addr, target string, up Upstream, log *slog.Logger) (*Relay, error) {
	return StartRelay(addr, func() (net.Conn, error) { return dialConnect(up, target) }, log)
}

// StartRelay listens on addr (host:port) and relays each connection to the
// proxy dial reaches: the agent's HTTP proxy.
func StartRelay(addr string, dial Upstream, log *slog.Logger) (*Relay, error) {
	if log == nil {
		log = discard
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for the egress relay on %s: %w", addr, err)
	}
	r := &Relay{ln: ln, addr: ln.Addr().String(), dial: dial, log: log, sem: make(chan struct{}, relayMaxConns), conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.accept(ln)
	return r, nil
}

// dialConnect opens a tunnel to target through the HTTP proxy up dials.
// A refusal (the target is not allowed) is an error: the client's
// connection is then closed.
func dialConnect(up Upstream, target string) (net.Conn, error) {
	c, err := up()
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(relayDialTimeout))
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: target}, Host: target, Header: http.Header{}}
	if err := req.Write(c); err != nil {
		c.Close()
		return nil, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		c.Close()
		return nil, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		c.Close()
		return nil, fmt.Errorf("the egress proxy refused %s: %s", target, resp.Status)
	}
	c.SetDeadline(time.Time{})
	return &bufferedConn{Conn: c, r: br}, nil
}

// bufferedConn is a connection whose first bytes may already sit in r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite passes a half-close on to the proxy.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// Addr returns the address the relay listens on.
func (r *Relay) Addr() string { return r.addr }

func (r *Relay) accept(ln net.Listener) {
	defer r.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				r.log.Warn("egress relay stopped accepting", logkey.Error, err)
			}
			return
		}
		select {
		case r.sem <- struct{}{}:
		default:
			c.Close() // over the limit
			continue
		}
		if !r.track(c) {
			c.Close()
			<-r.sem
			r.mu.Lock()
			closed := r.closed
			r.mu.Unlock()
			if closed {
				return
			}
			continue // held
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer func() { <-r.sem }()
			defer r.untrack(c)
			r.serve(c)
		}()
	}
}

func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.held {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}

// serve pipes one client connection to a new connection to the socket,
// passing each side's end of stream on as a half-close.
func (r *Relay) serve(c net.Conn) {
	defer c.Close()
	up, err := r.dial()
	if err != nil {
		// The server is away (restarting), or its proxy refused: the
		// client sees its connection closed and may retry.
		r.log.Debug("egress proxy unreachable or refusing", logkey.Error, err)
		return
	}
	defer up.Close()
	if !r.track(up) {
		return
	}
	defer r.untrack(up)
	done := make(chan struct{}, 2)
	half := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
		done <- struct{}{}
	}
	go half(up, c)
	go half(c, up)
	<-done
	<-done
}

// Hold ends every connection the relay carries and stops listening until
// Release: the sandbox then holds no connection to the host's proxy
// socket, which a checkpoint of it could not save, nor a listening socket
// that this gVisor (20221219) cannot save while it is watched (epoll).
// A client sees its connection closed, as when the server restarts, and a
// new one refused.
func (r *Relay) Hold() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.held {
		return
	}
	r.held = true
	r.ln.Close()
	for c := range r.conns {
		c.Close()
	}
}

// Release listens again after Hold, on the same address.
func (r *Relay) Release() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || !r.held {
		return nil
	}
	ln, err := net.Listen("tcp", r.addr)
	if err != nil {
		return fmt.Errorf("listen for the egress relay on %s again: %w", r.addr, err)
	}
	r.ln, r.held = ln, false
	r.wg.Add(1)
	go r.accept(ln)
	return nil
}

// Close stops the relay and ends its connections.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	ln, held := r.ln, r.held
	r.mu.Unlock()
	var err error
	if !held {
		err = ln.Close()
	}
	r.wg.Wait()
	return err
}

// ProxyEnv is the environment that points an agent at a relay on addr.
func ProxyEnv(addr string) []string {
	u := "http://" + addr
	return []string{
		"HTTP_PROXY=" + u, "HTTPS_PROXY=" + u, "http_proxy=" + u, "https_proxy=" + u,
		"ALL_PROXY=" + u, "all_proxy=" + u,
		"NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1",
	}
}
