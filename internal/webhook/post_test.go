package webhook

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
)

// receiver is a test server: it verifies every request with a real Verifier
// and answers with the next status in script (200 once the script is done).
type receiver struct {
	v      *Verifier
	mu     sync.Mutex
	script []int
	got    []Completion
	errs   []error
	paths  []string
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(http.MaxBytesReader(w, req.Body, MaxBodyBytes))
	r.mu.Lock()
	defer r.mu.Unlock()
	r.paths = append(r.paths, req.URL.Path)
	if len(r.script) > 0 {
		code := r.script[0]
		r.script = r.script[1:]
		if code == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "7")
		}
		http.Error(w, "scripted", code)
		return
	}
	c, err := r.v.Verify(Received(req.Header, body))
	if err != nil {
		r.errs = append(r.errs, err)
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	r.got = append(r.got, c)
	w.Write([]byte(`{"status":"accepted"}`))
}

// fakeSleep records waits and advances clk instead of sleeping.
type fakeSleep struct {
	clk   *clock
	mu    sync.Mutex
	waits []time.Duration
}

func (f *fakeSleep) Sleep(ctx context.Context, d time.Duration) error {
	f.mu.Lock()
	f.waits = append(f.waits, d)
	f.mu.Unlock()
	f.clk.Add(d)
	return ctx.Err()
}

func testOpts(clk *clock, fs *fakeSleep) PostOptions {
	return PostOptions{Now: clk.Now, Sleep: fs.Sleep, MaxElapsed: 3 * time.Minute}
}

func TestPostDelivers(t *testing.T) {
	clk := &clock{t: testNow}
	rcv := &receiver{v: NewVerifier(testSecret, time.Minute, clk.Now)}
	srv := httptest.NewServer(rcv)
	defer srv.Close()

	c := testCompletion("task-a")
	c.WebhookID, c.Timestamp, c.Source = "", 0, ""
	err := Post(t.Context(), srv.URL+Path, DeriveKey(testSecret, "task-a"), c, testOpts(clk, &fakeSleep{clk: clk}))
	if err != nil {
		t.Fatalf("Post: %v", err)
	}
	if len(rcv.got) != 1 {
		t.Fatalf("server accepted %d completions, want 1 (errors %v)", len(rcv.got), rcv.errs)
	}
	got := rcv.got[0]
	if !strings.HasPrefix(got.WebhookID, "wh_") || got.Timestamp != testNow.Unix() || got.Source != "local" {
		t.Errorf("filled fields: id %q timestamp %d source %q", got.WebhookID, got.Timestamp, got.Source)
	}
	want := testCompletion("task-a")
	want.WebhookID, want.Timestamp = got.WebhookID, got.Timestamp
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("completion (-want +got):\n%s", diff)
	}
}

func TestPostRetriesUntilServerAccepts(t *testing.T) {
	clk := &clock{t: testNow}
	rcv := &receiver{v: NewVerifier(testSecret, time.Minute, clk.Now), script: []int{503, 502, 429, 500}}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	fs := &fakeSleep{clk: clk}
	opts := testOpts(clk, fs)
	opts.InitialBackoff, opts.MaxBackoff = time.Second, 8*time.Second

	err := Post(t.Context(), srv.URL, DeriveKey(testSecret, "task-a"), testCompletion("task-a"), opts)
	if err != nil {
		t.Fatalf("Post: %v", err)
	}
	if len(rcv.got) != 1 || len(rcv.errs) != 0 {
		t.Fatalf("accepted %d, rejected %v", len(rcv.got), rcv.errs)
	}
	// Waits: jittered in [d/2, d] for d = 1s, 2s; then Retry-After 7s; then d = 8s.
	if len(fs.waits) != 4 {
		t.Fatalf("waits = %v, want 4", fs.waits)
	}
	bounds := [][2]time.Duration{{500 * time.Millisecond, time.Second}, {time.Second, 2 * time.Second}, {7 * time.Second, 7 * time.Second}, {4 * time.Second, 8 * time.Second}}
	for i, w := range fs.waits {
		if w < bounds[i][0] || w > bounds[i][1] {
			t.Errorf("wait %d = %s, want in [%s, %s]", i, w, bounds[i][0], bounds[i][1])
		}
	}
	// The accepted attempt was signed after the waits, with a fresh timestamp.
	var total time.Duration
	for _, w := range fs.waits {
		total += w
	}
	if got, want := rcv.got[0].Timestamp, testNow.Add(total).Unix(); got != want {
		t.Errorf("accepted timestamp %d, want %d (fresh per attempt)", got, want)
	}
}

func TestPostKeepsWebhookIDAcrossRetries(t *testing.T) {
	clk := &clock{t: testNow}
	var mu sync.Mutex
	var ids, sigs []string
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		ids = append(ids, r.Header.Get(HeaderID))
		sigs = append(sigs, r.Header.Get(HeaderSignature))
		if n++; n < 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	c := testCompletion("task-a")
	c.WebhookID = ""
	opts := testOpts(clk, &fakeSleep{clk: clk})
	opts.InitialBackoff = 4 * time.Second // waits of 2s or more: a new timestamp each attempt
	if err := Post(t.Context(), srv.URL, DeriveKey(testSecret, "task-a"), c, opts); err != nil {
		t.Fatalf("Post: %v", err)
	}
	if len(ids) != 3 || ids[0] == "" || ids[0] != ids[1] || ids[1] != ids[2] {
		t.Errorf("webhook ids over attempts = %q, want one id three times", ids)
	}
	if sigs[0] == sigs[1] || sigs[1] == sigs[2] {
		t.Errorf("signatures repeat across attempts: %q", sigs)
	}
}

func TestPostStopsOnClientError(t *testing.T) {
	for _, tt := range []struct {
		code  int
		class error
	}{
		{400, errdefs.ErrInvalidArgument},
		{401, errdefs.ErrUnauthenticated},
		{403, errdefs.ErrPermissionDenied},
		{404, errdefs.ErrNotFound},
		{409, errdefs.ErrConflict},
		{418, errdefs.ErrFailedPrecondition},
	} {
		clk := &clock{t: testNow}
		rcv := &receiver{v: NewVerifier(testSecret, time.Minute, clk.Now), script: []int{tt.code}}
		srv := httptest.NewServer(rcv)
		fs := &fakeSleep{clk: clk}
		err := Post(t.Context(), srv.URL, DeriveKey(testSecret, "task-a"), testCompletion("task-a"), testOpts(clk, fs))
		srv.Close()
		if !errors.Is(err, tt.class) || !strings.Contains(err.Error(), "scripted") {
			t.Errorf("%d: err = %v, want class %v with the server's message", tt.code, err, tt.class)
		}
		if len(rcv.paths) != 1 || len(fs.waits) != 0 {
			t.Errorf("%d: %d requests and %d waits, want 1 and 0", tt.code, len(rcv.paths), len(fs.waits))
		}
	}
}

func TestPostGivesUpAfterMaxElapsed(t *testing.T) {
	clk := &clock{t: testNow}
	var n int
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	fs := &fakeSleep{clk: clk}
	opts := testOpts(clk, fs)
	opts.InitialBackoff, opts.MaxBackoff, opts.MaxElapsed = time.Second, 30*time.Second, 3*time.Minute
	err := Post(t.Context(), srv.URL, DeriveKey(testSecret, "task-a"), testCompletion("task-a"), opts)
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "503") {
		t.Fatalf("err = %v, want ErrUnavailable naming the last 503", err)
	}
	var total time.Duration
	for _, w := range fs.waits {
		total += w
	}
	if total > 3*time.Minute {
		t.Errorf("waited %s in all, more than MaxElapsed", total)
	}
	if total < 2*time.Minute {
		t.Errorf("waited only %s in all: gave up too early", total)
	}
	if n != len(fs.waits)+1 {
		t.Errorf("%d requests for %d waits", n, len(fs.waits))
	}
}

func TestPostMaxAttempts(t *testing.T) {
	clk := &clock{t: testNow}
	fs := &fakeSleep{clk: clk}
	opts := testOpts(clk, fs)
	opts.MaxAttempts = 3
	// Nothing listens here: connection refused every time.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	err = Post(t.Context(), "http://"+addr+Path, DeriveKey(testSecret, "task-a"), testCompletion("task-a"), opts)
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "gave up after 3 attempts") {
		t.Fatalf("err = %v, want ErrUnavailable after 3 attempts", err)
	}
	if len(fs.waits) != 2 {
		t.Errorf("waits = %v, want 2", fs.waits)
	}
}

func TestPostStopsWhenContextEnds(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(t.Context())
	opts := PostOptions{Sleep: func(ctx context.Context, d time.Duration) error {
		cancel()
		return sleep(ctx, d)
	}}
	err := Post(ctx, srv.URL, DeriveKey(testSecret, "task-a"), testCompletion("task-a"), opts)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestPostOverUnixSocket(t *testing.T) {
	clk := &clock{t: testNow}
	rcv := &receiver{v: NewVerifier(testSecret, time.Minute, clk.Now), script: []int{503}}
	sock := filepath.Join(t.TempDir(), "corral.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rcv}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	defer func() { srv.Close(); <-done }()

	err = Post(t.Context(), "unix://"+sock, DeriveKey(testSecret, "task-a"), testCompletion("task-a"), testOpts(clk, &fakeSleep{clk: clk}))
	if err != nil {
		t.Fatalf("Post: %v", err)
	}
	if len(rcv.got) != 1 {
		t.Fatalf("accepted %d, errors %v", len(rcv.got), rcv.errs)
	}
	if diff := cmp.Diff([]string{Path, Path}, rcv.paths); diff != "" {
		t.Errorf("request paths (-want +got):\n%s", diff)
	}
}

func TestPostRejectsBadURL(t *testing.T) {
	for _, u := range []string{"ftp://x/y", "unix://host/sock", "unix://", "http:///nohost", "://"} {
		err := Post(t.Context(), u, []byte("k"), testCompletion("task-a"), PostOptions{})
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Post(%q) err = %v, want ErrInvalidArgument", u, err)
		}
	}
}
