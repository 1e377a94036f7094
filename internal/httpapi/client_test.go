package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
	"github.com/corral-dev/corral/internal/workspace"
)

// serveAt serves b at addr ("127.0.0.1:0" for any port) until the test
// ends or the caller closes it.
func serveAt(t *testing.T, addr string, b testBackend, opts Options) *httptest.Server {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(newTestServer(b, opts, slogTo(io.Discard)).Handler())
	hs.Listener.Close()
	hs.Listener = l
	hs.Start()
	t.Cleanup(hs.Close)
	return hs
}

// kill ends a server as a crash would: its connections cut, its port
// closed.
func kill(hs *httptest.Server) {
	hs.CloseClientConnections()
	hs.Close()
}

// wsStub is a backend whose workspace checks paths as the orchestrator
// does, and records the paths it was given.
type wsStub struct {
	stub
	mu    sync.Mutex
	paths []string
}

func (s *wsStub) saw(p string) error {
	s.mu.Lock()
	s.paths = append(s.paths, p)
	s.mu.Unlock()
	_, err := workspace.Clean(p)
	return err
}

func (s *wsStub) ListWorkspace(_ context.Context, p string, _ bool) ([]workspace.Entry, error) {
	if err := s.saw(p); err != nil {
		return nil, err
	}
	return []workspace.Entry{}, nil
}

func (s *wsStub) ReadWorkspace(_ context.Context, p string) (service.File, error) {
	return service.File{}, s.saw(p)
}

func (s *wsStub) WriteWorkspace(_ context.Context, p string, _ []byte) (workspace.Entry, error) {
	return workspace.Entry{Path: p}, s.saw(p)
}

// TestWorkspacePathsReachTheServerAsGiven: a path the URL would clean
// ("..", a leading "/", "//") reaches the server as written, so the server
// decides, and "../x" is refused as escaping rather than answered "no
// route".
func TestWorkspacePathsReachTheServerAsGiven(t *testing.T) {
	b := &wsStub{}
	hs := serveAt(t, "127.0.0.1:0", b, Options{})
	cl := NewClient(hs.URL, "")
	ctx := context.Background()
	_, err := cl.ReadWorkspace(ctx, "../x")
	if !errors.Is(err, errdefs.ErrPermissionDenied) || err.Error() != `path "../x" contains "..": path escapes workspace` {
		t.Errorf(`read "../x": %v, want the server's "path escapes workspace", permission denied`, err)
	}
	cl.ListWorkspace(ctx, "a/../../x", false)
	cl.WriteWorkspace(ctx, "/abs.txt", []byte("x"))
	cl.ReadWorkspace(ctx, "a//b c%2F.txt")
	cl.ListWorkspace(ctx, ".", false)
	cl.ListWorkspace(ctx, "", false)
	want := []string{"../x", "a/../../x", "/abs.txt", "a//b c%2F.txt", ".", ""}
	if diff := cmp.Diff(want, b.paths); diff != "" {
		t.Errorf("paths the server saw (-want +got):\n%s", diff)
	}
}

// TestErrorAnswersReadAsMessages: an error answer says what is wrong, not
// the class it is filed under, the system call that failed or a host path.
func TestErrorAnswersReadAsMessages(t *testing.T) {
	pathErr := &fs.PathError{Op: "openat", Path: "/var/lib/corral/shared/notes/x", Err: syscall.ENOENT}
	b := &stub{spawn: func(service.SpawnRequest) (task.Task, bool, error) {
		return task.Task{}, false, errors.Join(
			&errdefs.FieldError{Field: "context_files[0]", Err: fmt.Errorf("%w: %w", pathErr, errdefs.ErrNotFound)},
			errdefs.Field("timeout_minutes", "must be at most 120"),
		)
	}}
	_, url, _ := MustServe(t, b, "")
	resp, err := http.Post(url+"/api/tasks", "application/json", strings.NewReader(`{"task_description":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var eb errorBody
	if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil {
		t.Fatal(err)
	}
	want := errorBody{
		Error: "context_files[0]: no such file or directory\ntimeout_minutes: must be at most 120",
		Code:  "failed_precondition",
		Fields: []fieldError{
			{Field: "context_files[0]", Message: "no such file or directory"},
			{Field: "timeout_minutes", Message: "must be at most 120"},
		},
		RequestID: eb.RequestID,
	}
	if diff := cmp.Diff(want, eb, cmp.AllowUnexported(errorBody{}, fieldError{})); diff != "" {
		t.Errorf("error answer (-want +got):\n%s", diff)
	}
}

// TestNoServerSaysSo: with nothing listening, the error says that no
// server runs there, not how the dial failed.
func TestNoServerSaysSo(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, err = NewClient("http://"+addr, "").List(context.Background(), service.ListRequest{})
	if !errors.Is(err, ErrNoServer) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("no server: %v, want ErrNoServer and unavailable", err)
	}
	if msg := errdefs.Message(err); msg != "no corral server is running at http://"+addr {
		t.Errorf("no server: %q", msg)
	}
}

// eventLog is a backend's event log that a test appends to while a
// client follows it.
type eventLog struct {
	mu      sync.Mutex
	evs     []eventstore.Event
	changed chan struct{}
	afters  []string // the cursors followers asked from
}

func newEventLog() *eventLog { return &eventLog{changed: make(chan struct{})} }

func (l *eventLog) add(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evs = append(l.evs, eventstore.Event{ID: id, StreamID: "task/a", Type: "task_progress", Data: []byte(`{}`), Position: int64(len(l.evs) + 1)})
	close(l.changed)
	l.changed = make(chan struct{})
}

// follow is the backend's Events: what follows after, then new events as
// they come, until ctx is done or end is closed (a graceful shutdown).
func (l *eventLog) follow(ctx context.Context, end <-chan struct{}, r service.EventsRequest, fn func(eventstore.Event) error) error {
	l.mu.Lock()
	l.afters = append(l.afters, r.After)
	l.mu.Unlock()
	sent := 0
	if r.After != "" {
		l.mu.Lock()
		for i, e := range l.evs {
			if e.ID == r.After {
				sent = i + 1
			}
		}
		l.mu.Unlock()
	}
	for {
		l.mu.Lock()
		evs, changed := l.evs[sent:], l.changed
		l.mu.Unlock()
		for _, e := range evs {
			if err := fn(e); err != nil {
				return err
			}
			sent++
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		case <-end:
			return nil
		}
	}
}

// eventsBackend serves an eventLog; closing end ends its streams cleanly.
type eventsBackend struct {
	stub
	log *eventLog
	end chan struct{}
}

func (b *eventsBackend) Events(ctx context.Context, r service.EventsRequest, fn func(eventstore.Event) error) error {
	return b.log.follow(ctx, b.end, r, fn)
}

func newEventsBackend(log *eventLog) *eventsBackend {
	b := &eventsBackend{log: log, end: make(chan struct{})}
	b.get = func(id string) (task.Task, error) { return task.Task{ID: id, Status: task.Running}, nil }
	return b
}

// TestEventsFollowAcrossRestarts: a followed event stream outlives its
// server shutting down (the stream ends) and crashing (the connection is
// cut, the port closed for a while): it resumes after the last event it
// saw, and sees every event once.
func TestEventsFollowAcrossRestarts(t *testing.T) {
	log := newEventLog()
	first := newEventsBackend(log)
	hs := serveAt(t, "127.0.0.1:0", first, Options{})
	addr := hs.Listener.Addr().String()
	cl := NewClient(hs.URL, "")
	var lost []error
	cl.OnReconnect = func(err error) { lost = append(lost, err) }

	got := make(chan string)
	done := make(chan error, 1)
	go func() {
		done <- cl.Events(context.Background(), service.EventsRequest{TaskID: "task-a", Follow: true}, func(e eventstore.Event) error {
			got <- e.ID
			if e.ID == "e5" {
				return errStop
			}
			return nil
		})
	}()
	var seen []string
	next := func() {
		t.Helper()
		select {
		case id := <-got:
			seen = append(seen, id)
		case err := <-done:
			t.Fatalf("Events ended with %v after %v", err, seen)
		case <-time.After(10 * time.Second):
			t.Fatalf("no event after %v", seen)
		}
	}
	log.add("e1")
	next()
	log.add("e2")
	next()

	// A graceful shutdown ends the stream; a new server takes over.
	close(first.end)
	hs.Close()
	log.add("e3")
	hs = serveAt(t, addr, newEventsBackend(log), Options{})
	next()

	// A crash cuts the connection; the port stays closed for a while.
	kill(hs)
	log.add("e4")
	time.Sleep(300 * time.Millisecond)
	serveAt(t, addr, newEventsBackend(log), Options{})
	next()
	log.add("e5")
	next()
	if err := <-done; !errors.Is(err, errStop) {
		t.Errorf("Events ended with %v, want the reader's own error", err)
	}
	if diff := cmp.Diff([]string{"e1", "e2", "e3", "e4", "e5"}, seen); diff != "" {
		t.Errorf("events seen (-want +got):\n%s", diff)
	}
	log.mu.Lock()
	afters := log.afters
	log.mu.Unlock()
	if diff := cmp.Diff([]string{"", "e2", "e3"}, slices.Compact(afters)); diff != "" {
		t.Errorf("where the streams started (-want +got):\n%s", diff)
	}
	if len(lost) != 2 {
		t.Errorf("OnReconnect was called for %v, want the two losses", lost)
	}
}

// logsBackend serves a transcript with logs, and tasks with status.
type logsBackend struct {
	stub
	logs func(ctx context.Context, w io.Writer) error
}

func (b *logsBackend) Logs(ctx context.Context, _ service.LogsRequest, w io.Writer) error {
	return b.logs(ctx, w)
}

func newLogsBackend(status task.Status, logs func(ctx context.Context, w io.Writer) error) *logsBackend {
	b := &logsBackend{logs: logs}
	b.get = func(id string) (task.Task, error) { return task.Task{ID: id, Status: status}, nil }
	return b
}

// TestLogsFollowAcrossRestarts: a followed transcript outlives a crash of
// its server; the new server sends it from the start, and the client
// writes only what it had not written.
func TestLogsFollowAcrossRestarts(t *testing.T) {
	hs := serveAt(t, "127.0.0.1:0", newLogsBackend(task.Running, func(ctx context.Context, w io.Writer) error {
		io.WriteString(w, "one\n")
		<-ctx.Done() // the task goes on until the server is killed
		return nil
	}), Options{})
	addr := hs.Listener.Addr().String()
	var out testenv.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- NewClient(hs.URL, "").Logs(context.Background(), service.LogsRequest{TaskID: "task-a", Follow: true}, &out)
	}()
	for deadline := time.Now().Add(10 * time.Second); out.String() == ""; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first line never came")
		}
	}
	kill(hs)
	time.Sleep(300 * time.Millisecond)
	// The task ended while no server ran.
	serveAt(t, addr, newLogsBackend(task.Success, func(_ context.Context, w io.Writer) error {
		io.WriteString(w, "one\ntwo\n")
		return nil
	}), Options{})
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Logs did not end with the task")
	}
	if out.String() != "one\ntwo\n" {
		t.Errorf("followed transcript %q, want \"one\\ntwo\\n\"", out.String())
	}
}

// TestFollowGivesUp: a followed stream whose server does not come back
// ends, after Reconnect, with an error that says so.
func TestFollowGivesUp(t *testing.T) {
	b := newEventsBackend(newEventLog())
	hs := serveAt(t, "127.0.0.1:0", b, Options{})
	cl := NewClient(hs.URL, "")
	cl.Reconnect = 300 * time.Millisecond
	done := make(chan error, 1)
	go func() {
		done <- cl.Events(context.Background(), service.EventsRequest{Follow: true}, func(eventstore.Event) error { return nil })
	}()
	time.Sleep(100 * time.Millisecond) // the stream is open
	kill(hs)
	select {
	case err := <-done:
		if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "has not come back within 300ms") {
			t.Errorf("Events ended with %v, want it to say the server has not come back", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Events never gave up")
	}
}

// TestSSEHeartbeat: a quiet event stream gets a comment line every
// heartbeat interval, and the client reads the events between them.
func TestSSEHeartbeat(t *testing.T) {
	log := newEventLog()
	hs := serveAt(t, "127.0.0.1:0", newEventsBackend(log), Options{SSEHeartbeat: 20 * time.Millisecond})
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	req, _ := http.NewRequestWithContext(rctx, "GET", hs.URL+"/api/events", nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	pings := 0
	for pings < 3 && sc.Scan() {
		if sc.Text() == ": ping" {
			pings++
		}
	}
	if pings < 3 {
		t.Fatalf("the quiet stream ended (%v) after %d pings", sc.Err(), pings)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []string
	go func() {
		time.Sleep(100 * time.Millisecond) // a few heartbeats first
		log.add("e1")
		time.Sleep(100 * time.Millisecond)
		log.add("e2")
	}()
	err = NewClient(hs.URL, "").Events(ctx, service.EventsRequest{Follow: true}, func(e eventstore.Event) error {
		got = append(got, e.ID)
		if len(got) == 2 {
			return errStop
		}
		return nil
	})
	if !errors.Is(err, errStop) || !cmp.Equal(got, []string{"e1", "e2"}) {
		t.Errorf("events through the heartbeats: %v (%v), want e1, e2", got, err)
	}
}

// A call whose own context ends while the server has not answered returns
// the context's error, not "cannot reach the server": the caller gave up.
func TestClientContextEndsFirst(t *testing.T) {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	defer hs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := NewClient(hs.URL, "").Get(ctx, "task-00000000000000000000000000")
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Get whose context ended: %v, want context.DeadlineExceeded alone", err)
	}
}
