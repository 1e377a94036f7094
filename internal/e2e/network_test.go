//go:build integration

package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/session"
	"github.com/corral-dev/corral/internal/task"
)

// tk2 spawns a task that runs a while with the server's allowlist.
func tk2(t *testing.T, s *server) task.Task {
	t.Helper()
	return mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "waits", Agent: "command", Network: task.NetworkAllowlist, Command: []string{"sleep", "5"}})
}

// endedConns is an echo listener that says when each connection it
// accepted ended.
type endedConns struct {
	ln    net.Listener
	mu    sync.Mutex
	open  int
	ended chan time.Time
}

func listenEcho(t *testing.T, addr string) *endedConns {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	e := &endedConns{ln: ln, ended: make(chan time.Time, 100)}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.open++
			e.mu.Unlock()
			go func() {
				defer c.Close()
				io.Copy(c, c)
				e.ended <- time.Now()
			}()
		}
	}()
	return e
}

func (e *endedConns) accepted() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.open
}

// networkScript holds a connection to the echo listener at addr (through
// the sandbox's proxy, $HTTPS_PROXY, with CONNECT) open until the proxy
// closes it, then tries new ones until one goes through, writing each
// step to output/log.
const networkScript = `
import os, socket, sys, time
target = "%s:%s" % (sys.argv[1], sys.argv[2])
proxy = os.environ["HTTPS_PROXY"].split("//")[1].split(":")
def dial(timeout=None):
    c = socket.create_connection((proxy[0], int(proxy[1])), timeout=timeout)
    c.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        b = c.recv(1)
        if not b:
            raise Exception("closed before the answer")
        head += b
    if not head.startswith(b"HTTP/1.1 200"):
        raise Exception(head.split(b"\r\n")[0].decode())
    return c
log = open("output/log", "a", buffering=1)
s = dial()
s.sendall(b"hi")
assert s.recv(2) == b"hi"
log.write("connected\n")
log.write("closed %r\n" % s.recv(1))
while True:
    try:
        c = dial(timeout=2)
        c.sendall(b"yo")
        r = c.recv(2)
        if r == b"yo":
            log.write("through\n")
            break
        log.write("refused: %r\n" % r)
    except Exception as e:
        log.write("refused: %s\n" % e)
    time.sleep(0.2)
`

// TestNetworkChangesWhileRunning: a running task holds a connection to a
// listed address; PATCH /api/tasks/{id}/network with an allowlist that
// leaves the address out closes the connection and refuses the next ones;
// one with the server's list again lets the next one through. Each change
// is an event. A task's own allowlist must lie within the server's
// (egress.task_hosts narrow), and a task that started without network
// cannot be given one.
func TestNetworkChangesWhileRunning(t *testing.T) {
	echo := listenEcho(t, "127.0.0.2:0")
	addr := echo.ln.Addr().String()
	s := MustStart(t, func(c *config.Config) {
		c.Egress.Mode = "allowlist"
		c.Egress.Allow = []string{addr}
	})
	host, port, _ := net.SplitHostPort(addr)
	tk := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "holds a connection", Agent: "command", Network: task.NetworkAllowlist,
		Command: []string{"python3", "-c", networkScript, host, port}})
	logFile := filepath.Join(s.data, "tasks", tk.ID, "output", "log")
	waitLog := func(want string) string {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			b, _ := os.ReadFile(logFile)
			if strings.Contains(string(b), want) {
				return string(b)
			}
			if time.Now().After(deadline) {
				t.Fatalf("the task's log never said %q: %q", want, b)
			}
		}
	}
	waitLog("connected")
	ctx := context.Background()

	// Out of the task's own list: the open connection ends, new ones are refused.
	narrowed := time.Now()
	if _, err := s.client.SetNetwork(ctx, service.NetworkRequest{TaskID: tk.ID, Network: task.NetworkAllowlist, Allow: []string{}}); err != nil {
		t.Fatal(err)
	}
	answered := time.Since(narrowed)
	select {
	case at := <-echo.ended:
		t.Logf("PATCH answered in %v; the connection ended %v after the call", answered.Round(time.Microsecond), at.Sub(narrowed).Round(time.Microsecond))
	case <-time.After(10 * time.Second):
		t.Fatal("the connection to the address no longer allowed is still open 10 s after the change")
	}
	before := echo.accepted()
	log := waitLog("refused")
	if n := echo.accepted(); n != before {
		t.Errorf("%d connections reached the listener after the narrowing", n-before)
	}
	if !strings.Contains(log, "closed b''") {
		t.Errorf("the task saw its connection end otherwise: %q", log)
	}

	// Back to the server's list: the next one goes through.
	if _, err := s.client.SetNetwork(ctx, service.NetworkRequest{TaskID: tk.ID, Network: task.NetworkAllowlist}); err != nil {
		t.Fatal(err)
	}
	res := s.wait(t, tk.ID, time.Minute, "log")
	if res.Status != task.Success || !strings.Contains(res.FileContents["log"].Content, "through") {
		t.Errorf("task %s %q, log %q: want success, through again", res.Status, res.ErrorMessage, res.FileContents["log"].Content)
	}
	var changes []string
	for _, e := range taskEvents(t, s, tk.ID, task.EventNetworkChanged) {
		changes = append(changes, string(e.Data))
	}
	if want := []string{`{"network":"allowlist","allow":[]}`, `{"network":"allowlist","allow":null}`}; !slices.Equal(changes, want) {
		t.Errorf("network changes recorded %v, want %v", changes, want)
	}
	if _, err := s.client.SetNetwork(ctx, service.NetworkRequest{TaskID: tk.ID, Network: task.NetworkOpen}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a change to a task that ended: %v, want a conflict", err)
	}

	// A list reaching beyond the server's is refused, at spawn and after.
	if _, _, err := s.client.Spawn(ctx, service.SpawnRequest{TaskDescription: "wider", Agent: "command", Command: []string{"true"},
		Network: task.NetworkAllowlist, NetworkAllow: []string{"example.com"}}); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "network_allow") {
		t.Errorf("spawn with a host beyond the server's list: %v, want refused naming network_allow", err)
	}
	none := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "offline", Agent: "command", Network: task.NetworkNone, Command: []string{"sleep", "5"}})
	(&proc{client: s.client}).waitRunning(t, none.ID, 30*time.Second)
	if _, err := s.client.SetNetwork(ctx, service.NetworkRequest{TaskID: none.ID, Network: task.NetworkAllowlist}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("network for a task started without: %v, want a conflict", err)
	}
	if _, err := s.client.SetNetwork(ctx, service.NetworkRequest{TaskID: tk2(t, s).ID, Network: task.NetworkAllowlist, Allow: []string{"127.0.0.3:1"}}); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "127.0.0.3:1") {
		t.Errorf("a change to an allowlist beyond the server's: %v, want refused naming the entry", err)
	}
}

// TestSessionNetworkChangesWhileRunning: as TestNetworkChangesWhileRunning,
// for a session: a command holding a connection sees it closed once the
// session's allowlist leaves its address out, and gets through again once
// the server's list is back. A session's own token cannot change its
// policy: only the API's.
func TestSessionNetworkChangesWhileRunning(t *testing.T) {
	echo := listenEcho(t, "127.0.0.2:0")
	addr := echo.ln.Addr().String()
	s := MustStartEnv(t, []string{"CORRAL_API_TOKEN=" + strings.Repeat("a", 32)}, func(c *config.Config) {
		c.Egress.Mode = "allowlist"
		c.Egress.Allow = []string{addr}
	})
	ctx := context.Background()
	created, err := s.client.CreateSession(ctx, session.CreateRequest{Network: task.NetworkAllowlist})
	if err != nil {
		t.Fatal(err)
	}
	id := created.SessionID
	host, port, _ := net.SplitHostPort(addr)
	ran := make(chan error, 1)
	go func() {
		end, err := s.client.ExecSession(ctx, id, httpapi.ExecBody{Command: shell("mkdir -p output && python3 -c '" + networkScript + "' " + host + " " + port)},
			func(httpapi.ExecChunk) error { return nil })
		if err == nil && end.ExitCode != 0 {
			err = fmt.Errorf("exit %d: %s", end.ExitCode, end.Error)
		}
		ran <- err
	}()
	logFile := filepath.Join(s.data, "sessions", id, "output", "log")
	waitLog := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if b, _ := os.ReadFile(logFile); strings.Contains(string(b), want) {
				return
			}
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(logFile)
				t.Fatalf("the command's log never said %q: %q", want, b)
			}
		}
	}
	waitLog("connected")
	if _, err := httpapi.NewClient(s.url, created.Token).SetSessionNetwork(ctx, id, service.NetworkRequest{Network: task.NetworkOpen}); !errors.Is(err, errdefs.ErrUnauthenticated) && !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("the session's own token changed its policy: %v", err)
	}
	narrowed := time.Now()
	sess, err := s.client.SetSessionNetwork(ctx, id, service.NetworkRequest{Network: task.NetworkAllowlist, Allow: []string{}})
	if err != nil || sess.NetworkAllow == nil {
		t.Fatalf("narrowed: %+v, %v", sess, err)
	}
	select {
	case at := <-echo.ended:
		t.Logf("the connection ended %v after the call", at.Sub(narrowed).Round(time.Microsecond))
	case <-time.After(10 * time.Second):
		t.Fatal("the session's connection is still open 10 s after the narrowing")
	}
	waitLog("refused")
	if _, err := s.client.SetSessionNetwork(ctx, id, service.NetworkRequest{Network: task.NetworkAllowlist}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ran:
		if err != nil {
			t.Errorf("the command: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the command never got through again")
	}
	waitLog("through")
}
