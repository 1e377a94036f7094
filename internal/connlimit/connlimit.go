// Package connlimit bounds the connections each sandbox holds open to the
// server. What runs in a sandbox is hostile, and it reaches the server:
// every local, gVisor and Docker sandbox its unix socket (its worker posts
// its progress and its completion there, a session's agent and commands
// dial in), every worker pod its HTTP listener. Without a bound, one task's
// processes could open connections until the server has no file descriptor
// left for any other task.
package connlimit

import (
	"log/slog"
	"net"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/sandbox/hostproc"
)

// PerSandbox is how many connections one sandbox may hold open at once: a
// worker needs one or two (progress, completion), a session's agent one,
// and each command an agent runs in its session (workspace_exec) one while
// it runs.
const PerSandbox = 64

// Listener closes, as soon as it accepts it, a connection whose peer's
// sandbox holds max open already.
type Listener struct {
	net.Listener
	max int
	// peer says whose a connection is, and whether that peer is bounded.
	peer func(net.Conn) (key string, bounded bool)
	log  *slog.Logger

	mu   sync.Mutex
	open map[string]int // by peer; an entry at 0 is removed
}

// Sandboxes wraps ln, the unix socket sandboxes reach, so that each
// sandbox holds at most max of its connections open. A peer is known by
// the pid namespace of the process that connected, which is its
// sandbox's own on every runtime that mounts the socket. A connection
// whose peer cannot be told (the process that connected has exited,
// handing the connection to another, or its pid is gone) is closed at
// once: counted in a bucket of its own, such connections escaped every
// sandbox's bound, and no client of Corral's connects and exits before
// its answer.
func Sandboxes(ln net.Listener, max int, log *slog.Logger) *Listener {
	return newListener(ln, max, pidNamespace, log)
}

// Pods wraps ln, a TCP listener, so that each address that pod says is a
// sandbox's (a worker pod's) holds at most max connections open. Others
// (the server's clients) are not bounded. Connections are counted by
// address from the first, so that those opened before pod knew the
// address count against it once it does.
func Pods(ln net.Listener, max int, pod func(ip string) bool, log *slog.Logger) *Listener {
	return newListener(ln, max, func(c net.Conn) (string, bool) {
		host, _, err := net.SplitHostPort(c.RemoteAddr().String())
		if err != nil {
			return c.RemoteAddr().String(), false
		}
		return host, pod(host)
	}, log)
}

func newListener(ln net.Listener, max int, peer func(net.Conn) (string, bool), log *slog.Logger) *Listener {
	return &Listener{Listener: ln, max: max, peer: peer, log: log, open: map[string]int{}}
}

// Accept returns the next connection whose peer is under its bound,
// closing the others.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key, bounded := l.peer(c)
		if key == "" && bounded {
			l.log.Debug("a connection whose peer has exited: closed")
			c.Close()
			continue
		}
		if l.take(key, bounded) {
			return &conn{Conn: c, release: sync.OnceFunc(func() { l.release(key) })}, nil
		}
		c.Close()
	}
}

// take counts a connection of key, unless key is bounded and holds max.
func (l *Listener) take(key string, bounded bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if bounded && l.open[key] >= l.max {
		return false
	}
	l.open[key]++
	if bounded && l.open[key] == l.max {
		// Once per time a sandbox reaches the bound, not per connection
		// refused: the log is not for its processes to fill.
		l.log.Warn("a sandbox holds as many connections to the server as it may: refusing more until some close",
			"max", l.max, "peer", key)
	}
	return true
}

func (l *Listener) release(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key]--; l.open[key] <= 0 {
		delete(l.open, key)
	}
}

// conn gives its peer's place back when it is closed, once.
type conn struct {
	net.Conn
	release func()
}

func (c *conn) Close() error {
	c.release()
	return c.Conn.Close()
}

// pidNamespace is the peer of a unix socket connection: "pidns:" and the
// pid namespace of the process that connected (SO_PEERCRED), or "" when
// it cannot be told (a connection Accept closes).
func pidNamespace(c net.Conn) (string, bool) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return "", true
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return "", true
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || credErr != nil || cred.Pid <= 0 {
		return "", true
	}
	ns := hostproc.PidNamespace(int(cred.Pid))
	if ns == 0 {
		return "", true
	}
	return "pidns:" + strconv.FormatUint(ns, 10), true
}
