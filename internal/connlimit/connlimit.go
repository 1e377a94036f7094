// Package connlimit bounds the connections each sandbox holds open to the
// server's unix socket. Every sandbox reaches that socket (its worker posts
// its progress and its completion there, a session's agent and commands
// dial in), and what runs in a sandbox is hostile: without a bound, one
// task's processes could open connections until the server has no file
// descriptor left for any other task. The peer of a connection is known by
// its process's pid namespace, which is the sandbox's own on every runtime
// that mounts the socket.
package connlimit

import (
	"log/slog"
	"net"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/sandbox/hostproc"
)

// PerSandbox is how many connections one sandbox may hold open at once: a
// worker needs one or two (progress, completion), a session's agent one,
// and each command an agent runs in its session (workspace_exec) one while
// it runs.
const PerSandbox = 64

// Listener is a unix socket listener that closes, as soon as it accepts
// it, a connection whose peer's sandbox holds max open already.
// Connections whose peer it cannot tell (the process has exited, or is not
// visible) share one count, with the same bound.
type Listener struct {
	net.Listener
	max int
	log *slog.Logger

	mu   sync.Mutex
	open map[uint64]int // by the peer's pid namespace; an entry at 0 is removed
}

// New wraps ln, a unix socket listener, so that each sandbox holds at most
// max of its connections open.
func New(ln net.Listener, max int, log *slog.Logger) *Listener {
	return &Listener{Listener: ln, max: max, log: log, open: map[uint64]int{}}
}

// Accept returns the next connection whose peer's sandbox is under its
// bound, closing the others.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		pid := peerPID(c)
		ns := uint64(0)
		if pid > 0 {
			ns = hostproc.PidNamespace(pid)
		}
		if l.take(ns, pid) {
			return &conn{Conn: c, release: sync.OnceFunc(func() { l.release(ns) })}, nil
		}
		c.Close()
	}
}

// take counts a connection of ns, if ns holds fewer than max.
func (l *Listener) take(ns uint64, pid int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[ns] >= l.max {
		return false
	}
	l.open[ns]++
	if l.open[ns] == l.max {
		// Once per time a sandbox reaches the bound, not per connection
		// refused: the log is not for its processes to fill.
		l.log.Warn("a sandbox holds as many connections to the server's socket as it may: refusing more until some close",
			"max", l.max, "pid", pid, "pid_namespace", ns)
	}
	return true
}

func (l *Listener) release(ns uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[ns]--; l.open[ns] <= 0 {
		delete(l.open, ns)
	}
}

// conn gives its sandbox's place back when it is closed, once.
type conn struct {
	net.Conn
	release func()
}

func (c *conn) Close() error {
	c.release()
	return c.Conn.Close()
}

// peerPID returns the pid (in this process's pid namespace) of the
// process that connected c, or 0.
func peerPID(c net.Conn) int {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || credErr != nil {
		return 0
	}
	return int(cred.Pid)
}
