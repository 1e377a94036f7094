package workerproto

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// A sandbox dials its replica's socket, and the host's shared one beside
// its directory once nothing answers there.
func TestDialServer(t *testing.T) {
	dir := t.TempDir()
	own := filepath.Join(dir, "r-a.sock")
	shared := filepath.Join(dir, SocketName)
	serve := func(path, name string) net.Listener {
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Write([]byte(name))
				c.Close()
			}
		}()
		return ln
	}
	reached := func() string {
		t.Helper()
		c, err := DialServer(context.Background(), own)
		if err != nil {
			return "error: " + err.Error()
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		return string(b)
	}
	if got := reached(); !strings.HasPrefix(got, "error: ") {
		t.Errorf("no socket served: reached %q", got)
	}
	sharedLn := serve(shared, "shared")
	defer sharedLn.Close()
	if got := reached(); got != "shared" {
		t.Errorf("the replica gone: reached %q, want the shared socket", got)
	}
	ownLn := serve(own, "own")
	defer ownLn.Close()
	if got := reached(); got != "own" {
		t.Errorf("the replica alive: reached %q, want its own socket", got)
	}
}
