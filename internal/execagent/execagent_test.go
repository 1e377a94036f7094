package execagent_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/execagent"
	"github.com/corral-dev/corral/internal/execagent/execagenttest"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
)

// mustAgent runs the agent on this host and returns the server's side of
// its connection, once it dialled in.
func mustAgent(t *testing.T) *execagent.Conn {
	t.Helper()
	c := execagent.NewConn(execagenttest.Dial(t, []string{"PATH=/usr/bin:/bin", "BASE=1"}))
	t.Cleanup(func() { c.Close() })
	return c
}

func TestExec(t *testing.T) {
	c := mustAgent(t)
	ctx := context.Background()
	var out, errb bytes.Buffer
	code, err := c.Exec(ctx, []string{"/bin/sh", "-c", `read l; echo "$l $BASE $EXTRA $(pwd)"; echo oops >&2; exit 3`}, "/tmp", []string{"EXTRA=2"}, []byte("hi\n"), &out, &errb)
	if err != nil || code != 3 || out.String() != "hi 1 2 /tmp\n" || errb.String() != "oops\n" {
		t.Errorf("Exec = %d, %v, stdout %q, stderr %q", code, err, out.String(), errb.String())
	}
	// Several at once, each its own output.
	results := make(chan string, 3)
	for _, w := range []string{"a", "b", "c"} {
		go func() {
			var o bytes.Buffer
			c.Exec(ctx, []string{"/bin/sh", "-c", "sleep 0.2; echo " + w}, "/", nil, nil, &o, nil)
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
	if code, err := c.Exec(ctx, []string{"/no/such/program"}, "/", nil, nil, nil, nil); code != 127 || err == nil {
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
	_, err := c.Exec(ctx, []string{"/bin/sh", "-c", "(sleep 2; touch " + dir + "/child) & sleep 2; touch " + dir + "/parent"}, "/", nil, nil, nil, nil)
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
		if _, err := c.Exec(ctx, []string{"/bin/sh", "-c", "echo $$ > " + pidFile + "; exec sleep 30"}, "/", nil, nil, nil, nil); !errors.Is(err, context.Canceled) {
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
// redial took up to 2 s, an exec's wait for its agent with it.
func TestRedialAfterServed(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		execagent.Run(ctx, execagenttest.DialSocket(sock), "/agent", "tok", nil, slog.New(slog.DiscardHandler))
		close(done)
	}()
	defer func() { cancel(); <-done }()
	var last time.Duration
	for range 10 {
		start := time.Now()
		conn, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		last = time.Since(start)
		br := bufio.NewReader(conn)
		if _, err := http.ReadRequest(br); err != nil {
			t.Fatal(err)
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
		c.Close()
	}()
	_, err := c.Exec(context.Background(), []string{"sleep", "5"}, "/", nil, nil, nil, nil)
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
		return c.Exec(ctx, argv, dir, env, in, stdout, stderr)
	}, dir, dir)
}
