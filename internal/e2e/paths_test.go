//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
)

// traversal are the path payloads every path-taking API is tried with.
var traversal = []string{
	"..", "../corral.db", "a/../../corral.db", "data/../../corral.db",
	"%2e%2e/corral.db", "%2e%2e%2fcorral.db", "..%2fcorral.db", "%252e%252e%252fcorral.db",
	"....//corral.db", "..././corral.db", ".%2e/corral.db",
	"/etc/passwd", "//etc/passwd", "/workspace/shared/../../corral.db", "/workspace/shared-evil/x",
	"data/x%00.txt", "data\\..\\..\\corral.db", "link-out/secret.txt", "file-out", "swap",
}

// TestPathTraversalEveryAPI tries every payload against every API that
// takes a path; none may read or write outside shared/ (or the task's
// output/), and none may answer with 5xx.
func TestPathTraversalEveryAPI(t *testing.T) {
	t.Parallel()
	// About 400 requests back to back, twice a token's burst (limits.api_burst):
	// the paths are what is tried here, not the rate limit.
	s := MustStart(t, func(c *config.Config) { c.Limits.APIRate = 0 })
	const secret = "TOP-SECRET-OUTSIDE-SHARED"
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret.txt"), []byte(secret), 0o644)
	os.WriteFile(filepath.Join(s.data, "outside.txt"), []byte(secret), 0o644)
	shared := filepath.Join(s.data, "shared")
	os.Symlink(outside, filepath.Join(shared, "link-out"))
	os.Symlink(filepath.Join(outside, "secret.txt"), filepath.Join(shared, "file-out"))

	// A task whose output has the same traps.
	tk := s.spawn(t, "traps in output", "sh", "-c", "echo fine > output/ok.txt; ln -s "+filepath.Join(outside, "secret.txt")+" output/file-out; ln -s /etc output/link-out")
	s.waitSuccess(t, tk.ID, 30*time.Second)

	// "swap" flips between a regular file and a symlink out of shared/
	// while the requests run: a check-then-open would race; os.Root does not.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p := filepath.Join(shared, "swap")
		for {
			select {
			case <-stop:
				return
			default:
			}
			os.Remove(p)
			os.WriteFile(p, []byte("harmless"), 0o644)
			os.Remove(p)
			os.Symlink(filepath.Join(outside, "secret.txt"), p)
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	var checked atomic.Int32
	check := func(what string, code int, body string) {
		t.Helper()
		checked.Add(1)
		if strings.Contains(body, secret) || strings.Contains(body, "root:x:0:0") {
			t.Errorf("%s leaked outside content: %d %s", what, code, body)
		}
		if code >= 500 || code == http.StatusTooManyRequests {
			t.Errorf("%s: %d %s", what, code, body)
		}
	}
	for round := 0; round < 3; round++ {
		for _, p := range traversal {
			esc, js := urlPath(p), jsonString(p)
			code, body := s.do(t, "GET", "/api/workspace/"+esc, "", nil)
			check("GET /api/workspace/"+p, code, body)
			code, body = s.do(t, "GET", "/api/tasks/"+tk.ID+"/files/"+esc, "", nil)
			check("GET files/"+p, code, body)
			if code == 200 && p != "swap" && p != ".." { // ".." is cleaned to the task itself
				t.Errorf("GET files/%s answered 200: %s", p, body)
			}
			for _, call := range []struct{ tool, args string }{
				{"read_workspace", `{"path":"` + js + `"}`},
				{"list_workspace", `{"path":"` + js + `","recursive":true}`},
				{"read_task_result", `{"task_id":"` + tk.ID + `","include_file_contents":["` + js + `"]}`},
			} {
				code, body := s.do(t, "POST", "/api/tools/"+call.tool, "application/json", strings.NewReader(call.args))
				check(call.tool+" "+p, code, body)
			}
			code, body = s.do(t, "POST", "/api/tasks", "application/json", strings.NewReader(`{"task_description":"x","command":["true"],"context_files":["`+js+`"]}`))
			check("context_files "+p, code, body)
			if code < 400 {
				// Only "swap", caught as a regular file (whole, or empty
				// between its creation and its write), may be copied.
				var r struct {
					TaskID string `json:"task_id"`
				}
				json.Unmarshal([]byte(body), &r)
				copied, _ := os.ReadFile(filepath.Join(s.data, "tasks", r.TaskID, "context", filepath.Base(p)))
				if p != "swap" || (string(copied) != "harmless" && len(copied) != 0) {
					t.Errorf("context_files %q accepted (%s), copied %q", p, body, copied)
				}
			}
		}
	}
	// Writes last: a write inside shared/ (a leading "/" is relative to it)
	// creates files that later reads would rightly find.
	for _, p := range traversal {
		esc, js := urlPath(p), jsonString(p)
		code, body := s.do(t, "PUT", "/api/workspace/"+esc, "", strings.NewReader("written"))
		check("PUT /api/workspace/"+p, code, body)
		code, body = s.do(t, "POST", "/api/tools/write_workspace", "application/json", strings.NewReader(`{"path":"`+js+`","content":"written"}`))
		check("write_workspace "+p, code, body)
	}
	if got, _ := os.ReadFile(filepath.Join(outside, "secret.txt")); string(got) != secret {
		t.Errorf("a write changed the file outside shared/: %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(s.data, "outside.txt")); string(got) != secret {
		t.Errorf("a write changed the data root's file: %q", got)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Errorf("a write created files outside shared/: %v", ents)
	}
	res, err := s.client.Result(context.Background(), resultReq(tk.ID, "ok.txt"))
	if err != nil || res.FileContents["ok.txt"].Content != "fine\n" {
		t.Errorf("the task's own output is unreadable: %v %v", res.FileContents, err)
	}
	for _, f := range res.OutputFiles {
		if f.Name != "ok.txt" {
			t.Errorf("output_files lists %q, a symlink", f.Name)
		}
	}
	t.Logf("%d requests checked", checked.Load())
}

// urlPath puts a payload in a URL path as a client would send it.
func urlPath(p string) string { return strings.ReplaceAll(p, "\\", "%5C") }

// jsonString puts a payload in a JSON string, "%00" as a real NUL.
func jsonString(p string) string {
	return strings.ReplaceAll(strings.ReplaceAll(p, "\\", "\\\\"), "%00", "\\u0000")
}
