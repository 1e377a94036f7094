package egress

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/logkey"
)

// Sandboxes on other machines (Kubernetes pods) cannot mount a task's
// socket: they reach the proxies over TCP, on one listener for every task
// (ServeTCP), and each connection says which task it is and proves it
// holds that task's key before its first proxy request:
//
//	server: "CORRAL-EGRESS/1 <nonce>\n"       32 random bytes, hex
//	client: "<task id> <mac>\n"               hex HMAC-SHA256(key, "corral-egress\n" + nonce)
//	server: "OK\n"                            then the connection is the task's proxy's
//
// A refusal closes the connection without an answer. The nonce makes a
// recorded handshake useless on another connection; the key is the
// worker's webhook key for the task, which only the server and that
// task's worker hold. After the handshake the bytes are plain proxy
// traffic, as on the socket (CONNECT tunnels carry their own TLS).
const (
	handshakeGreeting = "CORRAL-EGRESS/1 "
	handshakeContext  = "corral-egress\n"
	handshakeOK       = "OK\n"
	// handshakeTimeout bounds the whole exchange: one round trip.
	handshakeTimeout = 5 * time.Second
	// maxHandshakeLine bounds a line of the exchange: a task id and a
	// hex MAC fit well within it.
	maxHandshakeLine = 256
	// maxHandshakes bounds the connections in the handshake at once, so
	// that connections which never finish it cannot pile up; and
	// maxHandshakesPerHost those from one address, so that one pod that
	// holds its share open does not keep the other pods' out.
	maxHandshakes        = 256
	maxHandshakesPerHost = 16
)

// ServeTCP accepts connections from remote sandboxes on ln until ln is
// closed, and hands each connection that completes the handshake to its
// task's proxy, which must be open (Open). key returns the key of a task
// (nil for none); proven, if not nil, is called with the task a
// connection has just proved itself as, before its proxy is looked up,
// and may open it (a task another server started): never for a
// connection that has not. ServeTCP returns nil when ln is closed, after
// closing the connections still in their handshake.
func (s *Server) ServeTCP(ln net.Listener, key func(id string) []byte, proven func(id string)) error {
	var (
		mu      sync.Mutex
		pending = map[net.Conn]struct{}{}
		perHost = map[string]int{}
		wg      sync.WaitGroup
	)
	defer func() {
		mu.Lock()
		for c := range pending {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("accept egress connections: %w", err)
		}
		host := remoteHost(c)
		mu.Lock()
		full := len(pending) >= maxHandshakes || perHost[host] >= maxHandshakesPerHost
		if !full {
			pending[c] = struct{}{}
			perHost[host]++
		}
		mu.Unlock()
		if full {
			c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.handshake(c, key, proven)
			mu.Lock()
			delete(pending, c)
			if perHost[host]--; perHost[host] == 0 {
				delete(perHost, host)
			}
			mu.Unlock()
		}()
	}
}

// remoteHost is the address c comes from, without its port.
func remoteHost(c net.Conn) string {
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// handshake authenticates c and passes it to its task's proxy, or closes
// it.
func (s *Server) handshake(c net.Conn, key func(id string) []byte, proven func(id string)) {
	log := s.log.With("remote", c.RemoteAddr().String())
	fail := func(why string, args ...any) {
		log.Debug("egress connection refused: "+why, args...)
		c.Close()
	}
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	nonce := make([]byte, 32)
	rand.Read(nonce)
	nonceHex := hex.EncodeToString(nonce)
	if _, err := c.Write([]byte(handshakeGreeting + nonceHex + "\n")); err != nil {
		fail("greeting", logkey.Error, err)
		return
	}
	line, err := readLine(c)
	if err != nil {
		fail("reading the answer", logkey.Error, err)
		return
	}
	id, macHex, ok := strings.Cut(line, " ")
	got, err := hex.DecodeString(macHex)
	if !ok || err != nil || checkID(id) != nil {
		fail("malformed answer")
		return
	}
	k := key(id)
	if len(k) == 0 || !hmac.Equal(got, handshakeMAC(k, nonceHex)) {
		fail("bad key", logkey.TaskID, id)
		return
	}
	if proven != nil {
		proven(id)
	}
	s.mu.Lock()
	tp := s.tasks[id]
	s.mu.Unlock()
	if tp == nil {
		fail("the task has no egress proxy", logkey.TaskID, id)
		return
	}
	if _, err := c.Write([]byte(handshakeOK)); err != nil {
		fail("answer", logkey.Error, err)
		return
	}
	c.SetDeadline(time.Time{})
	if !tp.join.add(c) {
		fail("the task's proxy closed", logkey.TaskID, id)
	}
}

// DialTask connects to the egress listener at addr (host:port) as task
// id holding key, and returns a connection to the task's proxy: send
// proxy requests on it as on the task's socket.
func DialTask(addr, id string, key []byte, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	if err := clientHandshake(c, id, key, timeout); err != nil {
		c.Close()
		return nil, fmt.Errorf("egress handshake with %s: %w", addr, err)
	}
	return c, nil
}

func clientHandshake(c net.Conn, id string, key []byte, timeout time.Duration) error {
	c.SetDeadline(time.Now().Add(timeout))
	greeting, err := readLine(c)
	if err != nil {
		return err
	}
	nonce, ok := strings.CutPrefix(greeting+"\n", handshakeGreeting)
	nonce = strings.TrimSuffix(nonce, "\n")
	if !ok || nonce == "" {
		return fmt.Errorf("not a Corral egress listener (it said %.40q)", greeting)
	}
	if _, err := c.Write([]byte(id + " " + hex.EncodeToString(handshakeMAC(key, nonce)) + "\n")); err != nil {
		return err
	}
	answer, err := readLine(c)
	if err != nil {
		return fmt.Errorf("refused (wrong key, or the task's proxy is not open): %w", err)
	}
	if answer+"\n" != handshakeOK {
		return fmt.Errorf("refused: %.40q", answer)
	}
	return c.SetDeadline(time.Time{})
}

// sessionKeyContext separates a session's key from every other key
// derived from the server's secret (a task's webhook key among them).
const sessionKeyContext = "corral session egress v1\x00"

// SessionKey is the key with which the sandbox of session id on another
// machine (a pod) proves itself to ServeTCP: HMAC-SHA256(secret, context
// and id), one per session. A task proves itself with its webhook key
// instead. Derived, not stored: a restarted server has it again.
func SessionKey(secret []byte, id string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(sessionKeyContext + id))
	return m.Sum(nil)
}

func handshakeMAC(key []byte, nonce string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(handshakeContext + nonce))
	return m.Sum(nil)
}

// readLine reads one line, without its newline, a byte at a time: the
// bytes after it belong to the proxy and must stay in the connection.
func readLine(c net.Conn) (string, error) {
	var b strings.Builder
	one := make([]byte, 1)
	for b.Len() < maxHandshakeLine {
		if _, err := c.Read(one); err != nil {
			return "", err
		}
		if one[0] == '\n' {
			return b.String(), nil
		}
		b.WriteByte(one[0])
	}
	return "", errors.New("line too long")
}

// joinListener is a task's listener: the connections of its unix socket,
// and those ServeTCP authenticated for it.
type joinListener struct {
	net.Listener // the unix socket
	conns        chan net.Conn
	done         chan struct{}
	once         sync.Once
}

func newJoinListener(ln net.Listener) *joinListener {
	l := &joinListener{Listener: ln, conns: make(chan net.Conn), done: make(chan struct{})}
	go l.acceptUnix()
	return l
}

func (l *joinListener) acceptUnix() {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, most likely: wait for some to go.
			select {
			case <-l.done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		if !l.add(c) {
			c.Close()
			return
		}
	}
}

// add passes c to Accept; false if the listener is closed.
func (l *joinListener) add(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *joinListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		select {
		case <-l.done: // closed meanwhile
			c.Close()
			return nil, net.ErrClosed
		default:
			return c, nil
		}
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *joinListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}
