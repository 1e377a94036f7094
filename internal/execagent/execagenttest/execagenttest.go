// Package execagenttest runs the real exec agent on this host for tests:
// it dials a socket the test serves, and the test gets the upgraded
// connection, as the server's agent route would.
package execagenttest

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/corral-dev/corral/internal/execagent"
)

// Path and Token are what the agent Dial runs asks for.
const (
	Path  = "/api/sessions/s/agent"
	Token = "tok"
)

// Dial runs execagent.Run with env against a unix socket served here,
// checks its request (Path, Token, the upgrade), answers 101 and returns
// the connection and a reader of what the agent sends after the upgrade.
// The agent stops when tb ends.
func Dial(tb testing.TB, env []string) (net.Conn, *bufio.Reader) {
	tb.Helper()
	sock := filepath.Join(tb.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		execagent.Run(ctx, DialSocket(sock), func() string { return Path }, Token, env, nil, slog.New(slog.DiscardHandler))
		close(done)
	}()
	tb.Cleanup(func() { cancel(); <-done })
	conn, err := ln.Accept()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	br := bufio.NewReader(conn)
	req, err := http.ReadRequest(br)
	if err != nil || req.URL.Path != Path || req.Header.Get("Authorization") != "Bearer "+Token || req.Header.Get("Upgrade") != execagent.Upgrade {
		tb.Fatalf("the agent's request: %+v, %v", req, err)
	}
	io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+execagent.Upgrade+"\r\n\r\n")
	return conn, br
}

// DialSocket is execagent.Run's dial for the unix socket sock.
func DialSocket(sock string) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}
}
