package worker

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/logkey"
)

// Egress relay defaults.
const (
	// DefaultEgressListen is where the relay listens inside the sandbox;
	// the agent's HTTP_PROXY points there.
	DefaultEgressListen = "127.0.0.1:3128"
	// relayMaxConns bounds the relay's concurrent connections; the
	// server's proxy has its own, lower, per-task bound.
	relayMaxConns = 256
	// relayDialTimeout bounds connecting to the server's socket.
	relayDialTimeout = 5 * time.Second
)

// Relay accepts TCP connections on a loopback address inside the sandbox
// and pipes each one to the server's egress proxy on a unix socket. It
// does not look at the bytes: the proxy decides what is allowed. The
// socket is dialled per connection, so a server that restarts (and
// listens on the same path again) is reached by the next connection.
//
// Start it with StartRelay; Close stops accepting, ends every open
// connection and waits for them. It is safe for concurrent use.
type Relay struct {
	ln     net.Listener
	socket string
	log    *slog.Logger
	sem    chan struct{}

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// StartRelay listens on addr (host:port) and relays to the unix socket at
// socket.
func StartRelay(addr, socket string, log *slog.Logger) (*Relay, error) {
	if log == nil {
		log = discard
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for the egress relay: %w", err)
	}
	r := &Relay{ln: ln, socket: socket, log: log, sem: make(chan struct{}, relayMaxConns), conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// Addr returns the address the relay listens on.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
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
			return
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
	if r.closed {
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
	up, err := net.DialTimeout("unix", r.socket, relayDialTimeout)
	if err != nil {
		// The server is away (restarting): the client sees its connection
		// closed and may retry.
		r.log.Debug("egress proxy unreachable", logkey.Error, err)
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

// Close stops the relay and ends its connections.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	err := r.ln.Close()
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
