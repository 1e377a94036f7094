package workercmd

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/workerproto"
)

// TestURLDialer: a pod's exec agent dials the server's URL (the host, the
// scheme's port when none is given), and its requests go under the URL's
// path; what is no http(s) URL with a host is refused, naming the
// variable.
func TestURLDialer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		req, err := http.ReadRequest(bufio.NewReader(conn))
		if err != nil {
			got <- err.Error()
			return
		}
		got <- req.Method + " " + req.URL.Path
	}()
	dial, prefix, err := urlDialer("http://" + ln.Addr().String() + "/corral/")
	if err != nil || prefix != "/corral" {
		t.Fatalf("urlDialer: prefix %q, %v; want /corral", prefix, err)
	}
	conn, err := dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("POST " + prefix + "/api/sessions/s/agent HTTP/1.1\r\nHost: corral\r\nContent-Length: 0\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r != "POST /corral/api/sessions/s/agent" {
		t.Errorf("the server read %q", r)
	}
	for _, bad := range []string{"unix:///run/corral.sock", "http://", "ftp://server", "server:8080", "%"} {
		if _, _, err := urlDialer(bad); err == nil || !strings.Contains(err.Error(), workerproto.EnvServerURL) {
			t.Errorf("urlDialer(%q): %v; want an error naming %s", bad, err, workerproto.EnvServerURL)
		}
	}
}
