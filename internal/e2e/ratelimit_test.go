//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpapi"
)

// TestRateLimitSessionTokens: each session token has a request bucket of
// its own, apart from the API token's and from another session's, on the
// HTTP listener and on the sandboxes' unix socket alike. The rate is one
// request in 100 s, so no bucket fills again while the test runs, however
// slow the machine: each is spent by its own requests alone.
func TestRateLimitSessionTokens(t *testing.T) {
	t.Parallel()
	const admin = "admin-token-0123456789"
	const burst = 3
	s := MustStartEnv(t, []string{"CORRAL_API_TOKEN=" + admin}, func(c *config.Config) {
		c.Limits.APIRate, c.Limits.APIBurst = 0.01, burst
	})
	ctx := context.Background()
	a := mustCreateSession(t, s.client)
	b := mustCreateSession(t, s.client)
	type answer struct {
		status     int
		retryAfter string
		error      string
	}
	get := func(token, id string) answer {
		t.Helper()
		req, _ := http.NewRequest("GET", s.url+"/api/sessions/"+id, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct{ Error string }
		json.NewDecoder(resp.Body).Decode(&body)
		return answer{resp.StatusCode, resp.Header.Get("Retry-After"), body.Error}
	}
	// spend sends requests until one is refused and returns how many were
	// served before it, and the refusal.
	spend := func(who, token, id string) (int, answer) {
		t.Helper()
		for served := 0; served < 10; served++ {
			got := get(token, id)
			if got.status == http.StatusTooManyRequests {
				return served, got
			}
			if got.status != http.StatusOK {
				t.Fatalf("%s: GET /api/sessions/%s: %d %s", who, id, got.status, got.error)
			}
		}
		t.Fatalf("%s: 10 requests served, want a 429 after %d", who, burst)
		return 0, answer{}
	}

	// Session a's token spends its own bucket: the whole burst, then 429.
	served, refused := spend("session a's token", a.Token, a.SessionID)
	if served != burst {
		t.Errorf("session a's token: %d served before the 429, want the burst of %d", served, burst)
	}
	if secs, err := strconv.Atoi(refused.retryAfter); err != nil || secs < 1 || secs > 100 {
		t.Errorf("session a's token: Retry-After %q, want whole seconds from 1 to 100", refused.retryAfter)
	}
	if !strings.Contains(refused.error, "a token of session "+a.SessionID) || strings.Contains(refused.error, a.Token) {
		t.Errorf("session a's token: %q, want the session named and its token not", refused.error)
	}
	// The same bucket on the socket every sandbox reaches.
	sock := "unix://" + filepath.Join(s.data, "run", "sock", "corral.sock")
	_, err := httpapi.NewClient(sock, a.Token).ExecSession(ctx, a.SessionID, httpapi.ExecBody{Command: command("true")}, func(httpapi.ExecChunk) error { return nil })
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("session a's token on the socket after its bucket is spent: %v, want 429", err)
	}

	// The API token is not touched by it: it made two requests (the
	// sessions) and has what is left of its burst.
	served, _ = spend("the API token", admin, a.SessionID)
	if served < 1 {
		t.Errorf("the API token: none served after session a's token was limited")
	}
	// Session b's token is touched by neither.
	if got := get(b.Token, b.SessionID); got.status != http.StatusOK {
		t.Errorf("session b's token while a's and the API token are limited: %d %s", got.status, got.error)
	}
	if _, err := httpapi.NewClient(sock, b.Token).ExecSession(ctx, b.SessionID, httpapi.ExecBody{Command: command("true")}, func(httpapi.ExecChunk) error { return nil }); err != nil {
		t.Errorf("session b's token on the socket: %v", err)
	}
}
