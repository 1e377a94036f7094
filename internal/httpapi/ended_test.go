package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// TestEndedResultEncodedOnce: the long polls of an ended task share one
// encoding of its result, which is what each would have written alone,
// and a later version of the task, a task not ended or a result with file
// contents is encoded anew.
func TestEndedResultEncodedOnce(t *testing.T) {
	var mu sync.Mutex
	res := service.Result{Task: task.Task{ID: "task-1", Status: task.Success, Summary: "first <b>", Version: 5}, Done: true}
	st := &stub{result: func(r service.ResultRequest) (service.Result, error) {
		mu.Lock()
		defer mu.Unlock()
		out := res
		if len(r.IncludeFileContents) > 0 {
			out.FileContents = map[string]service.File{"a.txt": {Path: "a.txt", Content: "A"}}
		}
		return out, nil
	}}
	h := newTestServer(st, Options{AllowedHosts: []string{"127.0.0.1"}}, slog.New(slog.DiscardHandler)).Handler()
	get := func(query string) []byte {
		t.Helper()
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/api/tasks/task-1/result"+query, nil)
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("GET result%s: %d %s, %s", query, rec.Code, rec.Header().Get("Content-Type"), rec.Body)
		}
		return rec.Body.Bytes()
	}
	want := func() []byte {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		mu.Lock()
		defer mu.Unlock()
		enc.Encode(res)
		return b.Bytes()
	}
	set := func(f func(*service.Result)) {
		mu.Lock()
		f(&res)
		mu.Unlock()
	}
	first := get("")
	if !bytes.Equal(first, want()) || !bytes.Equal(get("?wait=1s"), first) {
		t.Errorf("ended result %s, want %s twice", first, want())
	}
	set(func(r *service.Result) { r.Summary, r.Version = "second", 6 })
	if got := get(""); !bytes.Equal(got, want()) || !strings.Contains(string(got), "second") {
		t.Errorf("after a later event: %s, want %s", got, want())
	}
	if got := get("?include_file_contents=a.txt"); !strings.Contains(string(got), `"file_contents"`) {
		t.Errorf("with file contents: %s", got)
	}
	set(func(r *service.Result) { r.Status, r.Done, r.Summary = task.Running, false, "running" })
	if got := get(""); !bytes.Equal(got, want()) {
		t.Errorf("a task not ended: %s, want %s", got, want())
	}
	set(func(r *service.Result) { r.Summary = "still running" })
	if got := get(""); !bytes.Equal(got, want()) {
		t.Errorf("a task not ended, changed at the same version: %s, want %s", got, want())
	}
}

// TestEndedResultsBounded: only the last keepEnded tasks' results stay.
func TestEndedResultsBounded(t *testing.T) {
	var e endedResults
	for i := range 3 * keepEnded {
		e.encode(service.Result{Task: task.Task{ID: fmt.Sprintf("task-%d", i), Status: task.Success}, Done: true})
	}
	if len(e.byID) != keepEnded || len(e.order) != keepEnded || e.byID[fmt.Sprintf("task-%d", 3*keepEnded-1)] == nil {
		t.Errorf("%d results kept (%d in order), want the last %d", len(e.byID), len(e.order), keepEnded)
	}
}

// BenchmarkEndedResult: one long poll's answer for an ended task, the
// handler alone on a recorder: what each of the many waiters a task's
// end wakes costs the server after its wake.
func BenchmarkEndedResult(b *testing.B) {
	res := service.Result{Task: task.Task{ID: "task-1", Status: task.Success, Summary: strings.Repeat("done. ", 40), Version: 7,
		Spec: task.Spec{Description: strings.Repeat("a task. ", 100), Agent: "command", Command: []string{"echo", "hi"}, Runtime: "local"}}, Done: true}
	st := &stub{result: func(service.ResultRequest) (service.Result, error) { return res, nil }}
	h := newTestServer(st, Options{AllowedHosts: []string{"127.0.0.1"}}, slog.New(slog.DiscardHandler)).Handler()
	req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/api/tasks/task-1/result?wait=1m", nil)
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("%d %s", rec.Code, rec.Body)
		}
		io.Copy(io.Discard, rec.Body)
	}
}
