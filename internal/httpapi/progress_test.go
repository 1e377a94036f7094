package httpapi

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/webhook"
)

// progressRecorder is a Backend that records progress reports.
type progressRecorder struct {
	stub
	bodies int
}

func (b *progressRecorder) WorkerProgress(context.Context, webhook.Signed) (int, error) {
	b.bodies++
	return 1, nil
}

func TestProgressReportSizeIsBounded(t *testing.T) {
	b := &progressRecorder{}
	hs := httptest.NewServer(newTestServer(b, Options{}, slogTo(io.Discard)).WebhookHandler())
	t.Cleanup(hs.Close)
	post := func(n int) int {
		resp, err := http.Post(hs.URL+"/api/webhooks/worker-progress", "application/json", strings.NewReader(strings.Repeat(" ", n)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(64 << 10); code != http.StatusOK || b.bodies != 1 {
		t.Errorf("a 64 KiB report: HTTP %d, %d recorded; want 200 and recorded", code, b.bodies)
	}
	if code := post(64<<10 + 1); code != http.StatusRequestEntityTooLarge || b.bodies != 1 {
		t.Errorf("a report over 64 KiB: HTTP %d, %d recorded; want 413 and not recorded", code, b.bodies)
	}
}
