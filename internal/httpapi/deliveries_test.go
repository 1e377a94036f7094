package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// fakeDeliveries records what it was asked and by whom.
type fakeDeliveries struct {
	state task.DeliveryState
	limit int
	actor string
	err   error
}

func (f *fakeDeliveries) List(_ context.Context, state task.DeliveryState, limit int) ([]task.Delivery, error) {
	f.state, f.limit = state, limit
	return []task.Delivery{{ID: "dlv_1", State: task.DeliveryDead}}, f.err
}

func (f *fakeDeliveries) Retry(ctx context.Context, id string) (task.Delivery, error) {
	f.actor = service.ActorFrom(ctx)
	if f.err != nil {
		return task.Delivery{}, f.err
	}
	return task.Delivery{ID: id, State: task.DeliveryPending}, nil
}

func MustServeOpts(t *testing.T, opts Options) string {
	t.Helper()
	hs := httptest.NewServer(newTestServer(&stub{}, opts, slogTo(io.Discard)).Handler())
	t.Cleanup(hs.Close)
	return hs.URL
}

func call(t *testing.T, method, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return roundTrip(t, req)
}

// roundTrip sends req and returns the status and body of the answer.
func roundTrip(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestNamedTokensAreTheActor(t *testing.T) {
	f := &fakeDeliveries{}
	url := MustServeOpts(t, Options{Token: "tok-default", Tokens: []Token{{"assistant", "tok-a"}, {"ci", "tok-longer-ci"}}, Deliveries: f})
	for token, want := range map[string]string{"tok-default": "default", "tok-a": "assistant", "tok-longer-ci": "ci"} {
		f.actor = ""
		if code, body := call(t, "POST", url+"/api/deliveries/dlv_x/retry", token); code != http.StatusAccepted {
			t.Errorf("token %s: %d %s", token, code, body)
		}
		if f.actor != want {
			t.Errorf("token %s: actor %q, want %q", token, f.actor, want)
		}
	}
	for _, bad := range []string{"", "tok-", "tok-ab", "TOK-A", "tok-a tok-a"} {
		if code, _ := call(t, "GET", url+"/api/deliveries", bad); code != http.StatusUnauthorized {
			t.Errorf("token %q: %d, want 401", bad, code)
		}
	}

	// Only named tokens, no default one.
	url = MustServeOpts(t, Options{Tokens: []Token{{"assistant", "tok-a"}}, Deliveries: f})
	if code, _ := call(t, "GET", url+"/api/deliveries", ""); code != http.StatusUnauthorized {
		t.Errorf("no token with named tokens configured: %d, want 401", code)
	}
	call(t, "POST", url+"/api/deliveries/dlv_x/retry", "tok-a")
	if f.actor != "assistant" {
		t.Errorf("actor %q, want assistant", f.actor)
	}

	// No token at all: loopback only, and the caller is "local".
	url = MustServeOpts(t, Options{Deliveries: f})
	call(t, "POST", url+"/api/deliveries/dlv_x/retry", "")
	if f.actor != "local" {
		t.Errorf("actor %q without tokens, want local", f.actor)
	}
}

func TestDeliveryRoutes(t *testing.T) {
	f := &fakeDeliveries{}
	url := MustServeOpts(t, Options{Deliveries: f})
	code, body := call(t, "GET", url+"/api/deliveries?state=failed&limit=5", "")
	var got struct{ Deliveries []task.Delivery }
	json.Unmarshal([]byte(body), &got)
	if code != 200 || f.state != task.DeliveryDead || f.limit != 5 || len(got.Deliveries) != 1 || got.Deliveries[0].ID != "dlv_1" {
		t.Errorf("list: %d %s (state %q, limit %d)", code, body, f.state, f.limit)
	}
	call(t, "GET", url+"/api/deliveries", "")
	if f.state != "" || f.limit != 100 {
		t.Errorf("list without parameters asked for state %q, limit %d; want all, 100", f.state, f.limit)
	}
	if code, body := call(t, "GET", url+"/api/deliveries?limit=0", ""); code != 400 || !strings.Contains(body, `"field":"limit"`) {
		t.Errorf("limit 0: %d %s, want 400 naming limit", code, body)
	}
	for err, want := range map[error]int{
		fmt.Errorf("x: %w", errdefs.ErrNotFound):          404,
		fmt.Errorf("x: %w", errdefs.ErrConflict):          409,
		errdefs.Field("delivery_id", "not a delivery id"): 400,
	} {
		f.err = err
		if code, body := call(t, "POST", url+"/api/deliveries/dlv_x/retry", ""); code != want {
			t.Errorf("retry failing with %v: %d %s, want %d", err, code, body, want)
		}
	}

	url = MustServeOpts(t, Options{})
	if code, body := call(t, "GET", url+"/api/deliveries?state=failed", ""); code != http.StatusNotImplemented || !strings.Contains(body, "notify.url") {
		t.Errorf("notifications off: %d %s, want 501 naming notify.url", code, body)
	}
}
