package notify

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/sqlite"
	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
	"github.com/corral-dev/corral/internal/task"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// hit is one request the receiver got.
type hit struct {
	id   string
	body []byte
	at   time.Time
	err  error // from Verify
}

// receiver is the host: it verifies each notification and answers with
// the next status of its script (200 once the script is spent).
type receiver struct {
	*httptest.Server
	signer *Signer

	mu     sync.Mutex
	script []int
	hits   []hit
	got    chan struct{}
}

func MustReceiver(tb testing.TB, secret string, script ...int) *receiver {
	tb.Helper()
	s, err := NewSigner(secret)
	if err != nil {
		tb.Fatal(err)
	}
	r := &receiver{signer: s, script: script, got: make(chan struct{}, 1000)}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		h := hit{id: req.Header.Get(HeaderID), body: body, at: time.Now(), err: r.signer.Verify(req.Header, body, time.Now(), 5*time.Minute)}
		r.mu.Lock()
		r.hits = append(r.hits, h)
		code := http.StatusOK
		if len(r.script) > 0 {
			code, r.script = r.script[0], r.script[1:]
		}
		r.mu.Unlock()
		w.WriteHeader(code)
		r.got <- struct{}{}
	}))
	tb.Cleanup(r.Close)
	return r
}

func (r *receiver) Hits() []hit {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.hits)
}

// fixture is a store, a receiver and a way to run dispatchers over them.
type fixture struct {
	store  *sqlite.Store
	recv   *receiver
	secret string
}

func MustFixture(tb testing.TB, script ...int) *fixture {
	tb.Helper()
	secret := NewSecret()
	return &fixture{store: sqlitetest.Open(tb), recv: MustReceiver(tb, secret, script...), secret: secret}
}

func (f *fixture) options(tb testing.TB, edit func(*Options)) Options {
	tb.Helper()
	s, err := NewSigner(f.secret)
	if err != nil {
		tb.Fatal(err)
	}
	o := Options{URL: f.recv.URL + "/hooks/corral", Signer: s, InitialBackoff: 20 * time.Millisecond, MaxBackoff: 40 * time.Millisecond, Timeout: 2 * time.Second}
	if edit != nil {
		edit(&o)
	}
	return o
}

// MustRun runs a dispatcher, following the log and sending, until the
// returned stop is called or the test ends.
func (f *fixture) MustRun(tb testing.TB, edit func(*Options)) (*Dispatcher, func()) {
	tb.Helper()
	d, err := New(f.store, f.options(tb, edit), discard())
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- d.Run(ctx) }()
	go func() { done <- d.Send(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			for range 2 {
				if err := <-done; err != nil {
					tb.Errorf("Run or Send: %v", err)
				}
			}
		})
	}
	tb.Cleanup(stop)
	// Wait for the recovery, so events the test appends next are live.
	mustList(tb, d, "")
	return d, stop
}

var origin = task.Origin{ConversationID: "conv-1", InterfaceType: "telegram", UserName: "alice"}

// MustEnd records a task that was created and ended with res; it returns
// the task id and the worker_completed event.
func (f *fixture) MustEnd(tb testing.TB, res task.Completed) (string, eventstore.Event) {
	tb.Helper()
	id := task.NewID()
	spec := task.Spec{Description: "chart it", Agent: "command", Runtime: "local", Network: "none", TimeoutMinutes: 5, Origin: origin, Labels: map[string]string{"k": "v"}}
	c, _ := json.Marshal(task.Created{Spec: spec})
	r, _ := json.Marshal(res)
	ctx := eventstore.WithCause(context.Background(), eventstore.Cause{CorrelationID: "corr_test", CausationID: "request/req_test"})
	evs, err := f.store.Append(ctx, task.StreamID(id), 0,
		eventstore.Proposed{Type: task.EventCreated, SchemaVersion: 1, Data: c},
		eventstore.Proposed{Type: task.EventQueued, SchemaVersion: 1, Data: json.RawMessage("{}")},
		eventstore.Proposed{Type: task.EventCompleted, SchemaVersion: 1, Data: r})
	if err != nil {
		tb.Fatal(err)
	}
	return id, evs[2]
}

func success() task.Completed {
	code, dur := 0, 2.5
	return task.Completed{Status: task.Success, ExitCode: &code, DurationSeconds: &dur, Summary: "made a chart",
		OutputFiles: []task.OutputFile{{Name: "chart.png", Size: 10, Type: "image/png"}}, Reason: "webhook"}
}

// mustList returns the dispatcher's deliveries in state ("": all).
func mustList(tb testing.TB, d *Dispatcher, state task.DeliveryState) []task.Delivery {
	tb.Helper()
	all, err := d.List(context.Background(), state, 0)
	if err != nil {
		tb.Fatal(err)
	}
	return all
}

// waitDelivery polls until the delivery of event is in state.
func waitDelivery(tb testing.TB, d *Dispatcher, eventID string, state task.DeliveryState, within time.Duration) task.Delivery {
	tb.Helper()
	id := task.DeliveryIDFor(eventID)
	deadline := time.Now().Add(within)
	for {
		all := mustList(tb, d, "")
		for _, dl := range all {
			if dl.ID == id && dl.State == state {
				return dl
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("delivery %s not %s within %s: %+v", id, state, within, all)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// deliveryEvents returns the events of a delivery's stream.
func deliveryEvents(tb testing.TB, s eventstore.Store, deliveryID string) []eventstore.Event {
	tb.Helper()
	evs, err := s.ReadStream(context.Background(), task.DeliveryStreamID(deliveryID), 0)
	if err != nil {
		tb.Fatal(err)
	}
	return evs
}

// streamTypes returns the types of a delivery's events, in order.
func streamTypes(tb testing.TB, s eventstore.Store, deliveryID string) []string {
	tb.Helper()
	var types []string
	for _, e := range deliveryEvents(tb, s, deliveryID) {
		types = append(types, e.Type)
	}
	return types
}

func TestDeliversCompletion(t *testing.T) {
	f := MustFixture(t)
	d, _ := f.MustRun(t, nil)
	id, ev := f.MustEnd(t, success())
	dl := waitDelivery(t, d, ev.ID, task.DeliveryDelivered, 10*time.Second)

	hits := f.recv.Hits()
	if len(hits) != 1 {
		t.Fatalf("receiver got %d requests, want 1", len(hits))
	}
	if hits[0].err != nil {
		t.Errorf("the receiver cannot verify the notification: %v", hits[0].err)
	}
	if hits[0].id != dl.ID {
		t.Errorf("webhook-id = %q, want the delivery id %q", hits[0].id, dl.ID)
	}
	var got map[string]any
	if err := json.Unmarshal(hits[0].body, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"event_type": "worker_completed", "source": "local", "task_id": id, "status": "success",
		"duration_seconds": 3.0, "duration_ms": 2500.0, "exit_code": 0.0, "output_files": []any{"chart.png"}, "error_message": nil,
		"summary": "made a chart", "reason": "webhook",
		"conversation_id": "conv-1", "interface_type": "telegram", "user_name": "alice",
		"labels": map[string]any{"k": "v"}, "event_id": ev.ID, "occurred_at": ev.RecordedAt.UTC().Format(time.RFC3339Nano),
		"correlation_id": "corr_test", "causation_id": ev.CausationID,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("payload (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{task.EventDeliveryScheduled, task.EventDeliveryAttempted, task.EventDeliverySucceeded}, streamTypes(t, f.store, dl.ID)); diff != "" {
		t.Errorf("delivery events (-want +got):\n%s", diff)
	}
	if dl.Attempts != 1 || dl.LastStatusCode != 200 || dl.TaskID != id || dl.SourceEventID != ev.ID {
		t.Errorf("delivery = %+v", dl)
	}
	// The delivery's events keep the task's correlation; the first is
	// caused by the reported event, each later one by the one before.
	cause := ev.ID
	for _, e := range deliveryEvents(t, f.store, dl.ID) {
		if e.CorrelationID != "corr_test" || e.CausationID != cause {
			t.Errorf("%s: correlation %q causation %q, want corr_test and %q", e.Type, e.CorrelationID, e.CausationID, cause)
		}
		cause = e.ID
	}
}

func TestFailedTaskPayload(t *testing.T) {
	f := MustFixture(t)
	d, _ := f.MustRun(t, nil)
	_, ev := f.MustEnd(t, task.Completed{Status: task.Failed, ErrorMessage: "sandbox gone", Reason: "lost"})
	waitDelivery(t, d, ev.ID, task.DeliveryDelivered, 10*time.Second)
	var got map[string]any
	json.Unmarshal(f.recv.Hits()[0].body, &got)
	if got["status"] != "failed" || got["error_message"] != "sandbox gone" || got["exit_code"] != nil || !cmp.Equal(got["output_files"], []any{}) {
		t.Errorf("payload = %v, want failed with the error, a null exit code and no files", got)
	}
}

// TestCompletionSaysOutputsPending: the end of a task that asked
// save_to_shared is sent at once, saying its outputs are pending (their
// copy follows the end, with an event of its own); other tasks' ends say
// nothing of it.
func TestCompletionSaysOutputsPending(t *testing.T) {
	f := MustFixture(t)
	d, _ := f.MustRun(t, nil)
	id := task.NewID()
	c, _ := json.Marshal(task.Created{Spec: task.Spec{Description: "save it", Agent: "command", SaveToShared: true}})
	r, _ := json.Marshal(success())
	evs, err := f.store.Append(context.Background(), task.StreamID(id), 0,
		eventstore.Proposed{Type: task.EventCreated, SchemaVersion: 1, Data: c},
		eventstore.Proposed{Type: task.EventCompleted, SchemaVersion: 1, Data: r})
	if err != nil {
		t.Fatal(err)
	}
	_, other := f.MustEnd(t, success())
	waitDelivery(t, d, evs[1].ID, task.DeliveryDelivered, 10*time.Second)
	waitDelivery(t, d, other.ID, task.DeliveryDelivered, 10*time.Second)
	for _, h := range f.recv.Hits() {
		var got struct {
			TaskID        string          `json:"task_id"`
			SharedOutputs json.RawMessage `json:"shared_outputs"`
		}
		json.Unmarshal(h.body, &got)
		want := ""
		if got.TaskID == id {
			want = `{"state":"pending"}`
		}
		if string(got.SharedOutputs) != want {
			t.Errorf("task %s: shared_outputs %s, want %q", got.TaskID, got.SharedOutputs, want)
		}
	}
}

func TestRetriesThenSucceeds(t *testing.T) {
	f := MustFixture(t, 500, 404, 302)
	// Every time the dispatcher reads: the next attempt is due a backoff
	// after one of them (its attempt's end), not after the event's
	// RecordedAt, which an append delayed on a loaded machine moves.
	var (
		mu    sync.Mutex
		reads []time.Time
	)
	d, _ := f.MustRun(t, func(o *Options) {
		o.Jitter = func() float64 { return 0.5 }
		o.Now = func() time.Time {
			now := time.Now()
			mu.Lock()
			reads = append(reads, now)
			mu.Unlock()
			return now
		}
	})
	_, ev := f.MustEnd(t, success())
	dl := waitDelivery(t, d, ev.ID, task.DeliveryDelivered, 10*time.Second)

	hits := f.recv.Hits()
	if len(hits) != 4 {
		t.Fatalf("receiver got %d requests, want 4", len(hits))
	}
	for i, h := range hits {
		if h.id != dl.ID || h.err != nil || string(h.body) != string(hits[0].body) {
			t.Errorf("attempt %d: webhook-id %q, verify %v: want the same id and body on every attempt, verified", i+1, h.id, h.err)
		}
	}
	var codes []int
	for _, e := range deliveryEvents(t, f.store, dl.ID) {
		if e.Type != task.EventDeliveryAttempted {
			continue
		}
		var a task.DeliveryAttempted
		json.Unmarshal(e.Data, &a)
		codes = append(codes, a.StatusCode)
		if a.StatusCode != 200 {
			// Waits of 20ms, 40ms, 40ms (the ceiling), each scaled by 0.75.
			want := Backoff(20*time.Millisecond, 40*time.Millisecond, a.Attempt, 0.5)
			if a.NextAttemptAt == nil || a.Error == "" {
				t.Errorf("attempt %d: no next attempt or error: %+v", a.Attempt, a)
				continue
			}
			from := a.NextAttemptAt.Add(-want)
			mu.Lock()
			read := slices.ContainsFunc(reads, func(r time.Time) bool { return r.Equal(from) })
			mu.Unlock()
			if !read {
				t.Errorf("attempt %d: next attempt at %s, %s after no time the dispatcher read (it was recorded %s after the attempt)",
					a.Attempt, a.NextAttemptAt, want, a.NextAttemptAt.Sub(e.RecordedAt))
			}
		}
	}
	if diff := cmp.Diff([]int{500, 404, 302, 200}, codes); diff != "" {
		t.Errorf("attempt status codes (-want +got):\n%s", diff)
	}
}

func TestBackoffUsesInjectedClock(t *testing.T) {
	f := MustFixture(t, 503)
	base := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	d, _ := f.MustRun(t, func(o *Options) {
		o.Now = func() time.Time { return base } // time stands still: the retry is never due
		o.Jitter = func() float64 { return 0.25 }
		o.InitialBackoff, o.MaxBackoff = time.Minute, time.Hour
	})
	_, ev := f.MustEnd(t, success())
	id := task.DeliveryIDFor(ev.ID)
	deadline := time.Now().Add(10 * time.Second)
	for {
		all := mustList(t, d, task.DeliveryPending)
		if len(all) == 1 && all[0].Attempts == 1 {
			want := base.Add(Backoff(time.Minute, time.Hour, 1, 0.25)) // 30s + 7.5s
			if all[0].NextAttemptAt == nil || !all[0].NextAttemptAt.Equal(want) {
				t.Errorf("next attempt at %v, want %v", all[0].NextAttemptAt, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failed first attempt: %+v", all)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if n := len(f.recv.Hits()); n != 1 {
		t.Errorf("receiver got %d requests while the clock stood still, want 1", n)
	}
	if got := streamTypes(t, f.store, id); len(got) != 2 {
		t.Errorf("delivery events %v, want scheduled and one attempt", got)
	}
}

func TestDeadLetterAndRetry(t *testing.T) {
	f := MustFixture(t, 503, 503, 503)
	d, _ := f.MustRun(t, func(o *Options) { o.MaxAttempts = 3 })
	_, ev := f.MustEnd(t, success())
	dl := waitDelivery(t, d, ev.ID, task.DeliveryDead, 10*time.Second)
	if dl.Attempts != 3 || dl.LastStatusCode != 503 || dl.FailedAt == nil {
		t.Errorf("dead letter = %+v, want 3 attempts ending in 503", dl)
	}
	failed, err := d.List(context.Background(), task.DeliveryDead, 0)
	if err != nil || len(failed) != 1 || failed[0].ID != dl.ID {
		t.Fatalf("List(failed) = %+v, %v; want the dead letter", failed, err)
	}
	time.Sleep(100 * time.Millisecond)
	if n := len(f.recv.Hits()); n != 3 {
		t.Errorf("receiver got %d requests, want 3 and no more after the dead letter", n)
	}

	if _, err := d.Retry(context.Background(), "dlv_nope", "alice"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Retry(bad id) = %v, want ErrInvalidArgument", err)
	}
	if _, err := d.Retry(context.Background(), task.DeliveryIDFor("evt_0000000000000000000000000a"), "alice"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Retry(unknown) = %v, want ErrNotFound", err)
	}
	if _, err := d.List(context.Background(), "stuck", 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("List(bad state) = %v, want ErrInvalidArgument", err)
	}

	re, err := d.Retry(context.Background(), dl.ID, "assistant")
	if err != nil {
		t.Fatal(err)
	}
	if re.State != task.DeliveryPending {
		t.Errorf("after Retry the delivery is %s, want pending", re.State)
	}
	dl = waitDelivery(t, d, ev.ID, task.DeliveryDelivered, 10*time.Second)
	if dl.Attempts != 4 {
		t.Errorf("attempts = %d, want 4", dl.Attempts)
	}
	if _, err := d.Retry(context.Background(), dl.ID, "assistant"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Retry(delivered) = %v, want ErrConflict", err)
	}
	var actor string
	for _, e := range deliveryEvents(t, f.store, dl.ID) {
		if e.Type == task.EventDeliveryRetried {
			actor = e.Actor
		}
	}
	if actor != "assistant" {
		t.Errorf("delivery_retried actor = %q, want assistant", actor)
	}
}

// Stats counts the deliveries by state and the attempts the host did not
// accept: a dead letter's three, which stay three when a retry by hand
// succeeds; a server that folds the log afresh counts the same.
func TestStats(t *testing.T) {
	f := MustFixture(t, 503, 503, 503)
	d, stop := f.MustRun(t, func(o *Options) { o.MaxAttempts = 3 })
	_, ev := f.MustEnd(t, success())
	dl := waitDelivery(t, d, ev.ID, task.DeliveryDead, 10*time.Second)
	want := Stats{ByState: map[task.DeliveryState]int{task.DeliveryDead: 1}, FailedAttempts: 3}
	if diff := cmp.Diff(want, d.Stats()); diff != "" {
		t.Errorf("Stats of a dead letter (-want +got):\n%s", diff)
	}
	if _, err := d.Retry(context.Background(), dl.ID, "alice"); err != nil {
		t.Fatal(err)
	}
	waitDelivery(t, d, ev.ID, task.DeliveryDelivered, 10*time.Second)
	want = Stats{ByState: map[task.DeliveryState]int{task.DeliveryDelivered: 1}, FailedAttempts: 3}
	if diff := cmp.Diff(want, d.Stats()); diff != "" {
		t.Errorf("Stats once retried and delivered (-want +got):\n%s", diff)
	}
	stop()
	again, _ := f.MustRun(t, nil)
	if diff := cmp.Diff(want, again.Stats()); diff != "" {
		t.Errorf("Stats folded afresh (-want +got):\n%s", diff)
	}
}

func TestResumesAfterRestart(t *testing.T) {
	f := MustFixture(t, 500)
	_, stop := f.MustRun(t, func(o *Options) { o.InitialBackoff, o.MaxBackoff = time.Hour, time.Hour })
	_, first := f.MustEnd(t, success())
	for deadline := time.Now().Add(10 * time.Second); len(f.recv.Hits()) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no first attempt")
		}
	}
	// Let the failed attempt be recorded, then stop with it pending for an hour.
	for deadline := time.Now().Add(10 * time.Second); len(streamTypes(t, f.store, task.DeliveryIDFor(first.ID))) < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first attempt was not recorded")
		}
	}
	stop()
	_, second := f.MustEnd(t, success()) // ends while no dispatcher runs

	// A restart whose clock is an hour on finds both from the log.
	d, _ := f.MustRun(t, func(o *Options) { o.Now = func() time.Time { return time.Now().Add(time.Hour + time.Minute) } })
	waitDelivery(t, d, first.ID, task.DeliveryDelivered, 10*time.Second)
	waitDelivery(t, d, second.ID, task.DeliveryDelivered, 10*time.Second)
	byID := map[string]int{}
	for _, h := range f.recv.Hits() {
		byID[h.id]++
	}
	if diff := cmp.Diff(map[string]int{task.DeliveryIDFor(first.ID): 2, task.DeliveryIDFor(second.ID): 1}, byID); diff != "" {
		t.Errorf("requests by webhook-id (-want +got):\n%s", diff)
	}
	// A third start schedules nothing again.
	if all := mustList(t, d, ""); len(all) != 2 {
		t.Errorf("%d deliveries, want 2", len(all))
	}
}

func TestOnlyEventsWhileEnabled(t *testing.T) {
	f := MustFixture(t)
	_, before := f.MustEnd(t, success()) // before notifications were ever on
	d, stop := f.MustRun(t, nil)
	_, during := f.MustEnd(t, success())
	waitDelivery(t, d, during.ID, task.DeliveryDelivered, 10*time.Second)
	stop()
	if err := Disable(context.Background(), f.store); err != nil {
		t.Fatal(err)
	}
	_, off := f.MustEnd(t, success())
	d, _ = f.MustRun(t, nil)
	_, after := f.MustEnd(t, success())
	waitDelivery(t, d, after.ID, task.DeliveryDelivered, 10*time.Second)

	var got []string
	for _, dl := range mustList(t, d, "") {
		got = append(got, dl.SourceEventID)
	}
	sort.Strings(got)
	want := []string{during.ID, after.ID}
	sort.Strings(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("delivered events (-want +got):\n%s\n(before notifications were on: %s; while off: %s)", diff, before.ID, off.ID)
	}
}

func TestSubscribedEventTypes(t *testing.T) {
	f := MustFixture(t)
	d, _ := f.MustRun(t, func(o *Options) { o.Events = []string{task.EventQueued, "delivery_attempted"} })
	id, ev := f.MustEnd(t, success())
	waitDelivery(t, d, ev.ID, task.DeliveryDelivered, 10*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for len(f.recv.Hits()) < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // a delivery of a delivery event would show up by now
	var types []string
	var queued Event
	for _, h := range f.recv.Hits() {
		var e Event
		json.Unmarshal(h.body, &e)
		types = append(types, e.EventType)
		if e.EventType == task.EventQueued {
			queued = e
		}
	}
	sort.Strings(types)
	if diff := cmp.Diff([]string{task.EventQueued, task.EventCompleted}, types); diff != "" {
		t.Errorf("notified types (-want +got):\n%s", diff)
	}
	if queued.TaskID != id || queued.ConversationID != "conv-1" || queued.Status != task.Queued || string(queued.Data) != "{}" {
		t.Errorf("task_queued notification = %+v", queued)
	}
}

func TestTimeoutAndUnreachable(t *testing.T) {
	f := MustFixture(t)
	hang := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(hang) })
	d, _ := f.MustRun(t, func(o *Options) {
		o.URL, o.Timeout, o.MaxAttempts = slow.URL+"/?token=s3cret", 50*time.Millisecond, 1
	})
	_, ev := f.MustEnd(t, success())
	dl := waitDelivery(t, d, ev.ID, task.DeliveryDead, 10*time.Second)
	if dl.LastError != "no answer within 50ms" {
		t.Errorf("last error = %q, want the timeout", dl.LastError)
	}

	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	g := MustFixture(t)
	d2, _ := g.MustRun(t, func(o *Options) { o.URL, o.MaxAttempts = closed.URL+"/?token=s3cret", 1 })
	_, ev = g.MustEnd(t, success())
	dl = waitDelivery(t, d2, ev.ID, task.DeliveryDead, 10*time.Second)
	if dl.LastError == "" || dl.LastStatusCode != 0 || slices.Contains([]string{dl.LastError}, "s3cret") {
		t.Errorf("last error = %q (status %d), want a connection error without the URL", dl.LastError, dl.LastStatusCode)
	}
}

func TestConcurrencyIsBounded(t *testing.T) {
	f := MustFixture(t)
	var mu sync.Mutex
	cur, peak := 0, 0
	release := make(chan struct{})
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		cur++
		peak = max(peak, cur)
		mu.Unlock()
		<-release
		mu.Lock()
		cur--
		mu.Unlock()
	}))
	t.Cleanup(busy.Close)
	d, _ := f.MustRun(t, func(o *Options) { o.URL, o.Concurrency = busy.URL, 2 })
	var last eventstore.Event
	for range 6 {
		_, last = f.MustEnd(t, success())
	}
	time.Sleep(200 * time.Millisecond)
	close(release)
	waitDelivery(t, d, last.ID, task.DeliveryDelivered, 10*time.Second)
	if peak != 2 {
		t.Errorf("at most %d POSTs were in flight, want 2", peak)
	}
}

// TestNotificationLatency measures how long after a task's terminal event
// its notification reaches the host, one task at a time.
func TestNotificationLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("measures 100 tasks")
	}
	f := MustFixture(t)
	d, _ := f.MustRun(t, nil)
	var lat []time.Duration
	var ev eventstore.Event
	for i := range 100 {
		_, ev = f.MustEnd(t, success())
		select {
		case <-f.recv.got:
		case <-time.After(10 * time.Second):
			t.Fatalf("task %d: no notification", i)
		}
		h := f.recv.Hits()
		lat = append(lat, h[len(h)-1].at.Sub(ev.RecordedAt))
	}
	slices.Sort(lat)
	t.Logf("notification latency after the terminal event over %d tasks: median %s, p90 %s, max %s", len(lat), lat[len(lat)/2], lat[len(lat)*9/10], lat[len(lat)-1])
	// The target is 50ms; the bound is loose so a loaded machine passes.
	if lat[len(lat)/2] > 500*time.Millisecond {
		t.Errorf("median latency %s, want well under 500ms (target 50ms)", lat[len(lat)/2])
	}
	waitDelivery(t, d, ev.ID, task.DeliveryDelivered, 10*time.Second)
	if all := mustList(t, d, task.DeliveryDelivered); len(all) != 100 {
		t.Errorf("%d deliveries delivered, want 100", len(all))
	}
}

// A server that follows the log but does not send (not its cluster's
// leader) lists every delivery and sends none; one that starts sending
// later, or again after it stopped, sends what is owed and due.
func TestSendStartsAndStopsBesideRun(t *testing.T) {
	f := MustFixture(t)
	d, err := New(f.store, f.options(t, nil), discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runDone := make(chan error, 1)
	go func() { runDone <- d.Run(ctx) }()
	mustList(t, d, "")
	_, first := f.MustEnd(t, success())
	time.Sleep(200 * time.Millisecond)
	if got := mustList(t, d, ""); len(got) != 0 {
		t.Fatalf("deliveries with no sender: %+v, want none scheduled", got)
	}
	for round := range 2 {
		sctx, stop := context.WithCancel(ctx)
		sendDone := make(chan error, 1)
		go func() { sendDone <- d.Send(sctx) }()
		waitDelivery(t, d, first.ID, task.DeliveryDelivered, 10*time.Second)
		stop()
		if err := <-sendDone; err != nil {
			t.Fatalf("Send, round %d: %v", round, err)
		}
		_, first = f.MustEnd(t, success()) // owed to the next sender
	}
	cancel()
	if err := <-runDone; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
