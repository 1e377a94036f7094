package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/webhook"
	"github.com/corral-dev/corral/internal/workspace"
)

// testBackend is a test double of the contracts a server serves, but
// sessions, and of its server-only operations.
type testBackend interface {
	service.Tasks
	service.Library
	Backend
}

// newTestServer serves b's use cases and b's server-only operations.
func newTestServer(b testBackend, opts Options, log *slog.Logger) *Server {
	return New(service.Set{Tasks: b, Library: b}, b, opts, log)
}

// stub is a testBackend whose methods are function fields; nil ones fail.
type stub struct {
	spawn  func(service.SpawnRequest) (task.Task, bool, error)
	get    func(string) (task.Task, error)
	events func(service.EventsRequest, func(eventstore.Event) error) error
	logs   func(service.LogsRequest, io.Writer) error
	result func(service.ResultRequest) (service.Result, error)
}

var errUnset = errors.New("stub: not set")

func (s *stub) Spawn(_ context.Context, r service.SpawnRequest) (task.Task, bool, error) {
	if s.spawn == nil {
		return task.Task{}, false, errUnset
	}
	return s.spawn(r)
}
func (s *stub) Execute(context.Context, service.ExecRequest) (service.ExecResult, error) {
	return service.ExecResult{}, errUnset
}
func (s *stub) Get(_ context.Context, id string) (task.Task, error) {
	if s.get == nil {
		return task.Task{}, errUnset
	}
	return s.get(id)
}
func (s *stub) List(context.Context, service.ListRequest) (service.ListPage, error) {
	return service.ListPage{}, errUnset
}
func (s *stub) Result(_ context.Context, r service.ResultRequest) (service.Result, error) {
	if s.result == nil {
		return service.Result{}, errUnset
	}
	return s.result(r)
}
func (s *stub) Cancel(context.Context, string) (task.Task, error) { return task.Task{}, errUnset }
func (s *stub) SetNetwork(context.Context, service.NetworkRequest) (task.Task, error) {
	return task.Task{}, errUnset
}
func (s *stub) Logs(_ context.Context, r service.LogsRequest, w io.Writer) error {
	if s.logs == nil {
		return errUnset
	}
	return s.logs(r, w)
}
func (s *stub) Events(_ context.Context, r service.EventsRequest, fn func(eventstore.Event) error) error {
	if s.events == nil {
		return errUnset
	}
	return s.events(r, fn)
}
func (s *stub) ListWorkspace(context.Context, string, bool) ([]workspace.Entry, error) {
	return nil, errUnset
}
func (s *stub) ReadWorkspace(context.Context, string) (service.File, error) {
	return service.File{}, errUnset
}
func (s *stub) WriteWorkspace(context.Context, string, []byte) (workspace.Entry, error) {
	return workspace.Entry{}, errUnset
}
func (s *stub) WorkerComplete(context.Context, webhook.Signed) (string, error) {
	return "", errUnset
}
func (s *stub) OpenShared(context.Context, string) (*os.File, fs.FileInfo, error) {
	return nil, nil, errdefs.ErrNotFound
}

func (s *stub) OpenOutput(context.Context, string, string) (*os.File, fs.FileInfo, error) {
	return nil, nil, errUnset
}
func (s *stub) Stats() Stats { return Stats{} }

// MustServe serves b on an httptest server and returns a client for it.
func MustServe(t *testing.T, b testBackend, token string) (*Client, string, *bytes.Buffer) {
	t.Helper()
	var logs bytes.Buffer
	srv := newTestServer(b, Options{Token: token, MaxRequestBytes: 1024}, slogTo(&logs))
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return NewClient(hs.URL, token), hs.URL, &logs
}

func TestErrorsRoundTripThroughTheClient(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
		class  error
	}{
		{errdefs.Field("task_description", "is required"), 400, errdefs.ErrInvalidArgument},
		{fmt.Errorf("task x: %w", errdefs.ErrNotFound), 404, errdefs.ErrNotFound},
		{fmt.Errorf("reused key: %w", errdefs.ErrConflict), 409, errdefs.ErrConflict},
		{fmt.Errorf("prompt: %w", errdefs.ErrTooLarge), 413, errdefs.ErrTooLarge},
		{fmt.Errorf("queue full: %w", errdefs.ErrResourceExhausted), 429, errdefs.ErrResourceExhausted},
		{&errdefs.FieldError{Field: "agent", Err: fmt.Errorf("not installed: %w", errdefs.ErrFailedPrecondition)}, 422, errdefs.ErrFailedPrecondition},
		{fmt.Errorf("escapes: %w", errdefs.ErrPermissionDenied), 403, errdefs.ErrPermissionDenied},
	} {
		b := &stub{spawn: func(service.SpawnRequest) (task.Task, bool, error) { return task.Task{}, false, c.err }}
		cl, url, _ := MustServe(t, b, "")
		_, _, err := cl.Spawn(context.Background(), service.SpawnRequest{TaskDescription: "x"})
		if !errors.Is(err, c.class) || err.Error() != errdefs.Message(c.err) {
			t.Errorf("%v: client got %v, want %q of class %v", c.err, err, errdefs.Message(c.err), c.class)
		}
		resp, _ := http.Post(url+"/api/tasks", "application/json", strings.NewReader(`{"task_description":"x"}`))
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%v: HTTP %d, want %d", c.err, resp.StatusCode, c.status)
		}
	}
}

func TestInternalErrorsHideTheirDetail(t *testing.T) {
	b := &stub{get: func(string) (task.Task, error) { return task.Task{}, errors.New("disk /dev/sda1 exploded") }}
	cl, _, logs := MustServe(t, b, "")
	_, err := cl.Get(context.Background(), "task-x")
	if err == nil || strings.Contains(err.Error(), "sda1") || !strings.Contains(err.Error(), "internal error") {
		t.Errorf("client saw %v, want only \"internal error\"", err)
	}
	if !strings.Contains(logs.String(), "sda1") {
		t.Errorf("the detail is not in the server log: %s", logs.String())
	}
}

func TestRequestBodyLimit(t *testing.T) {
	called := false
	b := &stub{spawn: func(service.SpawnRequest) (task.Task, bool, error) {
		called = true
		return task.Task{}, false, nil
	}}
	_, url, _ := MustServe(t, b, "")
	resp, err := http.Post(url+"/api/tasks", "application/json", strings.NewReader(`{"task_description":"`+strings.Repeat("a", 2000)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 || called {
		t.Errorf("oversize body: HTTP %d, backend called %v; want 413 and not called", resp.StatusCode, called)
	}
}

func TestTokenIsRequiredAndConstantTime(t *testing.T) {
	b := &stub{get: func(id string) (task.Task, error) { return task.Task{ID: id}, nil }}
	good, url, _ := MustServe(t, b, "tok")
	if _, err := good.Get(context.Background(), "task-1"); err != nil {
		t.Errorf("right token: %v", err)
	}
	bad := NewClient(url, "tok2")
	if _, err := bad.Get(context.Background(), "task-1"); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("wrong token: %v, want unauthenticated", err)
	}
	resp, _ := http.Get(url + "/healthz")
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("healthz needs no token, got %d", resp.StatusCode)
	}
}

func TestEventsOverSSE(t *testing.T) {
	now := time.Now().UTC().Truncate(time.Millisecond)
	all := []eventstore.Event{
		{ID: "evt_1", StreamID: "task/a", StreamVersion: 1, Type: "task_created", Data: []byte(`{"a":1}`), RecordedAt: now, Position: 1},
		{ID: "evt_2", StreamID: "task/a", StreamVersion: 2, Type: "task_queued", Data: []byte(`{}`), RecordedAt: now, Position: 2},
	}
	var gotAfter []string
	b := &stub{events: func(r service.EventsRequest, fn func(eventstore.Event) error) error {
		gotAfter = append(gotAfter, r.After)
		for _, e := range all {
			if r.After != "" && e.ID <= r.After {
				continue
			}
			if err := fn(e); err != nil {
				return err
			}
		}
		return nil
	}}
	cl, _, _ := MustServe(t, b, "")
	var got []eventstore.Event
	err := cl.Events(context.Background(), service.EventsRequest{Follow: true, After: "evt_1"}, func(e eventstore.Event) error {
		got = append(got, e)
		if e.ID == all[len(all)-1].ID {
			return errStop // a followed stream goes on until its reader stops
		}
		return nil
	})
	if !errors.Is(err, errStop) {
		t.Fatal(err)
	}
	if diff := cmp.Diff(all[1:], got); diff != "" {
		t.Errorf("SSE events (-want +got):\n%s", diff)
	}
	if !contains(gotAfter, "evt_1") {
		t.Errorf("the cursor did not reach the backend: %v", gotAfter)
	}
}

func TestLogsStream(t *testing.T) {
	b := &stub{
		get: func(id string) (task.Task, error) { return task.Task{ID: id, Status: task.Success}, nil },
		logs: func(r service.LogsRequest, w io.Writer) error {
			if !r.Follow || r.Stream != "stderr" {
				return fmt.Errorf("request %+v: %w", r, errdefs.ErrInvalidArgument)
			}
			io.WriteString(w, "one\n")
			io.WriteString(w, "two\n")
			return nil
		},
	}
	cl, _, _ := MustServe(t, b, "")
	var out bytes.Buffer
	if err := cl.Logs(context.Background(), service.LogsRequest{TaskID: "task-1", Follow: true, Stream: "stderr"}, &out); err != nil {
		t.Fatal(err)
	}
	if out.String() != "one\ntwo\n" {
		t.Errorf("logs %q", out.String())
	}
}

var errStop = errors.New("stop")

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// /healthz says "starting" (503) until the server has reconciled what it
// found at start-up, then "ok".
func TestHealthzWaitsForReady(t *testing.T) {
	ready := make(chan struct{})
	url := MustServeOpts(t, Options{Ready: ready})
	if code, body := call(t, "GET", url+"/healthz", ""); code != http.StatusServiceUnavailable || !strings.Contains(body, `"starting"`) {
		t.Errorf("before ready: %d %s, want 503 starting", code, body)
	}
	close(ready)
	if code, body := call(t, "GET", url+"/healthz", ""); code != http.StatusOK || !strings.Contains(body, `"ok"`) {
		t.Errorf("after ready: %d %s, want 200 ok", code, body)
	}
}

func (s *stub) ListProjects(context.Context) ([]service.Project, error) { return nil, errUnset }
func (s *stub) CreateProject(context.Context, service.CreateProjectRequest) (service.Project, error) {
	return service.Project{}, errUnset
}
func (s *stub) ListProjectFiles(context.Context, string, string, bool) ([]service.ProjectEntry, error) {
	return nil, errUnset
}
func (s *stub) ReadProjectFile(context.Context, string, string) (service.File, error) {
	return service.File{}, errUnset
}
