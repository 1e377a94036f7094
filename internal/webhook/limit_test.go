package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/task"
)

// progressSender signs progress reports for one task with fresh ids, as a
// worker holding the task's key can.
type progressSender struct {
	tb     testing.TB
	v      *Verifier
	clk    *clock
	taskID string
	n      int
}

// send posts a report of items and returns what the Verifier accepted.
func (s *progressSender) send(items int) (ProgressReport, error) {
	s.tb.Helper()
	s.n++
	return s.sendAs(fmt.Sprintf("wh_%s_%d", s.taskID, s.n), items)
}

// sendAs posts a report of items with webhook id id: a retry of an earlier
// one when id is that one's.
func (s *progressSender) sendAs(id string, items int) (ProgressReport, error) {
	s.tb.Helper()
	p := ProgressReport{EventType: task.EventProgress, Source: "local", TaskID: s.taskID, WebhookID: id, Timestamp: s.clk.Now().Unix()}
	for i := range items {
		p.Items = append(p.Items, ProgressItem{Kind: fmt.Sprintf("k%d", i), Text: strings.Repeat("x", 512)})
	}
	body, err := json.Marshal(p)
	if err != nil {
		s.tb.Fatal(err)
	}
	h := http.Header{}
	h.Set(HeaderSignature, Sign(DeriveKey(testSecret, s.taskID), body))
	h.Set(HeaderSource, p.Source)
	h.Set(HeaderTimestamp, strconv.FormatInt(p.Timestamp, 10))
	h.Set(HeaderID, p.WebhookID)
	return s.v.VerifyProgress(Received(h, body))
}

func TestProgressAtTheWorkersPaceIsNeverDropped(t *testing.T) {
	clk := &clock{t: testNow}
	v := NewVerifier(testSecret, time.Minute, clk.Now)
	s := &progressSender{tb: t, v: v, clk: clk, taskID: "task-a"}
	// The worker's ceiling: one report every 500 ms (the wait before a
	// report; the post itself only adds to it), one item of each of its
	// five kinds, for twenty minutes.
	for i := range 2400 {
		p, err := s.send(5)
		if err != nil {
			t.Fatalf("report %d: %v", i, err)
		}
		if len(p.Items) != 5 {
			t.Fatalf("report %d: %d items recorded, want its 5", i, len(p.Items))
		}
		clk.Add(500 * time.Millisecond)
	}
}

func TestProgressFloodIsDroppedCountedAndNoted(t *testing.T) {
	clk := &clock{t: testNow}
	v := NewVerifier(testSecret, time.Minute, clk.Now)
	flood := &progressSender{tb: t, v: v, clk: clk, taskID: "task-a"}
	other := &progressSender{tb: t, v: v, clk: clk, taskID: "task-b"}
	l := v.limits

	accepted, dropped := 0, 0
	for range 100 {
		_, err := flood.send(1)
		switch {
		case err == nil:
			accepted++
		case errors.Is(err, errdefs.ErrResourceExhausted):
			dropped++
		default:
			t.Fatalf("flood: %v", err)
		}
	}
	if accepted != int(l.Burst) || dropped != 100-int(l.Burst) {
		t.Fatalf("at one instant: %d accepted, %d dropped; want the burst of %g and the rest", accepted, dropped, l.Burst)
	}
	// task-b's budget is its own.
	if p, err := other.send(5); err != nil || len(p.Items) != 5 {
		t.Fatalf("another task during the flood: %d items, %v", len(p.Items), err)
	}

	// One second earns ten items: the next report goes through, and carries
	// the note of what was dropped.
	clk.Add(time.Second)
	p, err := flood.send(1)
	if err != nil {
		t.Fatalf("after a second: %v", err)
	}
	if len(p.Items) != 2 || p.Items[1].Kind != KindProgressDropped || p.Items[1].Coalesced != dropped || !strings.Contains(p.Items[1].Text, fmt.Sprintf("%d progress reports", dropped)) {
		t.Fatalf("items after the drops: %+v, want the report's and a note of %d dropped", p.Items, dropped)
	}

	// More drops within the note window are counted but noted only once
	// the window has passed.
	for range 20 {
		flood.send(1)
	}
	clk.Add(time.Second)
	if p, err := flood.send(1); err != nil || len(p.Items) != 1 {
		t.Fatalf("within the note window: %+v, %v; want the report alone", p.Items, err)
	}
	clk.Add(l.NoteEvery)
	p, err = flood.send(1)
	if err != nil || len(p.Items) != 2 || p.Items[1].Kind != KindProgressDropped || p.Items[1].Coalesced < 20-int(l.EventsPerSecond) {
		t.Fatalf("after the note window: %+v, %v; want a note of the drops", p.Items, err)
	}
}

func TestProgressTotalsPerTask(t *testing.T) {
	clk := &clock{t: testNow}
	v := NewVerifier(testSecret, time.Minute, clk.Now)
	v.limits.MaxEvents = 10
	s := &progressSender{tb: t, v: v, clk: clk, taskID: "task-a"}
	for i := range 2 {
		if _, err := s.send(4); err != nil {
			t.Fatalf("report %d within the total: %v", i, err)
		}
	}
	// The first report over the total is replaced by a note saying so; the
	// next ones are refused, even after the rate has recovered.
	p, err := s.send(4)
	if err != nil || len(p.Items) != 1 || p.Items[0].Kind != KindProgressDropped || !strings.Contains(p.Items[0].Text, "limit of the task reached") {
		t.Fatalf("over the total: %+v, %v; want only the note", p.Items, err)
	}
	clk.Add(time.Minute)
	if _, err := s.send(1); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("after the total: %v, want ErrResourceExhausted", err)
	}
	other := &progressSender{tb: t, v: v, clk: clk, taskID: "task-b"}
	if _, err := other.send(4); err != nil {
		t.Fatalf("another task after task-a's total: %v", err)
	}

	v.limits.MaxEvents, v.limits.MaxBytes = 1000, 4<<10
	big := &progressSender{tb: t, v: v, clk: clk, taskID: "task-c"}
	if _, err := big.send(4); err != nil {
		t.Fatalf("a report within the byte total: %v", err)
	}
	if p, err := big.send(4); err != nil || len(p.Items) != 1 || p.Items[0].Kind != KindProgressDropped {
		t.Fatalf("over the byte total: %+v, %v; want only the note", p.Items, err)
	}
}

// TestCompletionProgressShareTheBudget: the progress a completion carries
// is charged to the task's budget like a report's, so completions signed
// with fresh ids are no way around it; over the budget the items are
// dropped and the completion is still accepted.
func TestCompletionProgressShareTheBudget(t *testing.T) {
	clk := &clock{t: testNow}
	v := NewVerifier(testSecret, time.Minute, clk.Now)
	s := &progressSender{tb: t, v: v, clk: clk, taskID: "task-a"}
	complete := func(n int) (Completion, error) {
		s.n++
		c := Completion{EventType: EventWorkerCompleted, Source: "local", TaskID: s.taskID, Status: "success", WebhookID: fmt.Sprintf("wh_c_%d", s.n), Timestamp: clk.Now().Unix()}
		for i := range n {
			c.Progress = append(c.Progress, ProgressItem{Kind: fmt.Sprintf("k%d", i), Text: "x"})
		}
		body, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		h := http.Header{}
		h.Set(HeaderSignature, Sign(DeriveKey(testSecret, s.taskID), body))
		h.Set(HeaderSource, c.Source)
		h.Set(HeaderTimestamp, strconv.FormatInt(c.Timestamp, 10))
		h.Set(HeaderID, c.WebhookID)
		return v.Verify(Received(h, body))
	}
	recorded := 0
	for i := range 10 {
		c, err := complete(MaxProgressItems)
		if err != nil {
			t.Fatalf("completion %d: %v; want it accepted whatever its progress", i, err)
		}
		recorded += len(c.Progress)
	}
	// Two full completions fit the burst of 64; the rest of the instant's
	// are dropped.
	if want := 2 * MaxProgressItems; recorded != want {
		t.Errorf("10 completions of %d items recorded %d items, want the burst's %d", MaxProgressItems, recorded, want)
	}
	// And a report after them finds the budget spent.
	if _, err := s.send(1); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("a report after the completions: %v, want it over the rate", err)
	}
}

// TestForgottenProgressIsRefunded: a message the server verified but could
// not record is forgotten (Forget), and the worker's retry, with the same
// id, is charged again: what the first attempt took from the task's
// budget (rate, totals, the exhaustion it caused and the drops its note
// reported) is given back, so a retry is judged as the first attempt was.
func TestForgottenProgressIsRefunded(t *testing.T) {
	clk := &clock{t: testNow}
	v := NewVerifier(testSecret, time.Minute, clk.Now)

	// The rate: two full reports spend the burst; the second, forgotten,
	// is accepted again.
	rate := &progressSender{tb: t, v: v, clk: clk, taskID: "task-rate"}
	if _, err := rate.sendAs("a", 32); err != nil {
		t.Fatal(err)
	}
	if _, err := rate.sendAs("b", 32); err != nil {
		t.Fatal(err)
	}
	v.Forget("b")
	if p, err := rate.sendAs("b", 32); err != nil || len(p.Items) != 32 {
		t.Errorf("retry of a forgotten report at the burst: %d items, %v; want its 32", len(p.Items), err)
	}

	// The totals, and the exhaustion a report caused.
	v.limits.MaxEvents = 10
	total := &progressSender{tb: t, v: v, clk: clk, taskID: "task-total"}
	if _, err := total.sendAs("a", 4); err != nil {
		t.Fatal(err)
	}
	v.Forget("a")
	for _, id := range []string{"a", "b"} {
		if p, err := total.sendAs(id, 4); err != nil || len(p.Items) != 4 {
			t.Fatalf("report %s after a forgotten one: %d items, %v; want its 4 within the total of 10", id, len(p.Items), err)
		}
	}
	if p, err := total.sendAs("c", 4); err != nil || len(p.Items) != 1 || p.Items[0].Kind != KindProgressDropped {
		t.Fatalf("over the total: %+v, %v; want only the note", p.Items, err)
	}
	v.Forget("c")
	if p, err := total.sendAs("c", 4); err != nil || len(p.Items) != 1 || p.Items[0].Kind != KindProgressDropped {
		t.Errorf("retry of the forgotten report that reached the total: %+v, %v; want the note again", p.Items, err)
	}
	if _, err := total.sendAs("d", 1); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("after the total: %v, want ErrResourceExhausted", err)
	}

	// The drops a forgotten note reported are reported by the retry's.
	v.limits.MaxEvents = 1000
	drops := &progressSender{tb: t, v: v, clk: clk, taskID: "task-drops"}
	for _, id := range []string{"a", "b"} {
		if _, err := drops.sendAs(id, 32); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := drops.sendAs("dropped", 5); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("over the rate: %v, want it dropped", err)
	}
	clk.Add(time.Minute)
	p, err := drops.sendAs("e", 1)
	if err != nil || len(p.Items) != 2 || p.Items[1].Coalesced != 5 {
		t.Fatalf("report after a drop: %+v, %v; want its item and a note of 5 dropped", p.Items, err)
	}
	v.Forget("e")
	if p, err := drops.sendAs("e", 1); err != nil || len(p.Items) != 2 || p.Items[1].Coalesced != 5 {
		t.Errorf("retry of the forgotten report with the note: %+v, %v; want the note of 5 again", p.Items, err)
	}
}
