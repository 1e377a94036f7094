package httpapi

import (
	"net/http"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// TestCorrelationIDInResponseAndLog: a request's X-Correlation-ID comes
// back on the response and in the server's log line for the request; a
// request without one gets a new one; a malformed one is a 400.
func TestCorrelationIDInResponseAndLog(t *testing.T) {
	b := &stub{spawn: func(service.SpawnRequest) (task.Task, bool, error) {
		return task.Task{ID: "task-1", Status: task.Queued}, false, nil
	}}
	_, url, logs := MustServe(t, b, "")
	post := func(corr string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, url+"/api/tasks", strings.NewReader(`{"task_description":"x"}`))
		req.Header.Set("Content-Type", "application/json")
		if corr != "" {
			req.Header.Set(HeaderCorrelationID, corr)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	resp := post("chat-9:msg-3")
	if resp.StatusCode != http.StatusCreated || resp.Header.Get(HeaderCorrelationID) != "chat-9:msg-3" {
		t.Fatalf("%d with %s %q, want 201 and the caller's id", resp.StatusCode, HeaderCorrelationID, resp.Header.Get(HeaderCorrelationID))
	}
	rid := resp.Header.Get("X-Request-Id")
	if !strings.Contains(logs.String(), "correlation_id=chat-9:msg-3") || !strings.Contains(logs.String(), "request_id="+rid) {
		t.Errorf("log does not name the request's correlation and request ids:\n%s", logs)
	}
	if got := post("").Header.Get(HeaderCorrelationID); !strings.HasPrefix(got, "corr_") {
		t.Errorf("made correlation id %q, want corr_...", got)
	}
	if resp := post("two words"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("malformed correlation id: %d, want 400", resp.StatusCode)
	}
}
