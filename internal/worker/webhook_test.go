package worker

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/corral-dev/corral/internal/webhook"
	"github.com/corral-dev/corral/internal/workerproto"
)

var testSecret = []byte("the server's webhook secret")

// server is the server side of the completion webhook: the real Verifier
// behind a handler that first answers with the scripted statuses.
type server struct {
	v        *webhook.Verifier
	mu       sync.Mutex
	script   []int
	requests int
	got      []webhook.Completion
	errs     []error
}

func newServer(script ...int) *server {
	return &server{v: webhook.NewVerifier(testSecret, time.Minute, nil), script: script}
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, webhook.MaxBodyBytes))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	if r.URL.Path != webhook.Path || err != nil {
		http.Error(w, "bad request", http.StatusNotFound)
		return
	}
	if len(s.script) > 0 {
		code := s.script[0]
		s.script = s.script[1:]
		http.Error(w, "scripted", code)
		return
	}
	c, err := s.v.Verify(webhook.Received(r.Header, body))
	if err != nil {
		s.errs = append(s.errs, err)
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	s.got = append(s.got, c)
	w.Write([]byte(`{"status":"accepted"}`))
}

func webhookOptions(dir, script, url string) Options {
	o := shOptions(dir, script)
	o.WebhookURL = url
	o.WebhookKey = webhook.DeriveKey(testSecret, o.TaskID)
	o.Webhook = webhook.PostOptions{InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
	return o
}

// checkCompletion compares what the server accepted with status.json.
func checkCompletion(t *testing.T, srv *server, st workerproto.Status) {
	t.Helper()
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if len(srv.got) != 1 {
		t.Fatalf("server accepted %d completions, rejected %v", len(srv.got), srv.errs)
	}
	c := srv.got[0]
	var names []string
	for _, f := range st.OutputFiles {
		names = append(names, f.Name)
	}
	want := webhook.Completion{
		EventType: webhook.EventWorkerCompleted, Source: "local", TaskID: "task-1", Status: st.Status,
		DurationSeconds: float64(st.DurationMS) / 1000, ExitCode: st.ExitCode, OutputFiles: names, ErrorMessage: st.ErrorMessage,
		WebhookID: c.WebhookID, Timestamp: c.Timestamp,
	}
	if diff := cmp.Diff(want, c, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("completion (-want +got):\n%s", diff)
	}
}

func TestRunPostsWebhookOverHTTP(t *testing.T) {
	srv := newServer()
	hs := httptest.NewServer(srv)
	defer hs.Close()
	dir := MustTaskDir(t)
	code, st := MustRun(t, webhookOptions(dir, `echo out > output/a.txt; echo oops >&2; exit 4`, hs.URL+webhook.Path))
	if code != 4 {
		t.Fatalf("exit %d", code)
	}
	checkCompletion(t, srv, st)
}

func TestRunPostsWebhookOverUnixSocket(t *testing.T) {
	srv := newServer()
	sock := filepath.Join(t.TempDir(), "corral.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv}
	served := make(chan struct{})
	go func() { hs.Serve(ln); close(served) }()
	defer func() { hs.Close(); <-served }()

	dir := MustTaskDir(t)
	code, st := MustRun(t, webhookOptions(dir, `echo out > output/a.txt`, "unix://"+sock))
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	checkCompletion(t, srv, st)
}

func TestRunRetriesWebhookWhileServerIsAway(t *testing.T) {
	srv := newServer(503, 503, 502)
	hs := httptest.NewServer(srv)
	defer hs.Close()
	dir := MustTaskDir(t)
	code, st := MustRun(t, webhookOptions(dir, `true`, hs.URL+webhook.Path))
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	checkCompletion(t, srv, st)
	if srv.requests != 4 {
		t.Errorf("%d requests, want 4", srv.requests)
	}
}

func TestRunStopsWebhookOnClientError(t *testing.T) {
	srv := newServer(400, 200)
	hs := httptest.NewServer(srv)
	defer hs.Close()
	dir := MustTaskDir(t)
	code, st := MustRun(t, webhookOptions(dir, `true`, hs.URL+webhook.Path))
	if code != 0 || st.Status != "success" {
		t.Errorf("exit %d, status %q: a lost webhook must not change the result", code, st.Status)
	}
	if srv.requests != 1 || len(srv.got) != 0 {
		t.Errorf("%d requests, %d accepted; want 1 and 0", srv.requests, len(srv.got))
	}
}

func TestRunWebhookWithAnotherTasksKeyIsRejected(t *testing.T) {
	srv := newServer()
	hs := httptest.NewServer(srv)
	defer hs.Close()
	dir := MustTaskDir(t)
	opts := webhookOptions(dir, `true`, hs.URL+webhook.Path)
	opts.WebhookKey = webhook.DeriveKey(testSecret, "task-2")
	MustRun(t, opts)
	if srv.requests != 1 || len(srv.got) != 0 || len(srv.errs) != 1 {
		t.Errorf("%d requests, %d accepted, errors %v; want one rejected request", srv.requests, len(srv.got), srv.errs)
	}
}

// The last progress report is still in flight when the agent exits (the
// worker writes status.json meanwhile); the completion must not overtake
// it. The server here takes its time over each report, as a server
// committing the report's event does.
// TestRunLastProgressBeforeCompletion: a report in flight when the agent
// exits is answered before the completion goes, and what no report took
// rides on the completion.
func TestRunLastProgressBeforeCompletion(t *testing.T) {
	v := webhook.NewVerifier(testSecret, time.Minute, nil)
	var mu sync.Mutex
	var order []string
	var flag string // created when a progress report arrives
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		m := webhook.Received(r.Header, body)
		switch r.URL.Path {
		case webhook.ProgressPath:
			p, err := v.VerifyProgress(m)
			if err != nil {
				http.Error(w, err.Error(), http.StatusUnauthorized)
				return
			}
			// Tell the agent, and be still in flight when it exits.
			os.WriteFile(flag, nil, 0o644)
			time.Sleep(400 * time.Millisecond)
			mu.Lock()
			for _, it := range p.Items {
				order = append(order, "progress "+it.Text)
			}
			mu.Unlock()
		case webhook.Path:
			c, err := v.Verify(m)
			if err != nil {
				http.Error(w, err.Error(), http.StatusUnauthorized)
				return
			}
			mu.Lock()
			for _, it := range c.Progress {
				order = append(order, "completion's progress "+it.Text)
			}
			order = append(order, "completion")
			mu.Unlock()
		}
		w.Write([]byte(`{"status":"accepted"}`))
	}))
	defer hs.Close()
	for _, tt := range []struct {
		script   string
		interval time.Duration
		want     []string
	}{
		// Over before the first report was due: no report at all.
		{`echo last`, time.Hour, []string{"completion's progress last", "completion"}},
		// The last line comes once the first is being reported.
		{`echo first; while [ ! -e "$FLAG" ]; do sleep 0.01; done; echo last`, 10 * time.Millisecond, []string{"progress first", "completion's progress last", "completion"}},
	} {
		order = nil
		dir := MustTaskDir(t)
		flag = filepath.Join(dir, "reported")
		opts := webhookOptions(dir, tt.script, hs.URL+webhook.Path)
		opts.Env = append(opts.Env, "FLAG="+flag)
		opts.ProgressInterval = tt.interval
		if code, _ := MustRun(t, opts); code != 0 {
			t.Fatalf("exit %d", code)
		}
		mu.Lock()
		if diff := cmp.Diff(tt.want, order); diff != "" {
			t.Errorf("%s: what the server saw, in order (-want +got):\n%s", tt.script, diff)
		}
		mu.Unlock()
	}
}
