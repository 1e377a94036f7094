package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// fakeClock is a clock that moves only when told to.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// mustServeLimited serves a stub with opts on 127.0.0.1:0, with the
// limiter's clock set to now (nil: the real one), and returns its URL and
// the server's log.
func mustServeLimited(t *testing.T, opts Options, now func() time.Time) (*Server, string, *bytes.Buffer) {
	t.Helper()
	var logs bytes.Buffer
	srv := newTestServer(&stub{}, opts, slogTo(&logs))
	if now != nil && srv.rate != nil {
		srv.rate.now = now
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return srv, hs.URL, &logs
}

// answer is what one request got.
type answer struct {
	status     int
	retryAfter string
	body       errorBody
}

// send sends method path with token (none if empty) and a JSON body for a
// POST.
func send(t *testing.T, method, url, token string) answer {
	t.Helper()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader(`{}`)
	}
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	if resp.StatusCode >= 400 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		json.NewDecoder(resp.Body).Decode(&a.body)
	}
	io.Copy(io.Discard, resp.Body)
	return a
}

// TestRateLimitPerToken: on a clock that stands still, each token gets its
// burst and then 429s with Retry-After, on every route that takes the
// token, /mcp included; another token, /healthz and the workers' routes
// are not touched by it; once the clock has moved by Retry-After, the
// token is served again.
func TestRateLimitPerToken(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	const burst = 3
	mcp := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	_, url, logs := mustServeLimited(t, Options{
		Tokens:    []Token{{Name: "assistant", Value: "token-a"}, {Name: "ci", Value: "token-b"}},
		MCP:       mcp,
		RateLimit: RateLimit{Rate: 0.5, Burst: burst},
	}, clk.Now)

	for i := range burst {
		if a := send(t, "GET", url+"/api/tools", "token-a"); a.status != http.StatusOK {
			t.Fatalf("request %d of the burst: %d %+v, want 200", i+1, a.status, a.body)
		}
	}
	for _, route := range []struct{ method, path string }{{"GET", "/api/tools"}, {"POST", "/mcp"}, {"GET", "/api/tasks/task-x"}} {
		a := send(t, route.method, url+route.path, "token-a")
		if a.status != http.StatusTooManyRequests {
			t.Fatalf("%s %s past the burst: %d, want 429", route.method, route.path, a.status)
		}
		// One token every 2 s, none left: the next comes in 2 s.
		if a.retryAfter != "2" {
			t.Errorf("%s %s: Retry-After %q, want 2", route.method, route.path, a.retryAfter)
		}
		if !strings.Contains(a.body.Error, "too many requests from token assistant") || a.body.RequestID == "" || strings.Contains(a.body.Error, "resource exhausted") {
			t.Errorf("%s %s: body %+v, want the reason and a request id", route.method, route.path, a.body)
		}
	}
	if n := strings.Count(logs.String(), "request rate over the limit"); n != 1 {
		t.Errorf("logged %d times over the limit, want once for the spell:\n%s", n, logs.String())
	}

	// The client reads it as a retryable class, with the server's words.
	_, err := NewClient(url, "token-a").Get(context.Background(), "task-x")
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !errdefs.Retryable(err) || !strings.Contains(err.Error(), "retry after 2 s") {
		t.Errorf("client: %v, want a retryable 429 saying when", err)
	}

	// Nothing else shares the bucket, or takes from it.
	if a := send(t, "GET", url+"/api/tools", "token-b"); a.status != http.StatusOK {
		t.Errorf("another token while the first is limited: %d %+v", a.status, a.body)
	}
	if a := send(t, "GET", url+"/healthz", ""); a.status != http.StatusOK {
		t.Errorf("/healthz: %d", a.status)
	}
	if a := send(t, "POST", url+"/api/webhooks/worker-progress", ""); a.status == http.StatusTooManyRequests {
		t.Errorf("a worker's report was rate limited: %+v", a.body)
	}
	if a := send(t, "GET", url+"/api/tools", "wrong"); a.status != http.StatusUnauthorized {
		t.Errorf("a wrong token: %d, want 401 (no bucket of its own)", a.status)
	}

	clk.Advance(2 * time.Second)
	if a := send(t, "GET", url+"/api/tools", "token-a"); a.status != http.StatusOK {
		t.Errorf("after Retry-After: %d %+v, want 200", a.status, a.body)
	}
	if a := send(t, "GET", url+"/api/tools", "token-a"); a.status != http.StatusTooManyRequests {
		t.Errorf("the one token earned in 2 s spent, again: %d, want 429", a.status)
	}
}

// TestRateLimitRealClock: the same on the real clock, with a burst of 2
// at 1 a second. Only what a slow, loaded machine cannot change is
// asserted: the burst is served, a 429 comes with a Retry-After of whole
// seconds, and after waiting that long the token is served again.
func TestRateLimitRealClock(t *testing.T) {
	_, url, _ := mustServeLimited(t, Options{Token: "secret", RateLimit: RateLimit{Rate: 1, Burst: 2}}, nil)
	served := 0
	var limited answer
	for range 100 {
		a := send(t, "GET", url+"/api/tools", "secret")
		if a.status == http.StatusTooManyRequests {
			limited = a
			break
		}
		if a.status != http.StatusOK {
			t.Fatalf("GET /api/tools: %d %+v", a.status, a.body)
		}
		served++
	}
	if limited.status == 0 {
		t.Fatalf("100 requests at once were all served; want a 429 after the burst of 2")
	}
	if served < 2 {
		t.Errorf("%d requests served before the first 429, want the burst of 2", served)
	}
	secs, err := strconv.Atoi(limited.retryAfter)
	if err != nil || secs < 1 {
		t.Fatalf("Retry-After %q, want whole seconds, at least 1", limited.retryAfter)
	}
	time.Sleep(time.Duration(secs) * time.Second)
	if a := send(t, "GET", url+"/api/tools", "secret"); a.status != http.StatusOK {
		t.Errorf("after waiting Retry-After (%d s): %d %+v, want 200", secs, a.status, a.body)
	}
}

// TestRateLimitLocalCaller: with no token configured, every caller on
// loopback is the local caller, with one bucket.
func TestRateLimitLocalCaller(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	_, url, _ := mustServeLimited(t, Options{RateLimit: RateLimit{Rate: 1, Burst: 1}}, clk.Now)
	if a := send(t, "GET", url+"/api/tools", ""); a.status != http.StatusOK {
		t.Fatalf("first request: %d", a.status)
	}
	a := send(t, "GET", url+"/api/tools", "anything")
	if a.status != http.StatusTooManyRequests || a.retryAfter != "1" || !strings.Contains(a.body.Error, "from the local caller") {
		t.Errorf("second request: %d, Retry-After %q, %q; want 429 after 1 s for the local caller", a.status, a.retryAfter, a.body.Error)
	}
}

// TestRateLimitOff: a zero rate limits nothing, as before the limit.
func TestRateLimitOff(t *testing.T) {
	srv, url, _ := mustServeLimited(t, Options{Token: "secret"}, nil)
	if srv.rate != nil {
		t.Fatal("a limiter without a rate")
	}
	for i := range 300 {
		if a := send(t, "GET", url+"/api/tools", "secret"); a.status != http.StatusOK {
			t.Fatalf("request %d: %d", i+1, a.status)
		}
	}
}

// TestLimiterDropsFullBuckets: a sweep, at most once a minute, drops the
// buckets that have filled up again (a new one would be the same) and
// keeps the others, so the map holds only callers seen lately.
func TestLimiterDropsFullBuckets(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	l := newLimiter(RateLimit{Rate: 1, Burst: 3}, slogTo(io.Discard))
	l.now = clk.Now
	allowN := func(key string, n int) (refused int) {
		for range n {
			if l.allow(key, key) != nil {
				refused++
			}
		}
		return refused
	}
	if r := allowN("a", 4); r != 1 {
		t.Fatalf("a: %d of 4 refused, want 1", r)
	}
	allowN("b", 1)
	clk.Advance(59 * time.Second)
	allowN("d", 3) // drained: 0 tokens
	if len(l.buckets) != 3 {
		t.Fatalf("%d buckets before a minute has passed, want 3", len(l.buckets))
	}
	clk.Advance(2 * time.Second) // d has 2 of its 3 again
	allowN("c", 1)
	var keys []string
	for k := range l.buckets {
		keys = append(keys, k)
	}
	if len(keys) != 2 || l.buckets["c"] == nil || l.buckets["d"] == nil {
		t.Errorf("buckets after the sweep: %v, want c (new) and d (not full)", keys)
	}
	// d's bucket was kept, not reset: it holds 2 tokens, so its third
	// request is refused.
	if r := allowN("d", 3); r != 1 {
		t.Errorf("d: %d of 3 refused after the sweep, want 1", r)
	}
}
