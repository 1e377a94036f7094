package webhook

import (
	"bytes"
	"crypto/hmac"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/strictjson"
	"github.com/corral-dev/corral/internal/task"
)

// DefaultMaxSkew is a sensible timestamp window: wide enough for the clock
// drift between a host and its pods, narrow enough that a captured request
// is useless soon after.
const DefaultMaxSkew = 5 * time.Minute

// The replay set is kept per task, so that one task's traffic (its worker
// holds its key and can sign as many messages as it likes) never evicts or
// crowds out another's ids.
const (
	// maxSeenPerTask bounds the ids remembered for one task. A task sends
	// at most a few progress reports a second (see progressLimits) and one
	// completion; past the bound its own messages are refused with
	// ErrResourceExhausted (a retryable 429) rather than an id forgotten
	// early.
	maxSeenPerTask = 4096
	// maxTasks bounds the tasks whose state is held at once.
	maxTasks = 65536
	// taskStateTTL is how long a task's state (its progress totals) is kept
	// after its last message: longer than the longest task may run
	// (config.MaxTimeoutMinutes), so a task cannot wait for its totals to
	// be forgotten.
	taskStateTTL = 25 * time.Hour
	// sweepEvery is the least time between two sweeps of expired state.
	sweepEvery = time.Minute
)

// Verifier checks completion webhooks and progress reports on the server.
//
// A Verifier is safe for concurrent use. It remembers every webhook id it
// accepted for 2×maxSkew, long enough that a replay is caught by either the
// id or the timestamp check, at most maxSeenPerTask per task; and it keeps
// each task's progress budget (progressLimits).
type Verifier struct {
	secret  []byte
	maxSkew time.Duration
	now     func() time.Time
	limits  progressLimits

	mu        sync.Mutex
	tasks     map[string]*taskState
	lastSweep time.Time
	maxSeen   int // per task
}

// taskState is what the Verifier holds for one task.
type taskState struct {
	seen       map[string]time.Time // webhook id → when it may be forgotten
	lastActive time.Time
	progress   progressBudget
	charged    map[string]charge // webhook id → what its progress took, while seen
}

// expire forgets the ids whose time has passed.
func (st *taskState) expire(now time.Time) {
	for id, exp := range st.seen {
		if !now.Before(exp) {
			delete(st.seen, id)
			delete(st.charged, id)
		}
	}
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
		limits:  defaultProgressLimits,
		tasks:   make(map[string]*taskState),
		maxSeen: maxSeenPerTask,
	}
}

// Verify authenticates a completion webhook and returns its body. The caller
// bounds body (MaxBodyBytes). The checks, in order, and what their failure
// returns:
//
//   - the X-Webhook-Signature header is missing or not "sha256=<64 lower-case hex>":
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
//   - the webhook id was accepted before for this task: errdefs.ErrConflict
//   - the task's replay set is full: errdefs.ErrResourceExhausted
//
// A payload is only parsed, never trusted, before its signature is checked:
// the task_id is needed to pick the key.
func (v *Verifier) Verify(m Signed) (Completion, error) {
	sig, err := parseSignature(m.Signature)
	if err != nil {
		return Completion{}, err
	}
	var c Completion
	if err := strictjson.Decode(m.Body, &c); err != nil {
		return Completion{}, fmt.Errorf("decode webhook body: %w", err)
	}
	if err := validate(c); err != nil {
		return Completion{}, err
	}
	now, err := v.authenticate(m, sig, "webhook", envelope{c.TaskID, c.WebhookID, c.Source, c.Timestamp})
	if err != nil {
		return Completion{}, err
	}
	// The progress a completion carries is held to the task's progress
	// budget like a report's, or repeated completions would be a way
	// around it; over the budget it is dropped, never the completion.
	var admit func(*taskState) (charge, error)
	if len(c.Progress) > 0 {
		admit = func(st *taskState) (charge, error) {
			items, ch, err := st.progress.admit(v.limits, now, c.Progress, len(m.Body))
			if err != nil {
				items = nil
			}
			c.Progress = items
			return ch, nil
		}
	}
	if err := v.remember(c.TaskID, c.WebhookID, now, admit); err != nil {
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
// derived key (constant time), the headers mirroring the body and the
// timestamp window. It returns the time it checked against, for remember.
// kind names the message in errors ("webhook", "progress").
func (v *Verifier) authenticate(m Signed, sig []byte, kind string, e envelope) (time.Time, error) {
	if !hmac.Equal(sig, mac(DeriveKey(v.secret, e.taskID), m.Body)) {
		return time.Time{}, fmt.Errorf("check %s signature for task %s: signature does not match: %w", kind, e.taskID, errdefs.ErrUnauthenticated)
	}
	if got := m.ID; got != e.webhookID {
		return time.Time{}, fmt.Errorf("check %s headers: %s %q differs from body webhook_id %q: %w", kind, HeaderID, got, e.webhookID, errdefs.ErrInvalidArgument)
	}
	if got := m.Timestamp; got != strconv.FormatInt(e.timestamp, 10) {
		return time.Time{}, fmt.Errorf("check %s headers: %s %q differs from body timestamp %d: %w", kind, HeaderTimestamp, got, e.timestamp, errdefs.ErrInvalidArgument)
	}
	if got := m.Source; got != "" && got != e.source {
		return time.Time{}, fmt.Errorf("check %s headers: %s %q differs from body source %q: %w", kind, HeaderSource, got, e.source, errdefs.ErrInvalidArgument)
	}
	now := v.now()
	ts := time.Unix(e.timestamp, 0)
	if d := now.Sub(ts); d > v.maxSkew || d < -v.maxSkew {
		return time.Time{}, fmt.Errorf("check %s timestamp: %s is %s from now, outside ±%s: %w", kind, ts.UTC().Format(time.RFC3339), d.Round(time.Second), v.maxSkew, errdefs.ErrPermissionDenied)
	}
	return now, nil
}

// Forget releases a webhook id that Verify or VerifyProgress accepted, so
// that a retry with the same id is accepted again, and gives back what its
// progress took from the task's budget, which the retry takes again. A
// handler calls it when it could not record a verified message (its store
// was down), so the worker's next attempt is neither refused as a replay
// nor charged twice.
func (v *Verifier) Forget(webhookID string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, st := range v.tasks {
		if ch, ok := st.charged[webhookID]; ok {
			st.progress.refund(v.limits, ch)
			delete(st.charged, webhookID)
		}
		delete(st.seen, webhookID)
	}
}

// remember records a task's webhook id, refusing one already seen. admit,
// if set, decides under the lock whether the message fits the task's
// budget and returns what it charged; an id it refuses is not remembered.
func (v *Verifier) remember(taskID, id string, now time.Time, admit func(*taskState) (charge, error)) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if now.Sub(v.lastSweep) >= sweepEvery {
		v.sweep(now)
	}
	st, err := v.state(taskID, now)
	if err != nil {
		return err
	}
	st.lastActive = now
	if exp, ok := st.seen[id]; ok && now.Before(exp) {
		return fmt.Errorf("check webhook id: %s was already delivered: %w", id, errdefs.ErrConflict)
	}
	if len(st.seen) >= v.maxSeen {
		st.expire(now)
		if len(st.seen) >= v.maxSeen {
			return fmt.Errorf("check webhook id: task %s sent %d messages in %s, at the limit: %w", taskID, len(st.seen), 2*v.maxSkew, errdefs.ErrResourceExhausted)
		}
	}
	if admit != nil {
		ch, err := admit(st)
		if err != nil {
			return err
		}
		if ch != (charge{}) {
			st.charged[id] = ch
		}
	}
	st.seen[id] = now.Add(2 * v.maxSkew)
	return nil
}

// state returns taskID's state, making it if there is room.
func (v *Verifier) state(taskID string, now time.Time) (*taskState, error) {
	if st, ok := v.tasks[taskID]; ok {
		return st, nil
	}
	if len(v.tasks) >= maxTasks {
		v.sweep(now)
		if len(v.tasks) >= maxTasks {
			return nil, fmt.Errorf("check webhook id: %d tasks sent messages in the last %s, at the limit: %w", len(v.tasks), taskStateTTL, errdefs.ErrResourceExhausted)
		}
	}
	st := &taskState{seen: make(map[string]time.Time), charged: make(map[string]charge), lastActive: now}
	v.tasks[taskID] = st
	return st, nil
}

// sweep forgets expired ids, and the tasks with none left that have been
// quiet for taskStateTTL.
func (v *Verifier) sweep(now time.Time) {
	v.lastSweep = now
	for taskID, st := range v.tasks {
		st.expire(now)
		if len(st.seen) == 0 && now.Sub(st.lastActive) > taskStateTTL {
			delete(v.tasks, taskID)
		}
	}
}

func parseSignature(s string) ([]byte, error) {
	if s == "" {
		return nil, fmt.Errorf("check webhook signature: missing %s header: %w", HeaderSignature, errdefs.ErrUnauthenticated)
	}
	hexSig, ok := strings.CutPrefix(s, "sha256=")
	if !ok {
		return nil, fmt.Errorf("check webhook signature: %s is not \"sha256=<hex>\": %w", HeaderSignature, errdefs.ErrUnauthenticated)
	}
	// Lower-case digits only, as Sign writes them: a signature has one
	// spelling, so no two headers carry the same MAC.
	sig, err := hex.DecodeString(hexSig)
	if err != nil || len(sig) != 32 || hex.EncodeToString(sig) != hexSig {
		return nil, fmt.Errorf("check webhook signature: %s is not 64 lower-case hex digits: %w", HeaderSignature, errdefs.ErrUnauthenticated)
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
	if len(c.Progress) > MaxProgressItems {
		missing = append(missing, fmt.Sprintf("%d progress items, more than %d", len(c.Progress), MaxProgressItems))
	}
	if len(missing) > 0 {
		return fmt.Errorf("check webhook body: %s: %w", strings.Join(missing, "; "), errdefs.ErrInvalidArgument)
	}
	return nil
}
