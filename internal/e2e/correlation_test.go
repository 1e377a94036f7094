//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// TestEventsCarryCorrelationAndCausation: every event of a task carries
// the correlation id its spawn request chose, and a causation id that is
// the request (for the first) or an earlier event of the task, over the
// JSON API and SSE alike; the task and the response name the correlation.
func TestEventsCarryCorrelationAndCausation(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()

	spawn := func(corr string) (*http.Response, string) {
		t.Helper()
		body := `{"task_description":"say hi","agent":"command","command":["sh","-c","echo hi > output/hi.txt"]}`
		req, _ := http.NewRequest(http.MethodPost, s.url+"/api/tasks", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if corr != "" {
			req.Header.Set("X-Correlation-ID", corr)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r struct {
			TaskID string `json:"task_id"`
		}
		json.NewDecoder(resp.Body).Decode(&r)
		return resp, r.TaskID
	}

	const corr = "conv-42/turn:7"
	resp, id := spawn(corr)
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("X-Correlation-ID") != corr {
		t.Fatalf("spawn: %d, X-Correlation-ID %q, want 201 and %q", resp.StatusCode, resp.Header.Get("X-Correlation-ID"), corr)
	}
	s.waitSuccess(t, id, 30*time.Second)
	tk, err := s.client.Get(ctx, id)
	if err != nil || tk.CorrelationID != corr {
		t.Fatalf("task correlation_id %q (%v), want %q", tk.CorrelationID, err, corr)
	}

	check := func(how string, evs []eventstore.Event) {
		t.Helper()
		seen := map[string]bool{}
		for i, e := range evs {
			switch {
			case e.CorrelationID != corr:
				t.Errorf("%s: event %d %s has correlation_id %q, want %q", how, i, e.Type, e.CorrelationID, corr)
			case i == 0 && !strings.HasPrefix(e.CausationID, "request/req_"):
				t.Errorf("%s: %s caused by %q, want the spawn request", how, e.Type, e.CausationID)
			case i > 0 && !seen[e.CausationID] && !strings.HasPrefix(e.CausationID, "request/req_"):
				t.Errorf("%s: event %d %s caused by %q: neither an earlier event of the task nor a request", how, i, e.Type, e.CausationID)
			}
			seen[e.ID] = true
		}
		if len(evs) < 5 || evs[1].Type != task.EventQueued || evs[1].CausationID != evs[0].ID {
			t.Errorf("%s: want task_queued caused by task_created, got %+v", how, evs)
		}
	}
	var listed []eventstore.Event
	if err := s.client.Events(ctx, service.EventsRequest{TaskID: id}, func(e eventstore.Event) error {
		listed = append(listed, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	check("JSON", listed)
	var streamed []eventstore.Event
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s.client.Events(sctx, service.EventsRequest{TaskID: id, Follow: true}, func(e eventstore.Event) error {
		streamed = append(streamed, e)
		if e.Type == task.EventCompleted {
			return errStop
		}
		return nil
	})
	check("SSE", streamed)

	// Without a header the server makes one, returns it and keeps it.
	resp, id2 := spawn("")
	got := resp.Header.Get("X-Correlation-ID")
	if !strings.HasPrefix(got, "corr_") {
		t.Fatalf("made correlation id %q, want corr_...", got)
	}
	if tk, _ := s.client.Get(ctx, id2); tk.CorrelationID != got {
		t.Errorf("task correlation_id %q, want the returned %q", tk.CorrelationID, got)
	}

	// A cancel is caused by its own request and keeps the task's
	// correlation.
	tk3 := s.spawn(t, "sleeper", "sleep", "60")
	s.waitStatus(t, tk3.ID, task.Running, 20*time.Second)
	req, _ := http.NewRequest(http.MethodPost, s.url+"/api/tasks/"+tk3.ID+"/cancel", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Correlation-ID", "someone-else")
	if code, body := send(t, req); code != http.StatusOK {
		t.Fatalf("cancel: %d %s", code, body)
	}
	s.wait(t, tk3.ID, 20*time.Second)
	var cancelEvents []eventstore.Event
	s.client.Events(ctx, service.EventsRequest{TaskID: tk3.ID}, func(e eventstore.Event) error {
		cancelEvents = append(cancelEvents, e)
		return nil
	})
	for _, e := range cancelEvents {
		if e.CorrelationID != tk3.CorrelationID || e.CausationID == "" {
			t.Errorf("%s: correlation %q causation %q, want the task's %q and a cause", e.Type, e.CorrelationID, e.CausationID, tk3.CorrelationID)
		}
		if e.Type == task.EventCancelRequested && !strings.HasPrefix(e.CausationID, "request/req_") {
			t.Errorf("task_cancel_requested caused by %q, want the cancel request", e.CausationID)
		}
	}

	// A malformed id is refused, not stored.
	for _, bad := range []string{"has space", strings.Repeat("x", 129)} {
		req, _ := http.NewRequest(http.MethodGet, s.url+"/api/tasks", nil)
		req.Header["X-Correlation-Id"] = []string{bad}
		if code, body := send(t, req); code != http.StatusBadRequest || !strings.Contains(body, "X-Correlation-ID") {
			t.Errorf("X-Correlation-ID %q: %d %s, want 400 naming the header", bad, code, body)
		}
	}
}
