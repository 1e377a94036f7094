package httpapi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/corral-dev/corral/internal/errdefs"
)

// RateLimit is a token bucket: Rate requests a second on average, Burst
// at once. A zero Rate means no limit.
type RateLimit struct {
	Rate  float64
	Burst int
}

// What has a bucket, and what has none:
//
//   - each API token, by the name it is recorded under (with no token
//     configured, the one local caller): every route that needs the token,
//     /mcp among them, and the session routes when it is the token sent;
//   - each session token, by its hash (the session's own and each one a
//     task was granted are apart), on the HTTP listener and on the unix
//     socket alike.
//
// The workers' own reports (fromWorker routes: a task's completion and
// progress, a session's exec agent dialling in) have none. They carry no
// user token, so a host that spends its token's budget cannot starve
// them; each is bound to one task by its key, and already bounded there:
// one completion per task, the progress reports' own budget per task
// (webhook.progressLimits, which answers 429 itself), at most 64
// connections per sandbox or worker pod. A second bucket per task would
// only repeat those, and refusing a completion would leave a task running
// until its sandbox exits. /healthz, the UI's assets and requests that
// fail authentication have none either: they are cheap, and a bucket per
// wrong token would let anyone grow the map.
const (
	apiBucket     = "api/"
	sessionBucket = "session/"
)

// sweepEvery is how often the limiter drops the buckets that are full.
const sweepEvery = time.Minute

// limiter holds a token bucket per caller. Its map holds only callers that
// authenticated, so it is bounded by the tokens that exist; session tokens
// come and go, and a bucket that has filled up again (idle for Burst/Rate
// seconds) is dropped at the next sweep: a new bucket starts full, so
// dropping a full one changes nothing a caller can see. It is safe for
// concurrent use; a nil *limiter allows everything.
type limiter struct {
	limit rate.Limit
	burst int
	now   func() time.Time
	log   *slog.Logger

	mu      sync.Mutex
	buckets map[string]*bucket
	swept   time.Time
}

type bucket struct {
	lim *rate.Limiter
	// over is set by a refusal and cleared by the next request allowed,
	// so that each spell over the limit is logged once.
	over bool
}

// newLimiter returns the limiter of l, or nil when l sets no limit.
func newLimiter(l RateLimit, log *slog.Logger) *limiter {
	if l.Rate <= 0 {
		return nil
	}
	return &limiter{limit: rate.Limit(l.Rate), burst: max(l.Burst, 1), now: time.Now, log: log, buckets: map[string]*bucket{}}
}

// allow takes a request from key's bucket. Over the limit it returns a
// *rateLimitError (ErrResourceExhausted: a 429), saying when the next
// request would be allowed; who names the caller in it and in the log.
func (l *limiter) allow(key, who string) error {
	if l == nil {
		return nil
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.swept) >= sweepEvery {
		l.sweep(now)
	}
	b := l.buckets[key]
	if b == nil {
		b = &bucket{lim: rate.NewLimiter(l.limit, l.burst)}
		l.buckets[key] = b
	}
	if b.lim.AllowN(now, 1) {
		b.over = false
		return nil
	}
	// A refused request takes nothing: the bucket holds less than one
	// token, and the rest comes at the bucket's rate.
	wait := (1 - b.lim.TokensAt(now)) / float64(l.limit)
	if !b.over {
		b.over = true
		l.log.Warn("request rate over the limit", "caller", who, "rate", float64(l.limit), "burst", l.burst)
	}
	return &rateLimitError{who: who, rate: float64(l.limit), burst: l.burst, retryAfter: retrySeconds(wait)}
}

// sweep drops the buckets that are full again.
func (l *limiter) sweep(now time.Time) {
	for k, b := range l.buckets {
		if b.lim.TokensAt(now) >= float64(l.burst) {
			delete(l.buckets, k)
		}
	}
	l.swept = now
}

// retrySeconds is Retry-After for a wait of secs seconds: whole seconds,
// rounded up (waiting that long, the next request is allowed), at least 1.
func retrySeconds(secs float64) int {
	return int(max(1, min(math.Ceil(secs), math.MaxInt32)))
}

// rateLimitError is a request refused for its caller's rate.
type rateLimitError struct {
	who        string
	rate       float64
	burst      int
	retryAfter int // seconds
}

func (e *rateLimitError) Error() string {
	return fmt.Sprintf("too many requests from %s: the limit is %g a second, %d at once (limits.api_rate, limits.api_burst); retry after %d s: %v",
		e.who, e.rate, e.burst, e.retryAfter, errdefs.ErrResourceExhausted)
}

func (e *rateLimitError) Unwrap() error { return errdefs.ErrResourceExhausted }

// RetryAfter is the Retry-After header's value.
func (e *rateLimitError) RetryAfter() string { return strconv.Itoa(e.retryAfter) }

// apiCaller is the bucket of the API caller named name.
func apiCaller(name string) (key, who string) {
	if name == "local" {
		return apiBucket + name, "the local caller"
	}
	return apiBucket + name, "token " + name
}

// sessionCallerKey is the bucket of a session token of session id: its
// hash, so the map holds no token.
func sessionCallerKey(id, token string) (key, who string) {
	sum := sha256.Sum256([]byte(token))
	return sessionBucket + hex.EncodeToString(sum[:]), "a token of session " + id
}
