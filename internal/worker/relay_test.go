package worker

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/workerproto"
)

// listenUnix listens on a new unix socket in a directory of its own under
// the system's temporary directory (t.TempDir is too long for a socket
// path), and returns the listener and the socket's path; both are removed
// when the test ends.
func listenUnix(tb testing.TB) (net.Listener, string) {
	tb.Helper()
	dir, err := os.MkdirTemp("", "relay")
	if err != nil {
		tb.Fatal(err)
	}
	sock := filepath.Join(dir, "proxy.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close(); os.RemoveAll(dir) })
	return ln, sock
}

// MustUnixEcho serves an echo on a new unix socket and returns its path and
// a count of the connections it accepted.
func MustUnixEcho(tb testing.TB) (string, func() int) {
	tb.Helper()
	ln, sock := listenUnix(tb)
	var mu sync.Mutex
	var n int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			n++
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	tb.Cleanup(func() { ln.Close(); wg.Wait() })
	return sock, func() int { mu.Lock(); defer mu.Unlock(); return n }
}

func TestRelayPipesBothWays(t *testing.T) {
	sock, accepted := MustUnixEcho(t)
	r, err := StartRelay("127.0.0.1:0", SocketUpstream(sock), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range 3 {
		c, err := net.Dial("tcp", r.Addr())
		if err != nil {
			t.Fatal(err)
		}
		msg := strings.Repeat("relay ", 10000)
		go func() { io.WriteString(c, msg); c.(*net.TCPConn).CloseWrite() }()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(c) // ends when the echo's end comes back as EOF
		c.Close()
		if err != nil || string(got) != msg {
			t.Fatalf("connection %d: got %d bytes, %v; want %d bytes back", i, len(got), err, len(msg))
		}
	}
	if n := accepted(); n != 3 {
		t.Errorf("the socket accepted %d connections, want one per client connection (3)", n)
	}
}

func TestRelayWithoutServerClosesClient(t *testing.T) {
	r, err := StartRelay("127.0.0.1:0", SocketUpstream(filepath.Join(t.TempDir(), "absent.sock")), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("read: %v, want EOF when the proxy is away", err)
	}
}

func TestRelayCloseEndsConnections(t *testing.T) {
	sock, _ := MustUnixEcho(t)
	r, err := StartRelay("127.0.0.1:0", SocketUpstream(sock), nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "ping\n")
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("echo: %q, %v", line, err)
	}
	done := make(chan struct{})
	go func() { r.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return with a connection open")
	}
	if _, err := br.ReadByte(); err == nil {
		t.Errorf("connection still open after Close")
	}
	if _, err := net.Dial("tcp", r.Addr()); err == nil {
		t.Errorf("relay still accepts after Close")
	}
}

// TestRunStartsRelayForAgent runs a worker with an egress socket: the agent
// (bash, through /dev/tcp) finds the relay from HTTPS_PROXY and reaches the
// socket through it.
func TestRunStartsRelayForAgent(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("needs bash for /dev/tcp")
	}
	sock, accepted := MustUnixEcho(t)
	dir := MustTaskDir(t)
	opts := shOptions(dir, "")
	opts.Command = []string{bash, "-c", `set -e
env | grep -i -E '^(https?|no)_proxy=' | sort > output/env.txt
hp=${HTTPS_PROXY#http://}
exec 3<>/dev/tcp/${hp%:*}/${hp##*:}
echo through-the-relay >&3
read -r line <&3
echo "$line" > output/got.txt`}
	opts.EgressSocket = sock
	opts.EgressListen = "127.0.0.1:0"
	code, st := MustRun(t, opts)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, st.ErrorMessage)
	}
	if got := mustReadFile(t, filepath.Join(dir, "output", "got.txt")); got != "through-the-relay\n" {
		t.Errorf("the agent got %q back", got)
	}
	env := mustReadFile(t, filepath.Join(dir, "output", "env.txt"))
	for _, want := range []string{"HTTPS_PROXY=http://127.0.0.1:", "HTTP_PROXY=http://127.0.0.1:", "https_proxy=http://127.0.0.1:", "http_proxy=http://127.0.0.1:", "NO_PROXY=localhost,127.0.0.1"} {
		if !strings.Contains(env, want) {
			t.Errorf("agent environment lacks %s:\n%s", want, env)
		}
	}
	if accepted() != 1 {
		t.Errorf("socket accepted %d connections, want 1", accepted())
	}
}

// TestRunWithoutEgressHasNoProxy checks that a worker without an egress
// socket gives the agent no proxy variables (network none).
func TestRunWithoutEgressHasNoProxy(t *testing.T) {
	dir := MustTaskDir(t)
	opts := shOptions(dir, `env > output/env.txt`)
	var env []string
	for _, kv := range opts.Env {
		if k, _, _ := strings.Cut(kv, "="); !strings.EqualFold(k, "http_proxy") && !strings.EqualFold(k, "https_proxy") {
			env = append(env, kv)
		}
	}
	opts.Env = env
	if code, st := MustRun(t, opts); code != 0 {
		t.Fatalf("exit %d: %s", code, st.ErrorMessage)
	}
	if got := mustReadFile(t, filepath.Join(dir, "output", "env.txt")); strings.Contains(strings.ToLower(got), "_proxy=") {
		t.Errorf("agent environment has proxy variables:\n%s", got)
	}
}

func TestParseArgsEgress(t *testing.T) {
	o, err := ParseArgs([]string{"--task-id", "t", "--egress-socket", "/run/corral/egress/proxy.sock", "--", "true"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.EgressSocket != "/run/corral/egress/proxy.sock" || o.EgressListen != workerproto.DefaultEgressListen {
		t.Errorf("socket %q listen %q", o.EgressSocket, o.EgressListen)
	}
	if _, err := ParseArgs([]string{"--task-id", "t", "--egress-socket", "/s", "--egress-listen", "nope", "--", "true"}, nil); err == nil || !strings.Contains(err.Error(), "--egress-listen") {
		t.Errorf("bad --egress-listen: %v", err)
	}
}

// MustConnectProxy serves a fake egress proxy on a new unix socket: it
// answers CONNECT to allowed with 200 and then echoes, and any other
// CONNECT with 403. It returns the socket's path and the targets asked.
func MustConnectProxy(tb testing.TB, allowed string) (string, func() []string) {
	tb.Helper()
	ln, sock := listenUnix(tb)
	var mu sync.Mutex
	var asked []string
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				mu.Lock()
				asked = append(asked, req.Method+" "+req.Host)
				mu.Unlock()
				if req.Method != http.MethodConnect || req.Host != allowed {
					io.WriteString(c, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
					return
				}
				// The greeting after the 200, in the same write, must reach
				// the client too.
				io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\nhello ")
				io.Copy(c, br)
			}()
		}
	}()
	return sock, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), asked...)
	}
}

// freeLoopback returns a 127.0.0.1 address with a port nothing listens on.
func freeLoopback(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// mustDialForward starts a forward at addr to the proxy on sock and
// connects to it; both are closed when the test ends.
func mustDialForward(t *testing.T, addr, sock string) net.Conn {
	t.Helper()
	fwd, err := StartForward(addr, SocketUpstream(sock), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Close() })
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A forward carries a connection to its own address through the proxy
// with a CONNECT, bytes both ways; a CONNECT the proxy refuses closes the
// client's connection.
func TestForwardTunnelsThroughTheProxy(t *testing.T) {
	addr := freeLoopback(t)
	sock, asked := MustConnectProxy(t, addr)
	c := mustDialForward(t, addr, sock)
	io.WriteString(c, "ping\n")
	c.(*net.TCPConn).CloseWrite()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	if string(b) != "hello ping\n" {
		t.Errorf("through the forward: %q, want %q", b, "hello ping\n")
	}
	if got := asked(); len(got) != 1 || got[0] != "CONNECT "+addr {
		t.Errorf("the proxy was asked %q, want CONNECT %s", got, addr)
	}

	c2 := mustDialForward(t, freeLoopback(t), sock)
	c2.SetDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(c2); len(b) != 0 || err != nil {
		t.Errorf("a refused forward: read %q, %v; want the connection closed", b, err)
	}
}

func TestParseArgsEgressForward(t *testing.T) {
	o, err := ParseArgs([]string{"--task-id", "t", "--egress-socket", "/s", "--egress-forward", "127.0.0.1:8080", "--egress-forward", "[::1]:11434", "--", "true"}, nil)
	if err != nil || !slices.Equal(o.EgressForward, []string{"127.0.0.1:8080", "[::1]:11434"}) {
		t.Fatalf("forwards %v, %v", o.EgressForward, err)
	}
	for _, bad := range [][]string{
		{"--egress-socket", "/s", "--egress-forward", "10.0.0.1:80"},    // not loopback
		{"--egress-socket", "/s", "--egress-forward", "localhost:80"},   // not a literal
		{"--egress-socket", "/s", "--egress-forward", "127.0.0.1"},      // no port
		{"--egress-socket", "/s", "--egress-forward", "127.0.0.1:3128"}, // the relay's own
		{"--egress-forward", "127.0.0.1:8080"},                          // no proxy to go through
	} {
		args := append(append([]string{"--task-id", "t"}, bad...), "--", "true")
		if _, err := ParseArgs(args, nil); err == nil || !strings.Contains(err.Error(), "--egress-forward") {
			t.Errorf("%q: %v, want an --egress-forward error", bad, err)
		}
	}
}

// TestRelayHold: Hold ends the connections the relay carries and takes no
// new one to the socket until Release.
func TestRelayHold(t *testing.T) {
	sock, accepted := MustUnixEcho(t)
	r, err := StartRelay("127.0.0.1:0", SocketUpstream(sock), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	echo := func() (*bufio.Reader, net.Conn, error) {
		c, err := net.Dial("tcp", r.Addr())
		if err != nil {
			return nil, nil, err
		}
		io.WriteString(c, "ping\n")
		br := bufio.NewReader(c)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
			c.Close()
			return nil, nil, fmt.Errorf("echo: %q, %v", line, err)
		}
		return br, c, nil
	}
	br, c, err := echo()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r.Hold()
	if _, err := br.ReadByte(); err == nil {
		t.Error("a connection carried on through Hold")
	}
	before := accepted()
	if _, c2, err := echo(); err == nil {
		c2.Close()
		t.Error("a new connection was carried while held")
	}
	if n := accepted(); n != before {
		t.Errorf("the socket took %d connections while the relay was held", n-before)
	}
	r.Release()
	if _, c3, err := echo(); err != nil {
		t.Errorf("after Release: %v", err)
	} else {
		c3.Close()
	}
}
