package httpapi

import (
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"runtime"
	"slices"
	"strconv"

	"github.com/felixge/httpsnoop"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/task"
)

// metrics are the server's Prometheus metrics, in a registry of its own
// (not the library's global one, which any imported package may add to):
// the backend's figures, read at each scrape, the Go runtime's and the
// process's, the build's, and the HTTP requests this server answered.
type metrics struct {
	handler   http.Handler
	requests  *prometheus.CounterVec
	durations *prometheus.HistogramVec
}

func newMetrics(b Backend, version, revision string, log *slog.Logger) *metrics {
	reg := prometheus.NewRegistry()
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_http_requests_total",
			Help: "HTTP requests answered, by the route that served them (its registered pattern) and status code.",
		}, []string{"route", "code"}),
		durations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "corral_http_request_duration_seconds",
			Help:    "How long HTTP requests took, from the request's headers read until its handler returned, by route and status code. Streams (logs, events, execs) count their whole length.",
			Buckets: prometheus.DefBuckets,
		}, []string{"route", "code"}),
	}
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "corral_build_info",
		Help:        "Always 1; its labels say which build of corral runs.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version(), "revision": revision},
	})
	buildInfo.Set(1)
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo, m.requests, m.durations, statsCollector{b},
	)
	// A sample that cannot be written (a label value that is not UTF-8)
	// is left out and logged, not the whole scrape.
	m.handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, ErrorLog: promLog{log}})
	return m
}

// instrument counts and times each request next answers, by the pattern
// the mux matched (never the path: a label per task id would grow without
// bound) and its status code.
func (m *metrics) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The wrapper keeps w's optional interfaces (Flusher, Hijacker)
		// and unwraps for http.ResponseController.
		c := httpsnoop.CaptureMetrics(next, w, r)
		// The mux sets the pattern on this very request; a request no
		// pattern matched (a redirect to the cleaned path) has none.
		route := r.Pattern
		if route == "" {
			route = "none"
		}
		code := strconv.Itoa(c.Code)
		m.requests.WithLabelValues(route, code).Inc()
		m.durations.WithLabelValues(route, code).Observe(c.Duration.Seconds())
	})
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) error {
	s.prom.handler.ServeHTTP(w, r)
	return nil
}

// statsCollector exports the backend's Stats, read once per scrape.
type statsCollector struct{ b Backend }

var (
	tasksDesc           = prometheus.NewDesc("corral_tasks", "Tasks by status.", []string{"status"}, nil)
	queueDepthDesc      = prometheus.NewDesc("corral_queue_depth", "Tasks waiting to start.", nil, nil)
	workersRunningDesc  = prometheus.NewDesc("corral_workers_running", "Tasks this server is starting or supervising.", nil, nil)
	taskDurationDesc    = prometheus.NewDesc("corral_task_duration_seconds", "How long ended tasks ran.", nil, nil)
	commitDesc          = prometheus.NewDesc("corral_event_commit_seconds", "Event log commits (a transaction and an fsync each; concurrent appends share one), from BEGIN until on disk. Every task waits for several.", nil, nil)
	eventsCommittedDesc = prometheus.NewDesc("corral_events_committed_total", "Events the event log committed: over corral_event_commit_seconds_count, how many a commit holds.", nil, nil)
	agentTokensDesc     = prometheus.NewDesc("corral_agent_tokens_total", "Tokens agents reported, by agent and kind (input, output).", []string{"agent", "kind"}, nil)
	agentCostDesc       = prometheus.NewDesc("corral_agent_cost_usd_total", "Cost in US dollars agents reported, by agent.", []string{"agent"}, nil)
	deliveriesDesc      = prometheus.NewDesc("corral_deliveries", "Notifications to the host by state; failed ones are the dead letters (GET /api/deliveries?state=failed).", []string{"state"}, nil)
	deliveryFailedDesc  = prometheus.NewDesc("corral_delivery_attempts_failed_total", "POSTs of notifications the host did not accept (an error, no answer in time, an answer other than 2xx).", nil, nil)
)

// warmMetrics are the families of a runtime's pool of warm sandboxes.
var warmMetrics = []struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(WarmPool) uint64
}{
	{warmDesc("corral_warm_sandboxes", "Warm sandboxes ready for a task, by runtime and shape."), prometheus.GaugeValue, func(p WarmPool) uint64 { return uint64(p.Ready) }},
	{warmDesc("corral_warm_target", "Warm sandboxes each pool keeps (0 while emptied after an idle time)."), prometheus.GaugeValue, func(p WarmPool) uint64 { return uint64(p.Target) }},
	{warmDesc("corral_warm_claims_total", "Tasks that started in a warm sandbox."), prometheus.CounterValue, func(p WarmPool) uint64 { return p.Claims }},
	{warmDesc("corral_warm_misses_total", "Tasks of a pool's shape that found no warm sandbox and started cold."), prometheus.CounterValue, func(p WarmPool) uint64 { return p.Misses }},
	{warmDesc("corral_warm_started_total", "Warm sandboxes started."), prometheus.CounterValue, func(p WarmPool) uint64 { return p.Started }},
	{warmDesc("corral_warm_failed_total", "Warm sandboxes that failed to start."), prometheus.CounterValue, func(p WarmPool) uint64 { return p.Failed }},
	{warmDesc("corral_warm_destroyed_total", "Warm sandboxes destroyed without a task (idle, shutdown)."), prometheus.CounterValue, func(p WarmPool) uint64 { return p.Destroyed }},
}

func warmDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, []string{"runtime", "shape"}, nil)
}

func (statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{tasksDesc, queueDepthDesc, workersRunningDesc, taskDurationDesc, commitDesc,
		eventsCommittedDesc, agentTokensDesc, agentCostDesc, deliveriesDesc, deliveryFailedDesc} {
		ch <- d
	}
	for _, m := range warmMetrics {
		ch <- m.desc
	}
}

func (c statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.b.Stats()
	for _, s := range []task.Status{task.Pending, task.Queued, task.Starting, task.Running, task.Success, task.Failed, task.Timeout, task.Cancelled} {
		ch <- constMetric(tasksDesc, prometheus.GaugeValue, float64(st.ByStatus[s]), string(s))
	}
	ch <- constMetric(queueDepthDesc, prometheus.GaugeValue, float64(st.QueueDepth))
	ch <- constMetric(workersRunningDesc, prometheus.GaugeValue, float64(st.Running))
	ch <- constHistogram(taskDurationDesc, st.Durations)
	ch <- constHistogram(commitDesc, st.Commits)
	ch <- constMetric(eventsCommittedDesc, prometheus.CounterValue, float64(st.EventsCommitted))
	for _, n := range slices.Sorted(maps.Keys(st.Agents)) {
		u := st.Agents[n]
		ch <- constMetric(agentTokensDesc, prometheus.CounterValue, float64(u.InputTokens), n, "input")
		ch <- constMetric(agentTokensDesc, prometheus.CounterValue, float64(u.OutputTokens), n, "output")
		ch <- constMetric(agentCostDesc, prometheus.CounterValue, u.CostUSD, n)
	}
	// Without notifications, the delivery families have no samples, as the
	// warm pools' have none without pools.
	if d := st.Deliveries; d != nil {
		for _, s := range []task.DeliveryState{task.DeliveryPending, task.DeliveryDelivered, task.DeliveryDead} {
			ch <- constMetric(deliveriesDesc, prometheus.GaugeValue, float64(d.ByState[s]), string(s))
		}
		ch <- constMetric(deliveryFailedDesc, prometheus.CounterValue, float64(d.FailedAttempts))
	}
	for _, m := range warmMetrics {
		for _, p := range st.Warm {
			ch <- constMetric(m.desc, m.kind, float64(m.value(p)), p.Runtime, p.Shape)
		}
	}
}

// constMetric is the sample of d with value v and labels; one it cannot
// make is reported by the scrape (and logged), not panicked on.
func constMetric(d *prometheus.Desc, kind prometheus.ValueType, v float64, labels ...string) prometheus.Metric {
	m, err := prometheus.NewConstMetric(d, kind, v, labels...)
	if err != nil {
		return prometheus.NewInvalidMetric(d, err)
	}
	return m
}

// promLog logs what promhttp reports.
type promLog struct{ log *slog.Logger }

func (l promLog) Println(v ...any) { l.log.Warn("metrics", logkey.Error, fmt.Sprint(v...)) }

// constHistogram is h as a sample of the histogram d; h's counts are
// cumulative already, as Prometheus's buckets are.
func constHistogram(d *prometheus.Desc, h Histogram) prometheus.Metric {
	buckets := make(map[float64]uint64, len(h.Bounds))
	for i, b := range h.Bounds {
		buckets[b] = h.Within[i]
	}
	return prometheus.MustNewConstHistogram(d, h.Count, h.Sum, buckets)
}
