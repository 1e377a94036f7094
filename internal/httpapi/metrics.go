package httpapi

import (
	"fmt"
	"io"
	"net/http"
	"sort"

	"github.com/corral-dev/corral/internal/task"
)

// metrics writes the Prometheus text exposition format by hand: a dozen
// families do not justify a client library.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) error {
	st := s.b.Stats()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	fmt.Fprintln(w, "# HELP corral_tasks Tasks by status.")
	fmt.Fprintln(w, "# TYPE corral_tasks gauge")
	statuses := []task.Status{task.Pending, task.Queued, task.Starting, task.Running, task.Success, task.Failed, task.Timeout, task.Cancelled}
	for _, s := range statuses {
		fmt.Fprintf(w, "corral_tasks{status=%q} %d\n", s, st.ByStatus[s])
	}
	fmt.Fprintln(w, "# HELP corral_queue_depth Tasks waiting to start.")
	fmt.Fprintln(w, "# TYPE corral_queue_depth gauge")
	fmt.Fprintf(w, "corral_queue_depth %d\n", st.QueueDepth)
	fmt.Fprintln(w, "# HELP corral_workers_running Tasks this server is starting or supervising.")
	fmt.Fprintln(w, "# TYPE corral_workers_running gauge")
	fmt.Fprintf(w, "corral_workers_running %d\n", st.Running)
	writeHistogram(w, "corral_task_duration_seconds", "How long ended tasks ran.", st.Durations)
	writeHistogram(w, "corral_event_commit_seconds", "Event log commits (a transaction and an fsync each; concurrent appends share one), from BEGIN until on disk. Every task waits for several.", st.Commits)
	fmt.Fprintln(w, "# HELP corral_events_committed_total Events the event log committed: over corral_event_commit_seconds_count, how many a commit holds.")
	fmt.Fprintln(w, "# TYPE corral_events_committed_total counter")
	fmt.Fprintf(w, "corral_events_committed_total %d\n", st.EventsCommitted)
	names := make([]string, 0, len(st.Agents))
	for n := range st.Agents {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "# HELP corral_agent_tokens_total Tokens agents reported, by agent and kind (input, output).")
	fmt.Fprintln(w, "# TYPE corral_agent_tokens_total counter")
	for _, n := range names {
		fmt.Fprintf(w, "corral_agent_tokens_total{agent=%q,kind=\"input\"} %d\n", n, st.Agents[n].InputTokens)
		fmt.Fprintf(w, "corral_agent_tokens_total{agent=%q,kind=\"output\"} %d\n", n, st.Agents[n].OutputTokens)
	}
	fmt.Fprintln(w, "# HELP corral_agent_cost_usd_total Cost in US dollars agents reported, by agent.")
	fmt.Fprintln(w, "# TYPE corral_agent_cost_usd_total counter")
	for _, n := range names {
		fmt.Fprintf(w, "corral_agent_cost_usd_total{agent=%q} %g\n", n, st.Agents[n].CostUSD)
	}
	// Without notifications, the families are there without samples, as
	// the warm pools' are without pools.
	d := st.Deliveries
	fmt.Fprintln(w, "# HELP corral_deliveries Notifications to the host by state; failed ones are the dead letters (GET /api/deliveries?state=failed).")
	fmt.Fprintln(w, "# TYPE corral_deliveries gauge")
	if d != nil {
		for _, s := range []task.DeliveryState{task.DeliveryPending, task.DeliveryDelivered, task.DeliveryDead} {
			fmt.Fprintf(w, "corral_deliveries{state=%q} %d\n", s, d.ByState[s])
		}
	}
	fmt.Fprintln(w, "# HELP corral_delivery_attempts_failed_total POSTs of notifications the host did not accept (an error, no answer in time, an answer other than 2xx).")
	fmt.Fprintln(w, "# TYPE corral_delivery_attempts_failed_total counter")
	if d != nil {
		fmt.Fprintf(w, "corral_delivery_attempts_failed_total %d\n", d.FailedAttempts)
	}
	warm := []struct {
		name, help, kind string
		value            func(WarmPool) uint64
	}{
		{"corral_warm_sandboxes", "Warm sandboxes ready for a task, by runtime and shape.", "gauge", func(p WarmPool) uint64 { return uint64(p.Ready) }},
		{"corral_warm_target", "Warm sandboxes each pool keeps (0 while emptied after an idle time).", "gauge", func(p WarmPool) uint64 { return uint64(p.Target) }},
		{"corral_warm_claims_total", "Tasks that started in a warm sandbox.", "counter", func(p WarmPool) uint64 { return p.Claims }},
		{"corral_warm_misses_total", "Tasks of a pool's shape that found no warm sandbox and started cold.", "counter", func(p WarmPool) uint64 { return p.Misses }},
		{"corral_warm_started_total", "Warm sandboxes started.", "counter", func(p WarmPool) uint64 { return p.Started }},
		{"corral_warm_failed_total", "Warm sandboxes that failed to start.", "counter", func(p WarmPool) uint64 { return p.Failed }},
		{"corral_warm_destroyed_total", "Warm sandboxes destroyed without a task (idle, shutdown).", "counter", func(p WarmPool) uint64 { return p.Destroyed }},
	}
	for _, m := range warm {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", m.name, m.help, m.name, m.kind)
		for _, p := range st.Warm {
			fmt.Fprintf(w, "%s{runtime=%q,shape=%q} %d\n", m.name, p.Runtime, p.Shape, m.value(p))
		}
	}
	return nil
}

// writeHistogram writes h as the histogram family name.
func writeHistogram(w io.Writer, name, help string, h Histogram) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
	for i, b := range h.Bounds {
		fmt.Fprintf(w, "%s_bucket{le=\"%g\"} %d\n", name, b, h.Within[i])
	}
	fmt.Fprintf(w, "%s_bucket{le=\"+Inf\"} %d\n", name, h.Count)
	fmt.Fprintf(w, "%s_sum %g\n", name, h.Sum)
	fmt.Fprintf(w, "%s_count %d\n", name, h.Count)
}
