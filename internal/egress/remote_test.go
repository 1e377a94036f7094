package egress

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// remoteServer is a Server with task-a and task-b open under policy,
// serving TCP on loopback with key for task-a, task-c (which has no
// proxy) and task-d (whose proxy opens once a connection proves it) and
// none for the others. proven, if not nil, records the tasks proved.
func remoteServer(t *testing.T, policy Policy, key []byte, proven chan<- string) string {
	t.Helper()
	s, err := NewServer(t.TempDir(), Options{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Open("task-a", policy); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Open("task-b", policy); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- s.ServeTCP(ln, func(id string) []byte {
			if id == "task-a" || id == "task-c" || id == "task-d" {
				return key
			}
			return nil
		}, func(id string) {
			if proven != nil {
				proven <- id
			}
			if id == "task-d" {
				if _, err := s.Open(id, policy); err != nil {
					t.Errorf("Open(%s): %v", id, err)
				}
			}
		})
	}()
	t.Cleanup(func() {
		ln.Close()
		if err := <-done; err != nil {
			t.Errorf("ServeTCP: %v", err)
		}
		s.Shutdown()
	})
	return ln.Addr().String()
}

func TestRemoteTaskReachesItsProxy(t *testing.T) {
	port := echoServer(t)
	hostport := "127.0.0.1:" + strconv.Itoa(port)
	key := []byte("0123456789abcdef0123456789abcdef")
	addr := remoteServer(t, Policy{Allow: MustParseRules(hostport)}, key, nil)

	c, err := DialTask(addr, "task-a", key, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c, br, status, body := connectOn(t, c, hostport)
	if status != 200 {
		t.Fatalf("CONNECT: %d %s", status, body)
	}
	fmt.Fprint(c, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("echo: %q, %v", line, err)
	}
	// The task's policy applies as on its socket.
	c2, err := DialTask(addr, "task-a", key, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, status, _ := connectOn(t, c2, "127.0.0.1:1"); status != 403 {
		t.Errorf("CONNECT to an address not allowed: %d, want 403", status)
	}
}

// TestRemoteProxyOpensOnProof: a connection that proves a task whose
// proxy is not open here (another replica started it) has it opened by
// proven, and reaches it.
func TestRemoteProxyOpensOnProof(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	proven := make(chan string, 1)
	addr := remoteServer(t, Policy{Open: true}, key, proven)
	c, err := DialTask(addr, "task-d", key, 5*time.Second)
	if err != nil {
		t.Fatalf("DialTask(task-d) with its key: %v", err)
	}
	c.Close()
	if id := <-proven; id != "task-d" {
		t.Errorf("proven was told of %q, want task-d", id)
	}
}

func TestRemoteHandshakeRefusals(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	proven := make(chan string, 16)
	addr := remoteServer(t, Policy{Open: true}, key, proven)
	for _, tc := range []struct {
		name, id string
		key      []byte
	}{
		{"wrong key", "task-a", []byte("another key of 32 bytes, really!")},
		{"a task without a key", "task-b", key},
		{"a task without a proxy", "task-c", key},
		{"a path as the id", "../task-a", key},
		// Its proxy opens only for a connection that proves it.
		{"the wrong key of a task whose proxy opens on proof", "task-d", []byte("another key of 32 bytes, really!")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if c, err := DialTask(addr, tc.id, tc.key, 5*time.Second); err == nil {
				c.Close()
				t.Fatalf("DialTask(%q) succeeded", tc.id)
			}
		})
	}
	// Of those, only task-c's connection proved its task (each DialTask
	// returned once the server closed its connection, after proven).
	var got []string
	for len(proven) > 0 {
		got = append(got, <-proven)
	}
	if strings.Join(got, " ") != "task-c" {
		t.Errorf("proven was told of %q, want only task-c's", got)
	}

	// A recorded answer does not open another connection: each greeting
	// has its own nonce.
	first, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	greeting, err := bufio.NewReader(first).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	nonce := strings.TrimSpace(strings.TrimPrefix(greeting, handshakeGreeting))
	replay := "task-a " + hex.EncodeToString(handshakeMAC(key, nonce)) + "\n"
	second, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	second.SetDeadline(time.Now().Add(5 * time.Second))
	g2, err := bufio.NewReader(second).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if g2 == greeting {
		t.Fatalf("two connections got the same greeting %q", g2)
	}
	fmt.Fprint(second, replay)
	if rest, _ := io.ReadAll(second); len(rest) != 0 {
		t.Errorf("a replayed answer got %q, want the connection closed", rest)
	}

	// Junk and endless lines are refused.
	for _, junk := range []string{"\n", "task-a zz\n", strings.Repeat("x", 2*maxHandshakeLine)} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(c)
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		fmt.Fprint(c, junk)
		if rest, _ := io.ReadAll(br); len(rest) != 0 {
			t.Errorf("answer %.20q got %q, want the connection closed", junk, rest)
		}
		c.Close()
	}
}

func TestNotAnEgressListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			fmt.Fprint(c, "HTTP/1.1 400 Bad Request\r\n\r\n")
			c.Close()
		}
	}()
	if _, err := DialTask(ln.Addr().String(), "task-a", []byte("k"), 5*time.Second); err == nil || !strings.Contains(err.Error(), "not a Corral egress listener") {
		t.Errorf("DialTask to an HTTP server: %v", err)
	}
}

// Connections that never answer hold at most maxHandshakesPerHost slots
// of their address: one more from there is closed at once, while another
// address still gets through.
func TestHandshakesPerHostAreBounded(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	addr := remoteServer(t, Policy{Open: true}, key, nil)
	dial := func(from string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	for range maxHandshakesPerHost {
		c := dial("127.0.0.1")
		// Each is in its handshake once its greeting came.
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	over := dial("127.0.0.1")
	over.SetDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(over); len(b) != 0 || err != nil {
		t.Errorf("a connection over the address's share got %q, %v; want it closed", b, err)
	}
	other := dial("127.0.0.2")
	if err := clientHandshake(other, "task-a", key, 5*time.Second); err != nil {
		t.Errorf("another address was kept out: %v", err)
	}
}

// A session's key is its own: another session's, or a key of the same
// secret under another context (a task's webhook key), is not it; and the
// same secret gives it again (a restarted server).
func TestSessionKey(t *testing.T) {
	secret := []byte("the server's secret")
	a := SessionKey(secret, "sess-a")
	if hex.EncodeToString(a) != hex.EncodeToString(SessionKey(secret, "sess-a")) {
		t.Errorf("the same secret and id gave two keys")
	}
	if hex.EncodeToString(a) == hex.EncodeToString(SessionKey(secret, "sess-b")) || hex.EncodeToString(a) == hex.EncodeToString(SessionKey([]byte("another secret"), "sess-a")) {
		t.Errorf("two sessions, or two secrets, share a key")
	}
	if len(a) != 32 {
		t.Errorf("a key of %d bytes, want 32", len(a))
	}
}
