package webhook

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/rtkind"
)

// PostOptions tune Post. The zero value is ready to use.
type PostOptions struct {
	// Source is the X-Webhook-Source header and the body's source when the
	// Completion has none. Default "local".
	Source string
	// MaxAttempts bounds the number of requests. Default 20.
	MaxAttempts int
	// MaxElapsed bounds the time from the first attempt to the start of the
	// last one. Default 3 minutes: long enough to ride out a server restart.
	MaxElapsed time.Duration
	// InitialBackoff is the first wait; each wait doubles up to MaxBackoff,
	// and each is drawn at random from [d/2, d) so that many workers whose
	// server came back do not retry in step. Defaults 1s and 30s.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// AttemptTimeout bounds one request. Default 30s.
	AttemptTimeout time.Duration
	// Client sends http(s) requests. Default: a fresh client, closed after.
	// A unix:// URL always uses a client of its own, dialling with Dial.
	Client *http.Client
	// Dial dials a unix:// URL's socket. Default: a plain dial.
	Dial func(ctx context.Context, sock string) (net.Conn, error)
	// Log receives one line per failed attempt (Debug) and one when Post
	// gives up (Info). Default: discard.
	Log *slog.Logger
	// Now and Sleep are the clock, for tests. Sleep returns ctx.Err() if ctx
	// ends first.
	Now   func() time.Time
	Sleep func(ctx context.Context, d time.Duration) error
}

func (o *PostOptions) defaults() {
	if o.Source == "" {
		o.Source = rtkind.Local
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 20
	}
	if o.MaxElapsed <= 0 {
		o.MaxElapsed = 3 * time.Minute
	}
	if o.InitialBackoff <= 0 {
		o.InitialBackoff = time.Second
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 30 * time.Second
	}
	if o.MaxBackoff < o.InitialBackoff {
		o.MaxBackoff = o.InitialBackoff
	}
	if o.AttemptTimeout <= 0 {
		o.AttemptTimeout = 30 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Sleep == nil {
		o.Sleep = sleep
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// NewID returns a random webhook id.
func NewID() string {
	var b [16]byte
	crand.Read(b[:])
	return "wh_" + hex.EncodeToString(b[:])
}

// Post signs c with key and POSTs it to rawURL, retrying with exponential
// backoff and jitter while the server is away: a connection error, a 5xx or a
// 429 (whose Retry-After is honoured up to MaxBackoff). Any other 4xx stops at
// once. Every attempt carries the same webhook_id (filled in if c has none)
// and a fresh timestamp and signature.
//
// rawURL is http(s)://host:port/path, or unix:///path/to/socket to post to
// Path over that unix socket.
//
// Errors: ErrInvalidArgument for a bad URL; for a refusal, the class of the
// status (400 ErrInvalidArgument, 401 ErrUnauthenticated, 403
// ErrPermissionDenied, 404 ErrNotFound, 409 ErrConflict — the server already
// has this completion —, other 4xx ErrFailedPrecondition); ErrUnavailable
// when attempts or time ran out; ctx.Err() when ctx ended.
func Post(ctx context.Context, rawURL string, key []byte, c Completion, opts PostOptions) error {
	opts.defaults()
	target, client, err := newClient(rawURL, opts.Client, opts.Dial)
	if err != nil {
		return err
	}
	if opts.Client == nil {
		defer client.CloseIdleConnections()
	}
	c.EventType = EventWorkerCompleted
	if c.Source == "" {
		c.Source = opts.Source
	}
	if c.WebhookID == "" {
		c.WebhookID = NewID()
	}
	log := opts.Log.With("webhook_id", c.WebhookID)

	start := opts.Now()
	backoff := opts.InitialBackoff
	var last error
	for attempt := 1; ; attempt++ {
		retry, wait, err := postOnce(ctx, client, target, key, c, opts)
		if err == nil {
			return nil
		}
		if !retry {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("post webhook to %s: %w", redact(rawURL), ctx.Err())
		}
		last = err
		log.Debug("webhook attempt failed", "attempt", attempt, "err", err)
		if wait <= 0 {
			wait = backoff/2 + rand.N(backoff/2+1)
		}
		wait = min(wait, opts.MaxBackoff)
		backoff = min(backoff*2, opts.MaxBackoff)
		if attempt >= opts.MaxAttempts || opts.Now().Sub(start)+wait > opts.MaxElapsed {
			log.Info("webhook given up", "attempts", attempt, "elapsed", opts.Now().Sub(start).Round(time.Millisecond))
			return fmt.Errorf("post webhook to %s: gave up after %d attempts: %w: %w", redact(rawURL), attempt, last, errdefs.ErrUnavailable)
		}
		if err := opts.Sleep(ctx, wait); err != nil {
			return fmt.Errorf("post webhook to %s: %w", redact(rawURL), err)
		}
	}
}

// postOnce makes one attempt. retry says whether a later attempt may
// succeed, wait is the server's Retry-After if it gave one.
func postOnce(ctx context.Context, client *http.Client, target string, key []byte, c Completion, opts PostOptions) (retry bool, wait time.Duration, err error) {
	c.Timestamp = opts.Now().Unix()
	body, err := json.Marshal(c)
	if err != nil {
		return false, 0, fmt.Errorf("encode webhook: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, opts.AttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return false, 0, fmt.Errorf("build webhook request: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderSignature, Sign(key, body))
	req.Header.Set(HeaderSource, c.Source)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(c.Timestamp, 10))
	req.Header.Set(HeaderID, c.WebhookID)
	resp, err := client.Do(req)
	if err != nil {
		return true, 0, fmt.Errorf("send webhook: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // let the connection be reused
	if resp.StatusCode/100 == 2 {
		return false, 0, nil
	}
	err = fmt.Errorf("server answered %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	switch {
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return true, retryAfter(resp.Header.Get("Retry-After")), err
	case resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusUnprocessableEntity || resp.StatusCode == http.StatusRequestEntityTooLarge:
		return false, 0, fmt.Errorf("post webhook: %w: %w", err, errdefs.ErrInvalidArgument)
	case resp.StatusCode == http.StatusUnauthorized:
		return false, 0, fmt.Errorf("post webhook: %w: %w", err, errdefs.ErrUnauthenticated)
	case resp.StatusCode == http.StatusForbidden:
		return false, 0, fmt.Errorf("post webhook: %w: %w", err, errdefs.ErrPermissionDenied)
	case resp.StatusCode == http.StatusNotFound:
		return false, 0, fmt.Errorf("post webhook: %w: %w", err, errdefs.ErrNotFound)
	case resp.StatusCode == http.StatusConflict:
		return false, 0, fmt.Errorf("post webhook: %w: %w", err, errdefs.ErrConflict)
	default:
		return false, 0, fmt.Errorf("post webhook: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
}

func retryAfter(v string) time.Duration {
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	return 0
}

// newClient returns the request URL and the client for rawURL.
func newClient(rawURL string, client *http.Client, dial func(ctx context.Context, sock string) (net.Conn, error)) (string, *http.Client, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", nil, fmt.Errorf("parse webhook url: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	switch u.Scheme {
	case "unix":
		sock := u.Path
		if u.Host != "" || sock == "" {
			return "", nil, fmt.Errorf("parse webhook url %q: want unix:///absolute/path/to/socket: %w", rawURL, errdefs.ErrInvalidArgument)
		}
		if dial == nil {
			var d net.Dialer
			dial = func(ctx context.Context, sock string) (net.Conn, error) { return d.DialContext(ctx, "unix", sock) }
		}
		tr := &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx, sock) },
		}
		return "http://unix" + Path, &http.Client{Transport: tr}, nil
	case "http", "https":
		if u.Host == "" {
			return "", nil, fmt.Errorf("parse webhook url %q: no host: %w", redact(rawURL), errdefs.ErrInvalidArgument)
		}
		if client == nil {
			client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		}
		return rawURL, client, nil
	default:
		return "", nil, fmt.Errorf("parse webhook url %q: scheme %q is not http, https or unix: %w", redact(rawURL), u.Scheme, errdefs.ErrInvalidArgument)
	}
}

// redact drops user info and the query from a URL for error messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable url)"
	}
	u.User = nil
	u.RawQuery = ""
	return u.String()
}
