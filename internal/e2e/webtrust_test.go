//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/service"
)

// TestWebPagesCannotDriveTheAPI sends, to the real server with no token
// (the default on loopback), the requests a web page can make: a "simple"
// cross-site POST that needs no preflight, and requests through a name
// rebound to 127.0.0.1. They are refused before they do anything; the
// server's own origin, the CLI, a listed name and the worker's webhook
// still work.
func TestWebPagesCannotDriveTheAPI(t *testing.T) {
	s := MustStart(t, func(c *config.Config) {
		c.HTTP.AllowedHosts = []string{"corral.test"}
	})
	spawn := `{"task_description":"from a web page","agent":"command","command":["sh","-c","echo pwned > output/p.txt"]}`
	for _, c := range []struct {
		name, method, path, host, origin, contentType, body string
		want                                                int
	}{
		{"a page's text/plain POST", "POST", "/api/tasks", "", "http://attacker.example", "text/plain", spawn, 403},
		{"a page's form POST", "POST", "/api/tasks", "", "http://attacker.example", "application/x-www-form-urlencoded", "a=b", 403},
		{"a sandboxed page's POST", "POST", "/api/tasks", "", "null", "text/plain", spawn, 403},
		{"text/plain without Origin", "POST", "/api/tasks", "", "", "text/plain", spawn, 415},
		{"a page's tool call", "POST", "/api/tools/spawn_worker", "", "http://attacker.example", "text/plain", spawn, 403},
		{"a page's MCP call", "POST", "/mcp", "", "http://attacker.example", "application/json", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`, 403},
		{"text/plain MCP call", "POST", "/mcp", "", "", "text/plain", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`, 415},
		{"rebinding: list", "GET", "/api/tasks", "rebind.attacker.example", "", "", "", 403},
		{"rebinding: events", "GET", "/api/events", "rebind.attacker.example:7777", "", "", "", 403},
		{"rebinding: metrics", "GET", "/metrics", "rebind.attacker.example", "", "", "", 403},
		{"rebinding: MCP", "GET", "/mcp", "rebind.attacker.example", "", "", "", 403},
		{"rebinding: workspace", "GET", "/api/workspace/", "rebind.attacker.example", "", "", "", 403},
	} {
		code, body := webRequest(t, s.url, c.method, c.path, c.host, c.origin, c.contentType, c.body)
		if code != c.want {
			t.Errorf("%s: HTTP %d %s, want %d", c.name, code, body, c.want)
			continue
		}
		var eb struct {
			Error     string `json:"error"`
			RequestID string `json:"request_id"`
		}
		if err := json.Unmarshal([]byte(body), &eb); err != nil || eb.RequestID == "" || eb.Error == "" {
			t.Errorf("%s: body %s is not the API's error format", c.name, body)
		}
	}
	page, err := s.client.List(context.Background(), service.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Tasks) != 0 {
		t.Fatalf("the refused requests made %d tasks", len(page.Tasks))
	}

	// The server's own origin (a web UI it serves), a listed name, and the
	// CLI. The task's completion comes by the worker webhook.
	code, body := webRequest(t, s.url, "POST", "/api/tasks", "", s.url, "application/json; charset=utf-8", `{"task_description":"same origin","agent":"command","command":["true"]}`)
	if code != http.StatusCreated {
		t.Fatalf("same-origin spawn: HTTP %d %s", code, body)
	}
	var created struct {
		TaskID string `json:"task_id"`
	}
	if err := json.Unmarshal([]byte(body), &created); err != nil || created.TaskID == "" {
		t.Fatalf("same-origin spawn answered %s", body)
	}
	s.waitSuccess(t, created.TaskID, 60*time.Second)
	if got := completedBy(t, s, created.TaskID); got != "webhook" {
		t.Errorf("the task ended by %q, want by its completion webhook", got)
	}
	if code, body := webRequest(t, s.url, "GET", "/api/tasks", "corral.test", "", "", ""); code != 200 {
		t.Errorf("a listed host: HTTP %d %s", code, body)
	}
	// A reverse proxy on this machine forwards its name to /mcp too.
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	req, _ := http.NewRequest("POST", s.url+"/mcp", strings.NewReader(initialize))
	req.Host = "corral.test"
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if code, body := send(t, req); code != 200 {
		t.Errorf("MCP through a listed host: HTTP %d %s", code, body)
	}
	file := filepath.Join(t.TempDir(), "a.txt")
	if err := os.WriteFile(file, []byte("not JSON"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"tasks", "--json"}, {"gc", "--dry-run"}, {"ws", "put", "notes/a.txt", file}} {
		cmd := exec.Command(corralBin, append(args, "--server", s.url)...)
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("corral %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

func webRequest(t *testing.T, base, method, path, host, origin, contentType, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return send(t, req)
}
