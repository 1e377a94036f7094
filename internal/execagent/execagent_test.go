package execagent_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/execagent"
	"github.com/corral-dev/corral/internal/execagent/execagenttest"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
)

// mem is a Handler that keeps each command's output in memory, and an
// exec function over it as the session manager has one.
type mem struct {
	c *execagent.Conn

	mu    sync.Mutex
	execs map[string]*memExec
	next  int
	hello [][]execagent.ExecState
}

type memExec struct {
	out  [3]bytes.Buffer
	size int64
	exit chan [2]any // code, message
}

func (m *mem) Hello(execs []execagent.ExecState) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.hello = append(m.hello, execs)
}

func (m *mem) Resume(id string) (int64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.execs[id]
	if e == nil {
		return 0, false
	}
	return e.size, true
}

func (m *mem) Output(id string, fd int, off int64, data []byte) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.execs[id]
	if e == nil {
		return 0
	}
	if off > e.size {
		panic(fmt.Sprintf("a gap in %s: %d bytes at %d", id, off-e.size, e.size))
	}
	if skip := e.size - off; skip < int64(len(data)) {
		e.out[fd].Write(data[skip:])
		e.size += int64(len(data)) - skip
	}
	return e.size
}

func (m *mem) Exit(id string, code int, msg string, off int64) {
	m.mu.Lock()
	e := m.execs[id]
	m.mu.Unlock()
	if e != nil {
		e.exit <- [2]any{code, msg}
	}
}

// start starts argv and returns its id and record.
func (m *mem) start(argv []string, dir string, env []string, stdin []byte) (string, *memExec, error) {
	m.mu.Lock()
	m.next++
	id := fmt.Sprintf("e%d", m.next)
	e := &memExec{exit: make(chan [2]any, 1)}
	m.execs[id] = e
	m.mu.Unlock()
	return id, e, m.c.Start(id, argv, dir, env, stdin)
}

// exec runs argv to its end (killed when ctx ends), as the session
// manager does.
func (m *mem) exec(ctx context.Context, argv []string, dir string, env []string, stdin []byte, stdout, stderr io.Writer) (int, error) {
	id, e, err := m.start(argv, dir, env, stdin)
	if err != nil {
		return -1, err
	}
	var end [2]any
	select {
	case end = <-e.exit:
	case <-ctx.Done():
		m.c.Kill(id)
		select {
		case <-e.exit:
		case <-time.After(5 * time.Second):
		}
		return -1, ctx.Err()
	case <-m.c.Done():
		return -1, errors.New("the agent went away")
	}
	m.mu.Lock()
	if stdout != nil {
		stdout.Write(e.out[1].Bytes())
	}
	if stderr != nil {
		stderr.Write(e.out[2].Bytes())
	}
	m.mu.Unlock()
	code, msg := end[0].(int), end[1].(string)
	if msg != "" && code >= 126 {
		return code, fmt.Errorf("%s: %w", msg, errdefs.ErrFailedPrecondition)
	}
	return code, nil
}

// mustAgent runs the agent on this host and returns the server's side of
// its connection, once it dialled in.
func mustAgent(t *testing.T) *mem {
	t.Helper()
	m := &mem{execs: map[string]*memExec{}}
	conn, br := execagenttest.Dial(t, []string{"PATH=/usr/bin:/bin", "BASE=1"})
	m.c = execagent.NewConn(conn, br, m)
	m.c.Serve()
	t.Cleanup(func() { m.c.Close() })
	return m
}

func TestExec(t *testing.T) {
	c := mustAgent(t)
	ctx := context.Background()
	var out, errb bytes.Buffer
	code, err := c.exec(ctx, []string{"/bin/sh", "-c", `read l; echo "$l $BASE $EXTRA $(pwd)"; echo oops >&2; exit 3`}, "/tmp", []string{"EXTRA=2"}, []byte("hi\n"), &out, &errb)
	if err != nil || code != 3 || out.String() != "hi 1 2 /tmp\n" || errb.String() != "oops\n" {
		t.Errorf("Exec = %d, %v, stdout %q, stderr %q", code, err, out.String(), errb.String())
	}
	// Several at once, each its own output.
	results := make(chan string, 3)
	for _, w := range []string{"a", "b", "c"} {
		go func() {
			var o bytes.Buffer
			c.exec(ctx, []string{"/bin/sh", "-c", "sleep 0.2; echo " + w}, "/", nil, nil, &o, nil)
			results <- o.String()
		}()
	}
	got := map[string]bool{}
	for range 3 {
		got[<-results] = true
	}
	if !got["a\n"] || !got["b\n"] || !got["c\n"] {
		t.Errorf("concurrent outputs %v", got)
	}
	if code, err := c.exec(ctx, []string{"/no/such/program"}, "/", nil, nil, nil, nil); code != 127 || err == nil {
		t.Errorf("a missing program: %d, %v; want 127 and an error", code, err)
	}
}

// TestKill: a cancelled Exec kills the command and what it started.
func TestKill(t *testing.T) {
	c := mustAgent(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.exec(ctx, []string{"/bin/sh", "-c", "(sleep 2; touch " + dir + "/child) & sleep 2; touch " + dir + "/parent"}, "/", nil, nil, nil, nil)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 1500*time.Millisecond {
		t.Fatalf("Exec = %v after %s, want the deadline soon", err, time.Since(start))
	}
	time.Sleep(2500 * time.Millisecond)
	if m, _ := filepath.Glob(filepath.Join(dir, "*")); len(m) != 0 {
		t.Errorf("the killed command's processes went on: %v", m)
	}
}

// TestKillBeforeStart: a kill that reaches the agent before the command
// has started (the agent starts each on a goroutine of its own) ends it
// as it starts. It used to find nothing to kill, and the command ran on.
func TestKillBeforeStart(t *testing.T) {
	c := mustAgent(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 20 {
		pidFile := filepath.Join(t.TempDir(), "pid")
		if _, err := c.exec(ctx, []string{"/bin/sh", "-c", "echo $$ > " + pidFile + "; exec sleep 30"}, "/", nil, nil, nil, nil); !errors.Is(err, context.Canceled) {
			t.Fatalf("Exec = %v, want canceled", err)
		}
		waitGone(t, pidFile, i)
	}
}

// waitGone waits up to 5 s for the process whose pid is in pidFile to be
// gone. Exec returns after the command's exit, or 5 s after its kill:
// one that never got as far as writing pidFile never will.
func waitGone(t *testing.T, pidFile string, round int) {
	t.Helper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	for deadline := time.Now().Add(5 * time.Second); pid > 0 && syscall.Kill(pid, 0) == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("round %d: the command (pid %d) runs on 5 s after its kill", round, pid)
		}
	}
}

// TestRedialAfterServed: an agent whose connections the server took and
// then ended (restarts) dials again at once each time. Its wait doubled
// with every connection and was never reset, so after a few restarts each
// redial took up to 2 s, an exec's wait for its agent with it. Each dial
// asks the route its path says then: a fork's agent, restored from its
// source's memory, dials as the fork.
func TestRedialAfterServed(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var dials atomic.Int32
	path := func() string { return fmt.Sprintf("/agent/%d", dials.Add(1)) }
	go func() {
		execagent.Run(ctx, execagenttest.DialSocket(sock), path, "tok", nil, nil, slog.New(slog.DiscardHandler))
		close(done)
	}()
	defer func() { cancel(); <-done }()
	var last time.Duration
	for i := range 10 {
		start := time.Now()
		conn, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		last = time.Since(start)
		br := bufio.NewReader(conn)
		req, err := http.ReadRequest(br)
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("/agent/%d", i+1); req.URL.Path != want {
			t.Errorf("dial %d asked %s, want %s", i+1, req.URL.Path, want)
		}
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: execagent.Upgrade\r\nUpgrade: "+execagent.Upgrade+"\r\n\r\n")
		conn.Close() // the server's restart
	}
	// Doubling from 10 ms, the tenth wait would be 2 s.
	if last > time.Second {
		t.Errorf("the tenth redial came %v after the server ended the ninth connection", last)
	}
}

// TestAgentGone: an Exec whose agent goes away ends with ErrUnavailable.
func TestAgentGone(t *testing.T) {
	c := mustAgent(t)
	go func() {
		time.Sleep(100 * time.Millisecond)
		c.c.Close()
	}()
	_, err := c.exec(context.Background(), []string{"sleep", "5"}, "/", nil, nil, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "went away") {
		t.Errorf("Exec on a closed connection: %v", err)
	}
}

// TestExecTable: the exec agent answers the exec table as the runtimes'
// Exec do (sandboxtest.ExecTable), here on the host.
func TestExecTable(t *testing.T) {
	c := mustAgent(t)
	dir := t.TempDir()
	sandboxtest.ExecTable(t, func(ctx context.Context, argv []string, dir string, env []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
		in, err := io.ReadAll(stdin)
		if err != nil {
			return -1, err
		}
		return c.exec(ctx, argv, dir, env, in, stdout, stderr)
	}, dir, dir)
}

// agentOnSocket runs the agent dialling a unix socket served here; each
// accept takes its next connection to a Conn over h.
func agentOnSocket(t *testing.T, dials *atomic.Int32, park func(bool)) (accept func(h execagent.Handler) *execagent.Conn) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	dial := execagenttest.DialSocket(sock)
	go func() {
		execagent.Run(ctx, func(ctx context.Context) (net.Conn, error) {
			if dials != nil {
				dials.Add(1)
			}
			return dial(ctx)
		}, func() string { return "/agent" }, "tok", []string{"PATH=/usr/bin:/bin"}, park, slog.New(slog.DiscardHandler))
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done; ln.Close() })
	return func(h execagent.Handler) *execagent.Conn {
		conn, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		if _, err := http.ReadRequest(br); err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+execagent.Upgrade+"\r\n\r\n")
		c := execagent.NewConn(conn, br, h)
		c.Serve()
		t.Cleanup(func() { c.Close() })
		return c
	}
}

// TestCommandsOutliveTheConnection: the server's connection ends while a
// command prints; the command runs on, and when the agent has dialled in
// again and said so, the server gets the rest of its output from where it
// was, every byte once, and its exit.
func TestCommandsOutliveTheConnection(t *testing.T) {
	accept := agentOnSocket(t, nil, nil)
	m := &mem{execs: map[string]*memExec{}}
	m.c = accept(m)
	id, e, err := m.start([]string{"/bin/sh", "-c", "i=0; while [ $i -lt 200 ]; do echo line $i; i=$((i+1)); sleep 0.005; done; exit 7"}, "/", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	m.c.Close() // the server goes away mid-command
	<-m.c.Done()
	time.Sleep(300 * time.Millisecond)
	m.c = accept(m)
	var end [2]any
	select {
	case end = <-e.exit:
	case <-time.After(10 * time.Second):
		t.Fatal("no exit after the reconnect")
	}
	var want strings.Builder
	for i := range 200 {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	m.mu.Lock()
	got := e.out[1].String()
	hello := m.hello
	m.mu.Unlock()
	if got != want.String() || end[0] != 7 {
		t.Errorf("exit %v, output %d bytes (want %d): %q", end[0], len(got), want.Len(), got[max(0, len(got)-40):])
	}
	if len(hello) != 2 || len(hello[0]) != 0 || len(hello[1]) != 1 || hello[1][0].ID != id {
		t.Errorf("hellos %+v, want none then the command", hello)
	}
}

// TestUnknownCommandIsKilled: a command the server does not know after a
// reconnect (one it has no record of) is killed and forgotten.
func TestUnknownCommandIsKilled(t *testing.T) {
	accept := agentOnSocket(t, nil, nil)
	m := &mem{execs: map[string]*memExec{}}
	m.c = accept(m)
	pidFile := filepath.Join(t.TempDir(), "pid")
	if _, _, err := m.start([]string{"/bin/sh", "-c", "echo $$ > " + pidFile + "; exec sleep 30"}, "/", nil, nil); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(pidFile); err == nil || time.Now().After(deadline) {
			break
		}
	}
	m.c.Close()
	accept(&mem{execs: map[string]*memExec{}}) // a server that knows nothing of it
	waitGone(t, pidFile, 0)
}

// TestPark: a parked agent closes its connection, dials nothing while
// parked (its command runs on), and dials again on SIGCONT, with the
// command and all its output.
func TestPark(t *testing.T) {
	var dials atomic.Int32
	var parks []bool
	var parksMu sync.Mutex
	accept := agentOnSocket(t, &dials, func(p bool) { parksMu.Lock(); parks = append(parks, p); parksMu.Unlock() })
	m := &mem{execs: map[string]*memExec{}}
	m.c = accept(m)
	_, e, err := m.start([]string{"/bin/sh", "-c", "i=0; while [ $i -lt 100 ]; do echo line $i; i=$((i+1)); sleep 0.01; done"}, "/", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer pcancel()
	if err := m.c.Park(pctx); err != nil {
		t.Fatal(err)
	}
	// Parked: the command ends meanwhile, and nothing is dialled.
	time.Sleep(1500 * time.Millisecond)
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials while parked, want the first alone", n)
	}
	parksMu.Lock()
	if !slices.Equal(parks, []bool{true}) {
		t.Errorf("park hook calls while parked: %v, want [true]", parks)
	}
	parksMu.Unlock()
	syscall.Kill(os.Getpid(), syscall.SIGCONT)
	m.c = accept(m)
	select {
	case end := <-e.exit:
		if end[0] != 0 {
			t.Errorf("exit %v", end)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit after the wake")
	}
	var want strings.Builder
	for i := range 100 {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	m.mu.Lock()
	got := e.out[1].String()
	m.mu.Unlock()
	if got != want.String() {
		t.Errorf("output %d bytes, want %d", len(got), want.Len())
	}
	parksMu.Lock()
	if !slices.Equal(parks, []bool{true, false}) {
		t.Errorf("park hook calls: %v, want [true false]", parks)
	}
	parksMu.Unlock()
}
