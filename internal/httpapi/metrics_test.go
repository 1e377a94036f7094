package httpapi

import (
	"io"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// hostileStats are Stats whose label values come from outside and hold
// what the text format must escape, and one that is not UTF-8.
type hostileStats struct{ stub }

const hostileName = "a\"b\\c\nd}e,f=\"g\"\th\u00e9"

func (*hostileStats) Stats() Stats {
	return Stats{
		Agents: map[string]AgentUsage{hostileName: {InputTokens: 3, OutputTokens: 4, CostUSD: 0.25}, "bad\xff": {InputTokens: 1}},
		Warm:   []WarmPool{{Runtime: hostileName, Shape: "s\\", Ready: 2}},
	}
}

// scrape GETs /metrics from hs and parses it as Prometheus does.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := call(t, "GET", url+"/metrics", "tok")
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v\n%s", err, body)
	}
	return fams
}

// labels returns m's labels as a map.
func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// Label values with quotes, backslashes, newlines, tabs and the text format's
// own punctuation come out escaped and parse back to themselves; a value
// that is not UTF-8 is left out without taking the rest of the scrape
// with it.
func TestMetricsEscapeLabelValues(t *testing.T) {
	hs := httptest.NewServer(newTestServer(&hostileStats{}, Options{Token: "tok"}, slogTo(io.Discard)).Handler())
	t.Cleanup(hs.Close)
	fams := scrape(t, hs.URL)

	tokens := fams["corral_agent_tokens_total"]
	if tokens == nil || len(tokens.GetMetric()) != 2 {
		t.Fatalf("corral_agent_tokens_total: %v", tokens)
	}
	for _, m := range tokens.GetMetric() {
		l := labels(m)
		want := map[string]float64{"input": 3, "output": 4}[l["kind"]]
		if l["agent"] != hostileName || m.GetCounter().GetValue() != want {
			t.Errorf("corral_agent_tokens_total %q = %v, want agent %q and %v", l, m.GetCounter().GetValue(), hostileName, want)
		}
	}
	warm := fams["corral_warm_sandboxes"].GetMetric()
	if len(warm) != 1 || labels(warm[0])["runtime"] != hostileName || labels(warm[0])["shape"] != "s\\" || warm[0].GetGauge().GetValue() != 2 {
		t.Errorf("corral_warm_sandboxes: %v", warm)
	}
}

// The Go runtime's and the process's metrics are there, and
// corral_build_info carries the version, the revision and the Go version.
func TestMetricsRuntimeAndBuild(t *testing.T) {
	hs := httptest.NewServer(newTestServer(&stats{}, Options{Token: "tok", Version: "v1.2.3 \"x\"", Revision: "abc123"}, slogTo(io.Discard)).Handler())
	t.Cleanup(hs.Close)
	fams := scrape(t, hs.URL)
	for _, name := range []string{"go_goroutines", "go_memstats_alloc_bytes", "process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"} {
		if fams[name] == nil {
			t.Errorf("/metrics has no %s", name)
		}
	}
	bi := fams["corral_build_info"].GetMetric()
	if len(bi) != 1 || bi[0].GetGauge().GetValue() != 1 {
		t.Fatalf("corral_build_info: %v", bi)
	}
	want := map[string]string{"version": "v1.2.3 \"x\"", "revision": "abc123", "goversion": runtime.Version()}
	for k, v := range want {
		if got := labels(bi[0])[k]; got != v {
			t.Errorf("corral_build_info{%s=%q}, want %q", k, got, v)
		}
	}
}

// A request is counted and timed under the pattern that served it, not its
// path, and its status code.
func TestMetricsHTTPRequests(t *testing.T) {
	hs := httptest.NewServer(newTestServer(&stats{}, Options{Token: "tok"}, slogTo(io.Discard)).Handler())
	t.Cleanup(hs.Close)
	if code, _ := call(t, "GET", hs.URL+"/api/tasks/some-task-id/result", ""); code != 401 {
		t.Fatalf("without the token: %d, want 401", code)
	}
	call(t, "GET", hs.URL+"/api/health", "tok")
	call(t, "GET", hs.URL+"/api/health", "tok")
	fams := scrape(t, hs.URL)

	count := map[[2]string]float64{}
	for _, m := range fams["corral_http_requests_total"].GetMetric() {
		l := labels(m)
		if strings.Contains(l["route"], "some-task-id") {
			t.Errorf("a route label holds the path: %q", l)
		}
		count[[2]string{l["route"], l["code"]}] = m.GetCounter().GetValue()
	}
	for k, want := range map[[2]string]float64{
		{"GET /api/tasks/{id}/result", "401"}: 1,
		{"GET /api/health", "200"}:            2,
	} {
		if count[k] != want {
			t.Errorf("corral_http_requests_total%q = %v, want %v (all: %v)", k, count[k], want, count)
		}
	}
	var timed uint64
	for _, m := range fams["corral_http_request_duration_seconds"].GetMetric() {
		if l := labels(m); l["route"] == "GET /api/health" && l["code"] == "200" {
			timed = m.GetHistogram().GetSampleCount()
		}
	}
	if timed != 2 {
		t.Errorf("corral_http_request_duration_seconds{route=\"GET /api/health\",code=\"200\"} counts %d requests, want 2", timed)
	}
}
