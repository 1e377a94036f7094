package webhook

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
)

var (
	testSecret = []byte("server secret")
	testNow    = time.Date(2025, 1, 25, 10, 0, 0, 0, time.UTC)
)

// clock is a settable clock shared by a test's client and server goroutines.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func testCompletion(taskID string) Completion {
	return Completion{
		EventType:       EventWorkerCompleted,
		Source:          "local",
		TaskID:          taskID,
		Status:          "success",
		DurationSeconds: 145,
		ExitCode:        0,
		OutputFiles:     []string{"chart.png", "sub/data.csv"},
		WebhookID:       "wh_1",
		Timestamp:       testNow.Unix(),
	}
}

// mustSign returns the headers and body a worker holding key sends for c.
func mustSign(tb testing.TB, key []byte, c Completion) (http.Header, []byte) {
	tb.Helper()
	body, err := json.Marshal(c)
	if err != nil {
		tb.Fatal(err)
	}
	h := http.Header{}
	h.Set(HeaderSignature, Sign(key, body))
	h.Set(HeaderSource, c.Source)
	h.Set(HeaderTimestamp, strconv.FormatInt(c.Timestamp, 10))
	h.Set(HeaderID, c.WebhookID)
	return h, body
}

func TestDeriveKeyIsPerTaskAndPerSecret(t *testing.T) {
	a := DeriveKey(testSecret, "task-a")
	if string(a) == string(DeriveKey(testSecret, "task-b")) {
		t.Error("two tasks got the same key")
	}
	if string(a) == string(DeriveKey([]byte("other secret"), "task-a")) {
		t.Error("two secrets gave the same key")
	}
	if string(a) != string(DeriveKey(testSecret, "task-a")) {
		t.Error("key derivation is not deterministic")
	}
	if len(a) != 32 {
		t.Errorf("key is %d bytes, want 32", len(a))
	}
}

func TestSignFormat(t *testing.T) {
	// RFC 4231 test case 2: HMAC-SHA256("Jefe", "what do ya want for nothing?").
	got := Sign([]byte("Jefe"), []byte("what do ya want for nothing?"))
	want := "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
	if got != want {
		t.Errorf("Sign = %s, want %s", got, want)
	}
}

func TestCompletionJSON(t *testing.T) {
	c := testCompletion("task-a")
	c.OutputFiles = nil
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if v, ok := m["error_message"]; !ok || v != nil {
		t.Errorf("error_message = %v (present %v), want null", v, ok)
	}
	if v, ok := m["output_files"].([]any); !ok || len(v) != 0 {
		t.Errorf("output_files = %#v, want []", m["output_files"])
	}
	c.ErrorMessage = "boom"
	c.OutputFiles = []string{"x"}
	b, _ = json.Marshal(c)
	var back Completion
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(c, back); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
}

func TestVerifyAcceptsValid(t *testing.T) {
	v := NewVerifier(testSecret, time.Minute, func() time.Time { return testNow })
	c := testCompletion("task-a")
	h, body := mustSign(t, DeriveKey(testSecret, "task-a"), c)
	got, err := v.Verify(Received(h, body))
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if diff := cmp.Diff(c, got); diff != "" {
		t.Errorf("completion (-want +got):\n%s", diff)
	}
}

func TestVerifyRejects(t *testing.T) {
	keyA := DeriveKey(testSecret, "task-a")
	tests := []struct {
		name  string
		build func() (http.Header, []byte)
		class error
		msg   string
	}{
		{"missing signature", func() (http.Header, []byte) {
			h, b := mustSign(t, keyA, testCompletion("task-a"))
			h.Del(HeaderSignature)
			return h, b
		}, errdefs.ErrUnauthenticated, "missing X-Webhook-Signature"},
		{"signature without prefix", func() (http.Header, []byte) {
			h, b := mustSign(t, keyA, testCompletion("task-a"))
			h.Set(HeaderSignature, strings.TrimPrefix(h.Get(HeaderSignature), "sha256="))
			return h, b
		}, errdefs.ErrUnauthenticated, "not \"sha256=<hex>\""},
		{"signature not hex", func() (http.Header, []byte) {
			h, b := mustSign(t, keyA, testCompletion("task-a"))
			h.Set(HeaderSignature, "sha256=zz")
			return h, b
		}, errdefs.ErrUnauthenticated, "not 64 lower-case hex digits"},
		{"the right signature in upper case", func() (http.Header, []byte) {
			h, b := mustSign(t, keyA, testCompletion("task-a"))
			h.Set(HeaderSignature, "sha256="+strings.ToUpper(strings.TrimPrefix(h.Get(HeaderSignature), "sha256=")))
			return h, b
		}, errdefs.ErrUnauthenticated, "not 64 lower-case hex digits"},
		{"bad signature", func() (http.Header, []byte) {
			h, b := mustSign(t, keyA, testCompletion("task-a"))
			h.Set(HeaderSignature, Sign([]byte("guess"), b))
			return h, b
		}, errdefs.ErrUnauthenticated, "signature does not match"},
		{"signed with another task's key", func() (http.Header, []byte) {
			// The worker of task-b holds only its own key and claims task-a.
			return mustSign(t, DeriveKey(testSecret, "task-b"), testCompletion("task-a"))
		}, errdefs.ErrUnauthenticated, "signature does not match"},
		{"signed with the server secret itself", func() (http.Header, []byte) {
			return mustSign(t, testSecret, testCompletion("task-a"))
		}, errdefs.ErrUnauthenticated, "signature does not match"},
		{"tampered body", func() (http.Header, []byte) {
			h, b := mustSign(t, keyA, testCompletion("task-a"))
			return h, []byte(strings.Replace(string(b), `"success"`, `"failed"`, 1))
		}, errdefs.ErrUnauthenticated, "signature does not match"},
		{"timestamp swapped in header only", func() (http.Header, []byte) {
			h, b := mustSign(t, keyA, testCompletion("task-a"))
			h.Set(HeaderTimestamp, strconv.FormatInt(testNow.Unix()+1, 10))
			return h, b
		}, errdefs.ErrInvalidArgument, "X-Webhook-Timestamp"},
		{"id swapped in header only", func() (http.Header, []byte) {
			h, b := mustSign(t, keyA, testCompletion("task-a"))
			h.Set(HeaderID, "wh_other")
			return h, b
		}, errdefs.ErrInvalidArgument, "X-Webhook-Id"},
		{"missing id header", func() (http.Header, []byte) {
			h, b := mustSign(t, keyA, testCompletion("task-a"))
			h.Del(HeaderID)
			return h, b
		}, errdefs.ErrInvalidArgument, "X-Webhook-Id"},
		{"source differs", func() (http.Header, []byte) {
			h, b := mustSign(t, keyA, testCompletion("task-a"))
			h.Set(HeaderSource, "kubernetes")
			return h, b
		}, errdefs.ErrInvalidArgument, "X-Webhook-Source"},
		{"stale timestamp", func() (http.Header, []byte) {
			c := testCompletion("task-a")
			c.Timestamp = testNow.Add(-61 * time.Second).Unix()
			return mustSign(t, keyA, c)
		}, errdefs.ErrPermissionDenied, "outside ±1m0s"},
		{"future timestamp", func() (http.Header, []byte) {
			c := testCompletion("task-a")
			c.Timestamp = testNow.Add(61 * time.Second).Unix()
			return mustSign(t, keyA, c)
		}, errdefs.ErrPermissionDenied, "outside ±1m0s"},
		{"not json", func() (http.Header, []byte) {
			h, _ := mustSign(t, keyA, testCompletion("task-a"))
			return h, []byte("{")
		}, errdefs.ErrInvalidArgument, "decode webhook body"},
		{"no task id", func() (http.Header, []byte) {
			return mustSign(t, DeriveKey(testSecret, ""), testCompletion(""))
		}, errdefs.ErrInvalidArgument, "task_id is empty"},
		{"not a final status", func() (http.Header, []byte) {
			c := testCompletion("task-a")
			c.Status = "running"
			return mustSign(t, keyA, c)
		}, errdefs.ErrInvalidArgument, `status "running"`},
		{"wrong event type", func() (http.Header, []byte) {
			c := testCompletion("task-a")
			c.EventType = "task_created"
			return mustSign(t, keyA, c)
		}, errdefs.ErrInvalidArgument, "event_type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := NewVerifier(testSecret, time.Minute, func() time.Time { return testNow })
			h, body := tt.build()
			_, err := v.Verify(Received(h, body))
			if !errors.Is(err, tt.class) {
				t.Fatalf("Verify error = %v, want class %v", err, tt.class)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Verify error %q does not say %q", err, tt.msg)
			}
		})
	}
}

func TestVerifyTimestampWindowEdges(t *testing.T) {
	key := DeriveKey(testSecret, "task-a")
	for _, off := range []time.Duration{-time.Minute, time.Minute} {
		v := NewVerifier(testSecret, time.Minute, func() time.Time { return testNow })
		c := testCompletion("task-a")
		c.Timestamp = testNow.Add(off).Unix()
		if _, err := v.Verify(Received(mustSign(t, key, c))); err != nil {
			t.Errorf("offset %s: Verify: %v", off, err)
		}
	}
}

func TestVerifyReplay(t *testing.T) {
	clk := &clock{t: testNow}
	v := NewVerifier(testSecret, time.Minute, clk.Now)
	key := DeriveKey(testSecret, "task-a")
	h, body := mustSign(t, key, testCompletion("task-a"))
	if _, err := v.Verify(Received(h, body)); err != nil {
		t.Fatalf("first Verify: %v", err)
	}
	_, err := v.Verify(Received(h, body))
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "already delivered") {
		t.Fatalf("replay: err = %v, want ErrConflict saying already delivered", err)
	}

	// A retry keeps the id but is re-signed later: still a replay of the id.
	clk.Add(30 * time.Second)
	c := testCompletion("task-a")
	c.Timestamp = clk.Now().Unix()
	if _, err := v.Verify(Received(mustSign(t, key, c))); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("re-signed retry: err = %v, want ErrConflict", err)
	}

	// After Forget (the handler could not record it) the retry is accepted.
	v.Forget(c.WebhookID)
	if _, err := v.Verify(Received(mustSign(t, key, c))); err != nil {
		t.Fatalf("retry after Forget: %v", err)
	}
}

func TestVerifyReplaySetIsBoundedPerTask(t *testing.T) {
	clk := &clock{t: testNow}
	v := NewVerifier(testSecret, time.Minute, clk.Now)
	v.maxSeen = 2
	send := func(taskID, id string) error {
		c := testCompletion(taskID)
		c.WebhookID = id
		c.Timestamp = clk.Now().Unix()
		_, err := v.Verify(Received(mustSign(t, DeriveKey(testSecret, taskID), c)))
		return err
	}
	for _, id := range []string{"a", "b"} {
		if err := send("task-a", id); err != nil {
			t.Fatalf("send %s: %v", id, err)
		}
	}
	if err := send("task-a", "c"); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("send c with task-a's set full: err = %v, want ErrResourceExhausted", err)
	}
	// Another task is not held back by task-a's full set, and the same id
	// in another task is another message.
	for _, id := range []string{"a", "c"} {
		if err := send("task-b", id); err != nil {
			t.Fatalf("task-b's %s while task-a's set is full: %v", id, err)
		}
	}
	// After 2×maxSkew the old ids expire and make room; by then a replay of
	// them fails the timestamp check instead.
	clk.Add(2*time.Minute + time.Second)
	if err := send("task-a", "c"); err != nil {
		t.Fatalf("send c after expiry: %v", err)
	}
	if n := len(v.tasks["task-a"].seen); n != 1 {
		t.Errorf("remembered %d ids of task-a, want 1", n)
	}
}

func TestVerifierForgetsQuietTasks(t *testing.T) {
	clk := &clock{t: testNow}
	v := NewVerifier(testSecret, time.Minute, clk.Now)
	for _, id := range []string{"task-a", "task-b"} {
		c := testCompletion(id)
		if _, err := v.Verify(Received(mustSign(t, DeriveKey(testSecret, id), c))); err != nil {
			t.Fatal(err)
		}
	}
	clk.Add(taskStateTTL)
	c := testCompletion("task-b")
	c.WebhookID, c.Timestamp = "wh_2", clk.Now().Unix()
	if _, err := v.Verify(Received(mustSign(t, DeriveKey(testSecret, "task-b"), c))); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Hour)
	v.mu.Lock()
	v.sweep(clk.Now())
	_, a := v.tasks["task-a"]
	_, b := v.tasks["task-b"]
	v.mu.Unlock()
	if a || !b {
		t.Errorf("after the sweep: task-a held %v (quiet for %s), task-b held %v (quiet for 1h); want false, true", a, taskStateTTL+time.Hour, b)
	}
}

// A body a second reader could read another way is refused, signed or
// not: a name given twice (which status?), a name in another case, text
// that is not UTF-8.
func TestVerifyRefusesAmbiguousBodies(t *testing.T) {
	v := NewVerifier(testSecret, time.Minute, func() time.Time { return testNow })
	key := DeriveKey(testSecret, "task-a")
	h, body := mustSign(t, key, testCompletion("task-a"))
	for name, bad := range map[string][]byte{
		"duplicate": bytes.Replace(body, []byte(`"status":"success"`), []byte(`"status":"success","status":"failed"`), 1),
		"case":      bytes.Replace(body, []byte(`"status":"success"`), []byte(`"Status":"success"`), 1),
		"utf8":      bytes.Replace(body, []byte(`"status":"success"`), []byte("\"status\":\"succ\xffess\""), 1),
	} {
		if bytes.Equal(bad, body) {
			t.Fatalf("%s: the body was not changed", name)
		}
		h.Set(HeaderSignature, Sign(key, bad))
		if _, err := v.Verify(Received(h, bad)); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
}
