package mcpserver

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// legacy is the protocol MCP clients speak today, and the one /mcp's
// streamable HTTP sessions speak (the SDK offers 2026-07-28 to stateless
// servers only).
var legacy = &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"}

// endLog records what a client is told of tasks' ends.
type endLog struct {
	mu      sync.Mutex
	ends    []taskEnd // logging notifications of logger "corral"
	updated []string  // resources/updated URIs
}

func (l *endLog) got() ([]taskEnd, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]taskEnd(nil), l.ends...), append([]string(nil), l.updated...)
}

// mustListen connects a client to s that records what it is told of
// tasks' ends; on the legacy protocol it sets its log level to info, as a
// client that wants logging notifications does.
func mustListen(tb testing.TB, s *Server, copts *mcp.ClientSessionOptions) (*mcp.ClientSession, *endLog) {
	tb.Helper()
	l := &endLog{}
	cs := mustConnectTo(tb, s, &mcp.ClientOptions{
		LoggingMessageHandler: func(_ context.Context, r *mcp.LoggingMessageRequest) {
			if r.Params.Logger != "corral" {
				return
			}
			b, _ := json.Marshal(r.Params.Data)
			var e taskEnd
			if err := json.Unmarshal(b, &e); err != nil {
				tb.Errorf("logging notification %s: %v", b, err)
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			l.ends = append(l.ends, e)
		},
		ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.updated = append(l.updated, r.Params.URI)
		},
	}, copts)
	if copts != nil {
		if err := cs.SetLoggingLevel(context.Background(), &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
			tb.Fatal(err)
		}
	}
	return cs, l
}

// followed counts the tasks whose end s follows and the sessions it
// awaits the close of.
func (s *Server) followed() (tasks, sessions int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ends), len(s.sessions)
}

func newServer(svc service.Set) *Server {
	return New(svc, Options{}, slog.New(slog.DiscardHandler))
}

// spawn starts a task through a session's spawn_worker, which returns at
// once.
func spawn(tb testing.TB, cs *mcp.ClientSession) string {
	tb.Helper()
	var r struct {
		TaskID string `json:"task_id"`
		Status string `json:"status"`
	}
	MustOK(tb, cs, "spawn_worker", map[string]any{"task_description": "x", "agent": "command", "command": []string{"true"}}, &r)
	if r.Status != string(task.Queued) {
		tb.Fatalf("spawn_worker returned a task %s", r.Status)
	}
	return r.TaskID
}

// TestSpawnerToldOfTaskEnd: the session that spawned a task with
// spawn_worker, which returned at once, is sent a logging notification
// when the task ends later; another session is not.
func TestSpawnerToldOfTaskEnd(t *testing.T) {
	f := MustFixture(t)
	s := newServer(f.svc)
	a, aLog := mustListen(t, s, legacy)
	b, bLog := mustListen(t, s, legacy)

	id := spawn(t, a)
	f.MustComplete(t, id, map[string]string{"out.txt": "x"})
	waitFor(t, func() bool { ends, _ := aLog.got(); return len(ends) > 0 })
	ends, updated := aLog.got()
	want := []taskEnd{{EventType: task.EventCompleted, TaskID: id, URI: "corral://tasks/" + id, Status: task.Success, Summary: "done", OutputFiles: []string{"out.txt"}}}
	if d := cmp.Diff(want, ends, cmpopts.IgnoreFields(taskEnd{}, "EventID")); d != "" || ends[0].EventID == "" {
		t.Errorf("spawner told (-want +got):\n%s", d)
	}
	if len(updated) != 0 {
		t.Errorf("spawner that did not subscribe sent resources/updated %q", updated)
	}

	// b hears of the task it spawns, and of no other.
	other := spawn(t, b)
	if _, err := f.tasks.Update(context.Background(), other, func(task.Task) ([]eventstore.Proposed, error) {
		return []eventstore.Proposed{projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Cancelled, Reason: "test"}, "test")}, nil
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { ends, _ := bLog.got(); return len(ends) > 0 })
	time.Sleep(100 * time.Millisecond) // room for a notification that should not come
	if ends, _ := bLog.got(); len(ends) != 1 || ends[0].TaskID != other || ends[0].Status != task.Cancelled {
		t.Errorf("b told %+v, want its own task %s cancelled alone", ends, other)
	}
	if ends, _ := aLog.got(); len(ends) != 1 {
		t.Errorf("a told %+v, want its own task alone", ends)
	}
	if n, _ := s.followed(); n != 0 {
		t.Errorf("%d tasks still followed after their ends", n)
	}
}

// TestSubscriberToldOnce: a session subscribed to corral://tasks/{id} is
// sent resources/updated once, at the task's end, on both protocols (the
// 2026-07-28 one subscribes through subscriptions/listen); a session that
// did not subscribe is sent nothing.
func TestSubscriberToldOnce(t *testing.T) {
	for _, tc := range []struct {
		version string
		copts   *mcp.ClientSessionOptions
	}{{"2025-11-25", legacy}, {"2026-07-28", nil}} {
		t.Run(tc.version, func(t *testing.T) {
			f := MustFixture(t)
			s := newServer(f.svc)
			c, cLog := mustListen(t, s, tc.copts)
			_, dLog := mustListen(t, s, tc.copts)
			if v := c.InitializeResult().ProtocolVersion; v != tc.version {
				t.Fatalf("protocol %s, want %s", v, tc.version)
			}
			ctx := context.Background()
			tk, _, err := f.orch.Spawn(ctx, service.SpawnRequest{TaskDescription: "x", Agent: "command", Command: []string{"true"}})
			if err != nil {
				t.Fatal(err)
			}
			uri := "corral://tasks/" + tk.ID
			for range 2 { // subscribing again changes nothing
				if err := c.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
					t.Fatal(err)
				}
			}
			// On 2026-07-28, Subscribe returns once subscriptions/listen is
			// sent, not when the server has it (the SDK's client drops the
			// acknowledgement): the task must end after that.
			waitFor(t, func() bool { n, _ := s.followed(); return n == 1 })
			// The task's other events are not its end.
			update(t, f, tk.ID, projection.NewEvent(task.EventStarting, nil, "test"), projection.NewEvent(task.EventStarted, task.Started{SandboxName: tk.ID}, "test"),
				projection.NewEvent(task.EventProgress, task.Progress{Kind: "text", Text: "working"}, "test"))
			update(t, f, tk.ID, projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Failed, ErrorMessage: "exit 1"}, "test"))
			waitFor(t, func() bool { _, u := cLog.got(); return len(u) > 0 })
			time.Sleep(100 * time.Millisecond) // room for a notification that should not come
			if ends, updated := cLog.got(); !cmp.Equal(updated, []string{uri}) || len(ends) != 0 {
				t.Errorf("subscriber sent resources/updated %q and logging %+v, want %s once alone", updated, ends, uri)
			}
			if ends, updated := dLog.got(); len(updated)+len(ends) != 0 {
				t.Errorf("a session that did not subscribe was sent %q and %+v", updated, ends)
			}
			// The read that follows the notification shows the end.
			res, err := c.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
			if err != nil {
				t.Fatal(err)
			}
			var r service.Result
			if err := json.Unmarshal([]byte(res.Contents[0].Text), &r); err != nil || !r.Done || r.Status != task.Failed || r.ErrorMessage != "exit 1" {
				t.Errorf("read %s: %s (%v)", uri, res.Contents[0].Text, err)
			}
		})
	}
}

func update(tb testing.TB, f *fixture, id string, evs ...eventstore.Proposed) {
	tb.Helper()
	if _, err := f.tasks.Update(context.Background(), id, func(task.Task) ([]eventstore.Proposed, error) { return evs, nil }); err != nil {
		tb.Fatal(err)
	}
}

// TestWatchEndsWithInterest: a task's end is no longer followed once no
// session is left to tell: its spawner and subscriber closed, or its
// subscriber unsubscribed. Nothing is kept of a closed session.
func TestWatchEndsWithInterest(t *testing.T) {
	f := MustFixture(t)
	s := newServer(f.svc)
	ctx := context.Background()

	a, _ := mustListen(t, s, legacy)
	id := spawn(t, a)
	if err := a.Subscribe(ctx, &mcp.SubscribeParams{URI: "corral://tasks/" + id}); err != nil {
		t.Fatal(err)
	}
	if n, m := s.followed(); n != 1 || m != 1 {
		t.Fatalf("following %d tasks for %d sessions, want 1 for 1", n, m)
	}
	a.Close()
	waitFor(t, func() bool { n, m := s.followed(); return n == 0 && m == 0 })
	f.MustComplete(t, id, nil) // told to no one

	c, cLog := mustListen(t, s, legacy)
	tk, _, err := f.orch.Spawn(ctx, service.SpawnRequest{TaskDescription: "x", Agent: "command", Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	uri := "corral://tasks/" + tk.ID
	if err := c.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
		t.Fatal(err)
	}
	if err := c.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: uri}); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.followed(); n != 0 {
		t.Errorf("following %d tasks after the only subscriber left", n)
	}
	f.MustComplete(t, tk.ID, nil)
	time.Sleep(100 * time.Millisecond) // room for a notification that should not come
	if _, updated := cLog.got(); len(updated) != 0 {
		t.Errorf("unsubscribed session sent %q", updated)
	}

	// A task that has ended is not followed: it will not end again.
	if err := c.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.followed(); n != 0 {
		t.Errorf("following %d tasks after subscribing to an ended one", n)
	}
}

// TestTaskResource: corral://tasks/{id} is listed as a template and reads
// as read_task_result answers; an unknown task is not found, to read or
// to subscribe to. A session's server (workspace_exec alone) offers no
// tasks.
func TestTaskResource(t *testing.T) {
	f := MustFixture(t)
	cs, _ := mustListen(t, newServer(f.svc), legacy)
	ctx := context.Background()
	tmpl, err := cs.ListResourceTemplates(ctx, nil)
	if err != nil || len(tmpl.ResourceTemplates) != 1 || tmpl.ResourceTemplates[0].URITemplate != "corral://tasks/{id}" {
		t.Fatalf("resource templates %+v %v", tmpl, err)
	}
	if caps := cs.InitializeResult().Capabilities; caps.Resources == nil || !caps.Resources.Subscribe {
		t.Errorf("resources capability %+v, want subscribe", caps.Resources)
	}
	id := spawn(t, cs)
	res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "corral://tasks/" + id})
	if err != nil {
		t.Fatal(err)
	}
	var r service.Result
	if c := res.Contents[0]; c.MIMEType != "application/json" || json.Unmarshal([]byte(c.Text), &r) != nil || r.ID != id || r.Status != task.Queued || r.Done {
		t.Errorf("read: %+v", c)
	}
	for _, uri := range []string{"corral://tasks/task-00000000000000000000000000", "corral://tasks/nope"} {
		if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri}); err == nil || !strings.Contains(err.Error(), "not found") {
			t.Errorf("read %s: %v, want not found", uri, err)
		}
		if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err == nil || !strings.Contains(err.Error(), "not found") {
			t.Errorf("subscribe %s: %v, want not found", uri, err)
		}
	}

	ws := mustConnectTo(t, New(service.Set{}, Options{Session: "sess-1"}, slog.New(slog.DiscardHandler)), nil, legacy)
	if caps := ws.InitializeResult().Capabilities; caps.Resources != nil {
		t.Errorf("a session's server offers resources: %+v", caps.Resources)
	}
}
