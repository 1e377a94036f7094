package connlimit

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/testenv"
)

// dialEnv makes this test binary a process that dials the socket its
// value names, max+extra times, and prints how many it held and how many
// were closed on it.
const dialEnv = "CONNLIMIT_TEST_DIAL"

// handOffEnv makes this test binary dial the socket its value names
// max+extra times, hand the connections to a child that keeps them open,
// and exit: connections whose peer is gone by the time they are accepted.
const handOffEnv = "CONNLIMIT_TEST_HANDOFF"

const (
	max   = 4
	extra = 6
)

func TestMain(m *testing.M) {
	if sock := os.Getenv(handOffEnv); sock != "" {
		var files []*os.File
		for range max + extra {
			c, err := net.Dial("unix", sock)
			if err != nil {
				fmt.Println(err)
				os.Exit(1)
			}
			f, err := c.(*net.UnixConn).File()
			if err != nil {
				fmt.Println(err)
				os.Exit(1)
			}
			files = append(files, f)
		}
		child := exec.Command("sleep", "30")
		child.ExtraFiles = files
		if err := child.Start(); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Println(child.Process.Pid)
		os.Exit(0)
	}
	if sock := os.Getenv(dialEnv); sock != "" {
		held, refused, err := dial("unix", sock, max+extra)
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Println(len(held), refused)
		closeAll(held)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// dial opens n connections to addr and reads one byte from each: the
// server sends one on every connection it keeps; one it refused ends. It
// returns those kept, and closes the others.
func dial(network, addr string, n int) (held []net.Conn, refused int, err error) {
	var conns []net.Conn
	for range n {
		c, err := net.Dial(network, addr)
		if err != nil {
			closeAll(conns)
			return nil, 0, err
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var b [1]byte
		switch _, err := c.Read(b[:]); {
		case err == nil:
			held = append(held, c)
		case err == io.EOF || strings.Contains(err.Error(), "reset"):
			refused++
			c.Close()
		default:
			closeAll(conns)
			return nil, 0, err
		}
	}
	return held, refused, nil
}

// waitClosed waits for the test's server to have seen n connections end.
func waitClosed(t *testing.T, closed <-chan struct{}, n int) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for range n {
		select {
		case <-closed:
		case <-timeout:
			t.Fatalf("the server did not see %d connections end in 10 s", n)
		}
	}
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// TestPerSandbox: a process holds at most max connections open; a
// process in another pid namespace (another sandbox) gets its own max,
// whatever the first holds; a connection closed gives its place back.
func TestPerSandbox(t *testing.T) {
	testenv.RequireRoot(t) // a new pid namespace
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l := Sandboxes(ln, max, slog.New(slog.DiscardHandler))
	defer l.Close()
	// The server: greets each connection it keeps, closes it at EOF.
	closed := make(chan struct{}, 100)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				c.Write([]byte{'A'})
				io.Copy(io.Discard, c)
				c.Close()
				closed <- struct{}{}
			}()
		}
	}()

	held, refused, err := dial("unix", sock, max+extra)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { closeAll(held) }()
	if len(held) != max || refused != extra {
		t.Fatalf("one process, %d connections: %d held, %d refused; want %d and %d", max+extra, len(held), refused, max, extra)
	}

	// Another sandbox, while this one holds its max.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), dialEnv+"="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the process in a pid namespace of its own: %v: %s", err, out)
	}
	got := strings.TrimSpace(string(out))
	if want := strconv.Itoa(max) + " " + strconv.Itoa(extra); got != want {
		t.Errorf("a process in another pid namespace: held and refused %q, want %q", got, want)
	}
	if strings.HasPrefix(got, strconv.Itoa(max)+" ") {
		waitClosed(t, closed, max) // the server saw each of its connections end
	}

	// Two closed here: two more fit, and no third.
	for _, c := range held[:2] {
		c.Close()
		waitClosed(t, closed, 1)
	}
	held = held[2:]
	more, refused, err := dial("unix", sock, 3)
	held = append(held, more...)
	if err != nil {
		t.Fatal(err)
	}
	if len(more) != 2 || refused != 1 {
		t.Errorf("after two of its %d closed: %d more held, %d refused; want 2 and 1", max, len(more), refused)
	}
}

// TestPods: over TCP, only the addresses the runtime says are pods' are
// bounded, and a pod's connections count from the first, even those made
// before it was known as one.
func TestPods(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var known atomic.Bool
	l := Pods(ln, max, func(ip string) bool { return known.Load() && ip == "127.0.0.1" }, slog.New(slog.DiscardHandler))
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte{'A'})
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	addr := ln.Addr().String()
	// Not (yet) a pod's address: a client, not bounded.
	early, refused, err := dial("tcp", addr, max+extra)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { closeAll(early) }()
	if len(early) != max+extra || refused != 0 {
		t.Fatalf("a client's %d connections: %d held, %d refused; want all held", max+extra, len(early), refused)
	}
	// Known as a pod's now, and over its bound already: refused.
	known.Store(true)
	more, refused, err := dial("tcp", addr, 2)
	closeAll(more)
	if err != nil {
		t.Fatal(err)
	}
	if len(more) != 0 || refused != 2 {
		t.Errorf("a pod holding %d connections, bound %d: %d more held, %d refused; want none held", max+extra, max, len(more), refused)
	}
}

// TestPeerGone: connections whose process handed them to another and
// exited before the server accepted them are closed, all of them. They
// shared one bucket before, with its own bound, outside every sandbox's:
// a sandbox held that many more open (1 more on local, 19 on docker).
func TestPeerGone(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l := Sandboxes(ln, max, slog.New(slog.DiscardHandler))
	defer l.Close()
	// Nothing is accepted until the dialler has exited.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), handOffEnv+"="+sock)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the dialler: %v: %s", err, out)
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil {
		defer syscall.Kill(pid, syscall.SIGKILL) // the child holding them
	}
	// A connection of this live process after them: once it is accepted,
	// every one before it was looked at.
	marker, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer marker.Close()
	kept := 0
	for {
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if isOwn(t, c) {
			break
		}
		kept++
	}
	if kept != 0 {
		t.Errorf("%d connections of a peer that exited kept, want none", kept)
	}
}

// isOwn reports whether c's peer is this process.
func isOwn(t *testing.T, c net.Conn) bool {
	t.Helper()
	raw, err := c.(*conn).Conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	pid := int32(0)
	raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = cred.Pid
		}
	})
	return int(pid) == os.Getpid()
}
