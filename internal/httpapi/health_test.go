package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/task"
)

// /api/health reports the queue, the warm pools and the doctor's findings,
// with a token.
func TestHealthRoute(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	hs := httptest.NewServer(newTestServer(&stats{}, Options{Token: "tok", Version: "v9",
		Doctor: func(context.Context) ([]Check, time.Time) {
			return []Check{{Name: "runtime local", OK: true, Detail: "bwrap 0.8", Required: true}}, at
		}}, slogTo(io.Discard)).Handler())
	t.Cleanup(hs.Close)
	if code, _ := call(t, "GET", hs.URL+"/api/health", ""); code != http.StatusUnauthorized {
		t.Errorf("without the token: %d, want 401", code)
	}
	code, body := call(t, "GET", hs.URL+"/api/health", "tok")
	var h Health
	if err := json.Unmarshal([]byte(body), &h); err != nil || code != 200 {
		t.Fatalf("%d %s: %v", code, body, err)
	}
	if h.Version != "v9" || !h.Ready || h.QueueDepth != 2 || h.Running != 1 || h.Tasks[task.Queued] != 2 ||
		len(h.Checks) != 1 || h.Checks[0].Name != "runtime local" || !h.CheckedAt.Equal(at) {
		t.Errorf("health %+v", h)
	}
	if len(h.Warm) != 1 || h.Warm[0] != (WarmPool{Runtime: "local", Shape: "none", Ready: 3, Target: 4, Claims: 5, Misses: 1, Started: 9, Failed: 2, Destroyed: 1}) {
		t.Errorf("warm pools %+v", h.Warm)
	}
	if !strings.Contains(body, `"warm":[{"runtime":"local","shape":"none","ready":3`) {
		t.Errorf("warm pools in JSON: %s", body)
	}
}

type stats struct{ stub }

func (*stats) Stats() Stats {
	return Stats{ByStatus: map[task.Status]int{task.Queued: 2, task.Running: 1}, QueueDepth: 2, Running: 1,
		Durations:       Histogram{Bounds: []float64{1, 5}, Within: []uint64{1, 3}, Count: 4, Sum: 12.5},
		Agents:          map[string]AgentUsage{"claude": {InputTokens: 10, OutputTokens: 20, CostUSD: 0.5}},
		Commits:         Histogram{Bounds: []float64{0.0005, 0.001}, Within: []uint64{2, 5}, Count: 6, Sum: 0.0071},
		EventsCommitted: 9,
		Deliveries:      &DeliveryStats{ByState: map[task.DeliveryState]int{task.DeliveryDelivered: 7, task.DeliveryDead: 1}, FailedAttempts: 15},
		Warm:            []WarmPool{{Runtime: "local", Shape: "none", Ready: 3, Target: 4, Claims: 5, Misses: 1, Started: 9, Failed: 2, Destroyed: 1}}}
}

// /metrics writes the backend's histograms of run times and commits, agent
// usage, notifications and warm pools, in Prometheus's text format.
func TestMetricsRoute(t *testing.T) {
	hs := httptest.NewServer(newTestServer(&stats{}, Options{Token: "tok"}, slogTo(io.Discard)).Handler())
	t.Cleanup(hs.Close)
	code, body := call(t, "GET", hs.URL+"/metrics", "tok")
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	for _, want := range []string{
		`corral_tasks{status="queued"} 2`,
		`corral_task_duration_seconds_bucket{le="1"} 1`,
		`corral_task_duration_seconds_bucket{le="5"} 3`,
		`corral_task_duration_seconds_bucket{le="+Inf"} 4`,
		`corral_task_duration_seconds_sum 12.5`,
		`corral_task_duration_seconds_count 4`,
		`corral_agent_tokens_total{agent="claude",kind="input"} 10`,
		`corral_agent_tokens_total{agent="claude",kind="output"} 20`,
		`corral_agent_cost_usd_total{agent="claude"} 0.5`,
		`# TYPE corral_event_commit_seconds histogram`,
		`corral_event_commit_seconds_bucket{le="0.0005"} 2`,
		`corral_event_commit_seconds_bucket{le="0.001"} 5`,
		`corral_event_commit_seconds_bucket{le="+Inf"} 6`,
		`corral_event_commit_seconds_sum 0.0071`,
		`corral_event_commit_seconds_count 6`,
		`corral_events_committed_total 9`,
		`# TYPE corral_deliveries gauge`,
		`corral_deliveries{state="pending"} 0`,
		`corral_deliveries{state="delivered"} 7`,
		`corral_deliveries{state="failed"} 1`,
		`# TYPE corral_delivery_attempts_failed_total counter`,
		`corral_delivery_attempts_failed_total 15`,
		`corral_warm_failed_total{runtime="local",shape="none"} 2`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics has no line %s:\n%s", want, body)
		}
	}
}
