package webhook

import (
	"bytes"
	"crypto/hmac"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/task"
)

// DefaultMaxSkew is a sensible timestamp window: wide enough for the clock
// drift between a host and its pods, narrow enough that a captured request
// is useless soon after.
const DefaultMaxSkew = 5 * time.Minute

// maxSeen bounds the replay set. At 2×maxSkew = 10 min of memory this is
// over 100 completions a second; past it Verify refuses with
// ErrResourceExhausted (a retryable 429) rather than forget an id early.
const maxSeen = 65536

// Verifier checks completion webhooks on the server.
//
// A Verifier is safe for concurrent use. It remembers every webhook id it
// accepted for 2×maxSkew, long enough that a replay is caught by either the
// id or the timestamp check, so it holds at most maxSeen ids in memory.
type Verifier struct {
	secret  []byte
	maxSkew time.Duration
	now     func() time.Time

	mu    sync.Mutex
	seen  map[string]time.Time // webhook id → when it may be forgotten
	limit int
}

// NewVerifier returns a Verifier for webhooks signed with keys derived from
// secret, accepting timestamps within ±maxSkew of now (time.Now if nil).
func NewVerifier(secret []byte, maxSkew time.Duration, now func() time.Time) *Verifier {
	if now == nil {
		now = time.Now
	}
	if maxSkew <= 0 {
		maxSkew = DefaultMaxSkew
	}
	return &Verifier{
		secret:  bytes.Clone(secret),
		maxSkew: maxSkew,
		now:     now,
		seen:    make(map[string]time.Time),
		limit:   maxSeen,
	}
}

// Verify authenticates a completion webhook and returns its body. The caller
// bounds body (MaxBodyBytes). The checks, in order, and what their failure
// returns:
//
//   - the X-Webhook-Signature header is missing or not "sha256=<64 hex>":
//     errdefs.ErrUnauthenticated
//   - the body is not a Completion with task_id, webhook_id, timestamp and a
//     terminal status: errdefs.ErrInvalidArgument
//   - the signature does not match the body under task_id's derived key
//     (another task's key, a tampered body): errdefs.ErrUnauthenticated
//   - the X-Webhook-Id, X-Webhook-Timestamp or X-Webhook-Source header
//     differs from the body: errdefs.ErrInvalidArgument
//   - the timestamp is more than maxSkew in the past or future:
//     errdefs.ErrPermissionDenied. The sender holds the right key, so this
//     is not an authentication failure but a request outside the window we
//     accept (a clock that drifted, or a captured request played later);
//     keeping it apart from 401 lets an operator tell the two apart.
//   - the webhook id was accepted before: errdefs.ErrConflict
//   - the replay set is full: errdefs.ErrResourceExhausted
//
// A payload is only parsed, never trusted, before its signature is checked:
// the task_id is needed to pick the key.
func (v *Verifier) Verify(h http.Header, body []byte) (Completion, error) {
	sig, err := parseSignature(h.Get(HeaderSignature))
	if err != nil {
		return Completion{}, err
	}
	var c Completion
	if err := json.Unmarshal(body, &c); err != nil {
		return Completion{}, fmt.Errorf("decode webhook body: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := validate(c); err != nil {
		return Completion{}, err
	}
	if err := v.authenticate(h, body, sig, "webhook", envelope{c.TaskID, c.WebhookID, c.Source, c.Timestamp}); err != nil {
		return Completion{}, err
	}
	return c, nil
}

// envelope is what every signed worker message carries besides its own
// payload.
type envelope struct {
	taskID, webhookID, source string
	timestamp                 int64
}

// authenticate runs the checks every worker message shares, once its body
// is parsed and its own fields checked: the signature under the task's
// derived key (constant time), the headers mirroring the body, the
// timestamp window, and the webhook id never seen before. kind names the
// message in errors ("webhook", "progress").
func (v *Verifier) authenticate(h http.Header, body, sig []byte, kind string, e envelope) error {
	if !hmac.Equal(sig, mac(DeriveKey(v.secret, e.taskID), body)) {
		return fmt.Errorf("check %s signature for task %s: signature does not match: %w", kind, e.taskID, errdefs.ErrUnauthenticated)
	}
	if got := h.Get(HeaderID); got != e.webhookID {
		return fmt.Errorf("check %s headers: %s %q differs from body webhook_id %q: %w", kind, HeaderID, got, e.webhookID, errdefs.ErrInvalidArgument)
	}
	if got := h.Get(HeaderTimestamp); got != strconv.FormatInt(e.timestamp, 10) {
		return fmt.Errorf("check %s headers: %s %q differs from body timestamp %d: %w", kind, HeaderTimestamp, got, e.timestamp, errdefs.ErrInvalidArgument)
	}
	if got := h.Get(HeaderSource); got != "" && got != e.source {
		return fmt.Errorf("check %s headers: %s %q differs from body source %q: %w", kind, HeaderSource, got, e.source, errdefs.ErrInvalidArgument)
	}
	now := v.now()
	ts := time.Unix(e.timestamp, 0)
	if d := now.Sub(ts); d > v.maxSkew || d < -v.maxSkew {
		return fmt.Errorf("check %s timestamp: %s is %s from now, outside ±%s: %w", kind, ts.UTC().Format(time.RFC3339), d.Round(time.Second), v.maxSkew, errdefs.ErrPermissionDenied)
	}
	return v.remember(e.webhookID, now)
}

// Forget releases a webhook id that Verify accepted, so that a retry with the
// same id is accepted again. A handler calls it when it could not record a
// verified completion (its store was down), so the worker's next attempt
// is not refused as a replay.
func (v *Verifier) Forget(webhookID string) {
	v.mu.Lock()
	delete(v.seen, webhookID)
	v.mu.Unlock()
}

func (v *Verifier) remember(id string, now time.Time) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if exp, ok := v.seen[id]; ok && now.Before(exp) {
		return fmt.Errorf("check webhook id: %s was already delivered: %w", id, errdefs.ErrConflict)
	}
	if len(v.seen) >= v.limit {
		for k, exp := range v.seen {
			if !now.Before(exp) {
				delete(v.seen, k)
			}
		}
		if len(v.seen) >= v.limit {
			return fmt.Errorf("check webhook id: %d ids remembered, at the limit: %w", len(v.seen), errdefs.ErrResourceExhausted)
		}
	}
	v.seen[id] = now.Add(2 * v.maxSkew)
	return nil
}

func parseSignature(s string) ([]byte, error) {
	if s == "" {
		return nil, fmt.Errorf("check webhook signature: missing %s header: %w", HeaderSignature, errdefs.ErrUnauthenticated)
	}
	hexSig, ok := strings.CutPrefix(s, "sha256=")
	if !ok {
		return nil, fmt.Errorf("check webhook signature: %s is not \"sha256=<hex>\": %w", HeaderSignature, errdefs.ErrUnauthenticated)
	}
	sig, err := hex.DecodeString(hexSig)
	if err != nil || len(sig) != 32 {
		return nil, fmt.Errorf("check webhook signature: %s is not 64 hex digits: %w", HeaderSignature, errdefs.ErrUnauthenticated)
	}
	return sig, nil
}

func validate(c Completion) error {
	var missing []string
	if c.EventType != EventWorkerCompleted {
		missing = append(missing, fmt.Sprintf("event_type %q is not %q", c.EventType, EventWorkerCompleted))
	}
	if c.TaskID == "" {
		missing = append(missing, "task_id is empty")
	}
	if c.WebhookID == "" {
		missing = append(missing, "webhook_id is empty")
	}
	if c.Timestamp <= 0 {
		missing = append(missing, "timestamp is missing")
	}
	if !task.Status(c.Status).Terminal() {
		missing = append(missing, fmt.Sprintf("status %q is not a final status", c.Status))
	}
	if len(missing) > 0 {
		return fmt.Errorf("check webhook body: %s: %w", strings.Join(missing, "; "), errdefs.ErrInvalidArgument)
	}
	return nil
}
