package httpapi

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// A body that stops arriving closes its connection after BodyStall; one
// that keeps arriving, however slowly overall, is read to its end.
func TestStalledBodyIsCut(t *testing.T) {
	b := &stub{spawn: func(r service.SpawnRequest) (task.Task, bool, error) {
		return task.Task{ID: "task-1", Status: task.Queued}, false, nil
	}}
	var logs strings.Builder
	srv := newTestServer(b, Options{BodyStall: 300 * time.Millisecond}, slogTo(&logs))
	t.Cleanup(func() { t.Log(logs.String()) })
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	addr := strings.TrimPrefix(hs.URL, "http://")
	body := `{"task_description": "hello", "agent": "command", "command": ["true"]}`
	send := func(c net.Conn) {
		fmt.Fprintf(c, "POST /api/tasks HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", addr, len(body))
	}

	// Stalled: half the body, then nothing.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send(c)
	c.Write([]byte(body[:10]))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatalf("a stalled body got %d", resp.StatusCode)
		}
		_, err = c.Read(make([]byte, 1))
	}
	if err == nil || time.Since(start) > 3*time.Second {
		t.Errorf("the stalled connection is still open after %s (%v)", time.Since(start), err)
	}

	// Trickling: a byte every 100 ms, over longer than BodyStall in all.
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	send(c2)
	go func() {
		for i := 0; i < len(body); i += 8 {
			c2.Write([]byte(body[i:min(i+8, len(body))]))
			time.Sleep(100 * time.Millisecond)
		}
	}()
	c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err = http.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil {
		t.Fatalf("a trickling body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("a trickling body got %d, want 201", resp.StatusCode)
	}
}

// A request refused before its body is read (here, a Host header with no
// port, which the web trust check refuses) with a body that stalls is cut
// after BodyStall too. The server answered, then waited for ever to drain
// the rest of the body, without any deadline: such requests held a
// descriptor each until the server had none left.
func TestStalledUnreadBodyIsCut(t *testing.T) {
	srv := newTestServer(&stub{}, Options{BodyStall: 300 * time.Millisecond}, slogTo(io.Discard))
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	addr := strings.TrimPrefix(hs.URL, "http://")
	for _, path := range []string{"/api/tasks", "/api/tools/spawn_worker", "/api/attachments"} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"a\":", path)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		start := time.Now()
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			_, err = br.ReadByte() // the close
		}
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s: the connection is still open after %s (%v)", path, time.Since(start), err)
		}
		c.Close()
	}
}
