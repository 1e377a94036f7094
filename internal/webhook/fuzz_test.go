package webhook

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// FuzzVerify feeds arbitrary bodies and headers to Verify. It must never
// panic, and it must never accept a body that was not signed with the key
// of the task the body names.
func FuzzVerify(f *testing.F) {
	secret := []byte("fuzz secret")
	now := time.Unix(1_800_000_000, 0)
	good, _ := json.Marshal(Completion{EventType: EventWorkerCompleted, Source: "local", TaskID: "task-1", Status: "success", WebhookID: "w1", Timestamp: now.Unix()})
	f.Add(good, Sign(DeriveKey(secret, "task-1"), good), "w1", strconv.FormatInt(now.Unix(), 10))
	f.Add([]byte(`{"task_id":"task-2"}`), "sha256=00", "", "")
	f.Add([]byte(`not json`), "", "x", "1")
	f.Add([]byte(`{"event_type":"worker_completed","task_id":"../../x","status":"success","webhook_id":"w","timestamp":1800000000}`), "sha256=zz", "w", "1800000000")
	f.Fuzz(func(t *testing.T, body []byte, sig, id, ts string) {
		v := NewVerifier(secret, time.Minute, func() time.Time { return now })
		h := http.Header{}
		h.Set(HeaderSignature, sig)
		h.Set(HeaderID, id)
		h.Set(HeaderTimestamp, ts)
		c, err := v.Verify(Received(h, body))
		if err != nil {
			return
		}
		if want := Sign(DeriveKey(secret, c.TaskID), body); sig != want {
			t.Fatalf("accepted a body for %q with signature %q, want %q", c.TaskID, sig, want)
		}
	})
}
