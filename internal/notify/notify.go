// Package notify tells the host when a task ends (SPEC §6 "Outbound"): a
// POST of the task's result, signed with Standard Webhooks headers, to the
// configured URL, guaranteed by an outbox in the event store.
//
// It is the server-to-host direction; package webhook is the other one,
// worker to server, with its own keys and format.
//
// Every delivery is a stream of events (delivery/<id>): delivery_scheduled
// carries the body, each POST is a delivery_attempted, and the delivery
// ends with delivery_succeeded or, once its retries are spent,
// delivery_failed (the dead-letter list, which delivery_retried re-queues).
// The Dispatcher keeps no state of its own that matters: on start it folds
// the whole log, so the deliveries still pending, the attempts already
// made and the task endings not yet scheduled all come from events, and a
// server killed at any point resumes where the log says. A delivery's id
// is a function of the event it reports and is the webhook-id of every
// attempt, so a receiver that drops repeated ids sees each notification
// exactly once even when a crash between a POST and its record sends it
// twice.
package notify

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/clip"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/task"
)

// Options configure a Dispatcher.
type Options struct {
	// URL is where notifications go (http or https).
	URL string
	// Signer signs every attempt.
	Signer *Signer
	// Events are event types to notify besides worker_completed, which is
	// always sent. Delivery and notify events are never sent.
	Events []string
	// MaxAttempts is how many POSTs a delivery gets before it is a dead
	// letter. Default 15: with the default backoff, about three hours.
	MaxAttempts int
	// InitialBackoff is the wait after the first failed attempt; each
	// further wait doubles up to MaxBackoff, and each is drawn from [d/2, d)
	// so that deliveries that failed together do not retry in step.
	// Defaults 1s and 1h.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// Timeout bounds one POST, connection included. Default 10s.
	Timeout time.Duration
	// Concurrency bounds the POSTs in flight. Default 4.
	Concurrency int
	// Client sends the POSTs. Default: a client of its own that does not
	// follow redirects (a 3xx is a failed attempt).
	Client *http.Client
	// Now is the clock, and Jitter returns a number in [0, 1) for the
	// backoff; both for tests.
	Now    func() time.Time
	Jitter func() float64
	// Delivered, when set, is called once a POST was answered 2xx, before
	// its success is recorded: the fault tests' kill point
	// (sandbox.CrashDelivered).
	Delivered func()
}

func (o *Options) defaults() {
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 15
	}
	if o.InitialBackoff <= 0 {
		o.InitialBackoff = time.Second
	}
	if o.MaxBackoff < o.InitialBackoff {
		o.MaxBackoff = max(time.Hour, o.InitialBackoff)
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 4
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Jitter == nil {
		o.Jitter = rand.Float64
	}
}

// Backoff returns the wait after the n-th failed attempt of a round (n ≥ 1):
// initial doubled n-1 times, at most ceiling, scaled by jitter (in [0, 1))
// into [d/2, d).
func Backoff(initial, ceiling time.Duration, n int, jitter float64) time.Duration {
	d := initial
	for i := 1; i < n && d < ceiling; i++ {
		d *= 2
	}
	d = min(d, ceiling)
	return d/2 + time.Duration(jitter*float64(d/2))
}

// Dispatcher delivers notifications. List and Retry are safe for
// concurrent use with Run, Send and each other.
//
// Lifecycle: New → Run on every server (it records the types notified,
// folds the log, then follows it: the deliveries and their state, which
// List answers, and the notified events no delivery has yet) → Send on
// the one that sends, the cluster's leader (it schedules a delivery for
// each event owed, and sends what is due, until its context ends; another
// Send may follow, on this server or another, and picks up from the
// log). List and Retry wait for Run's first fold.
type Dispatcher struct {
	store eventstore.Store
	opts  Options
	log   *slog.Logger
	types []string // worker_completed and opts.Events, sorted

	recovered chan struct{} // closed when Run has folded the log
	wake      chan struct{} // a delivery became due or a slot freed
	owedWake  chan struct{} // an event became owed

	mu         sync.Mutex
	active     map[string]bool // event types notified at this point of the log
	deliveries map[string]*task.Delivery
	pending    map[string]*task.Delivery   // the pending subset
	owed       map[string]eventstore.Event // notified events with no delivery yet, by event id
	inflight   map[string]bool
	// states and failedAttempts sum the deliveries (tally) as they change,
	// so that /metrics, read every few seconds, does not walk them all.
	states         map[task.DeliveryState]int
	failedAttempts int
}

// Stats are the deliveries as the log says, for /metrics: every server
// that runs a Dispatcher folds the same ones.
type Stats struct {
	// ByState counts the deliveries in each state (none: absent).
	ByState map[task.DeliveryState]int
	// FailedAttempts counts the POSTs the host did not accept. It only
	// grows: an attempt, once recorded, stays failed.
	FailedAttempts int
}

// New returns a Dispatcher that sends to opts.URL.
func New(store eventstore.Store, opts Options, log *slog.Logger) (*Dispatcher, error) {
	opts.defaults()
	if u, err := url.Parse(opts.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("notification url must be an http or https URL: %w", errdefs.ErrInvalidArgument)
	}
	if opts.Signer == nil {
		return nil, fmt.Errorf("notifications need a signing secret: %w", errdefs.ErrInvalidArgument)
	}
	types := []string{task.EventCompleted, task.EventWorkspaceTaskCompleted, task.EventWorkspaceTaskFailed}
	for _, e := range opts.Events {
		if e = strings.TrimSpace(e); e != "" && !internal(e) {
			types = append(types, e)
		}
	}
	slices.Sort(types)
	types = slices.Compact(types)
	return &Dispatcher{
		store: store, opts: opts, log: log, types: types,
		recovered:  make(chan struct{}),
		wake:       make(chan struct{}, 1),
		owedWake:   make(chan struct{}, 1),
		active:     map[string]bool{},
		deliveries: map[string]*task.Delivery{},
		pending:    map[string]*task.Delivery{},
		owed:       map[string]eventstore.Event{},
		inflight:   map[string]bool{},
		states:     map[task.DeliveryState]int{},
	}, nil
}

// internal reports whether an event type is the notifier's own, which it
// never notifies (a delivery of a delivery event would never end).
func internal(typ string) bool {
	return strings.HasPrefix(typ, "delivery_") || strings.HasPrefix(typ, "notify_")
}

// Disable records that notifications are off, if the log says they are on,
// so that task endings until they are turned on again are not owed to the
// host. Deliveries already scheduled stay pending and resume when a
// Dispatcher runs again.
func Disable(ctx context.Context, store eventstore.Store) error {
	evs, err := store.ReadStream(ctx, task.NotifyStream, 0)
	if err != nil {
		return fmt.Errorf("read notify stream: %w", err)
	}
	if len(evs) == 0 || evs[len(evs)-1].Type != task.EventNotifyEnabled {
		return nil
	}
	_, err = store.Append(ctx, task.NotifyStream, int64(len(evs)), eventstore.Proposed{
		Type: task.EventNotifyDisabled, SchemaVersion: task.SchemaVersion, Data: json.RawMessage("{}"), Actor: Actor,
	})
	if err != nil && !errors.Is(err, eventstore.ErrVersionConflict) {
		return fmt.Errorf("record notifications off: %w", err)
	}
	return nil
}

// Actor is the actor of the events the dispatcher records.
const Actor = "corral/notify"

// Run records the types notified, folds the log, then follows it as it
// is committed, until ctx is done: the deliveries and their state, and the
// events owed to the host.
// It returns nil then, or an error if the store fails.
func (d *Dispatcher) Run(ctx context.Context) error {
	// Before the fold: the events after the record are owed. (Servers of
	// one cluster share one configuration: the first records it.)
	if err := d.markEnabled(ctx); err != nil {
		return ignoreDone(ctx, err)
	}
	cursor, err := d.recover(ctx)
	if err != nil {
		return ignoreDone(ctx, err)
	}
	close(d.recovered)
	sub := eventstore.Subscribe(d.store, cursor)
	for {
		e, err := sub.Next(ctx)
		if err != nil {
			return ignoreDone(ctx, fmt.Errorf("follow events: %w", err))
		}
		d.observe(e)
	}
}

// Send schedules a delivery for every event owed as Run finds them, and
// sends the deliveries due, until ctx is done.
// One server of a cluster sends at a time (its leader): a delivery cut by
// its end is sent again by the next, with the same webhook-id.
func (d *Dispatcher) Send(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := d.opts.Client
	if client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		defer tr.CloseIdleConnections()
		client = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if err := d.waitRecovered(ctx); err != nil {
		return nil // ctx ended first
	}
	d.log.Info("notifications on", "pending", d.count(task.DeliveryPending), "failed", d.count(task.DeliveryDead), "types", d.types)

	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		d.send(ctx, client, &wg)
	}()
	for {
		if err := d.scheduleOwed(ctx); err != nil {
			return ignoreDone(ctx, err)
		}
		select {
		case <-d.owedWake:
		case <-ctx.Done():
			return nil
		}
	}
}

// scheduleOwed schedules a delivery for each event owed, oldest first.
func (d *Dispatcher) scheduleOwed(ctx context.Context) error {
	d.mu.Lock()
	owed := slices.SortedFunc(maps.Values(d.owed), func(a, b eventstore.Event) int { return cmp.Compare(a.Position, b.Position) })
	d.mu.Unlock()
	for _, e := range owed {
		if err := d.schedule(ctx, e); err != nil {
			return err
		}
		d.mu.Lock()
		delete(d.owed, e.ID)
		d.mu.Unlock()
	}
	return nil
}

func ignoreDone(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// markEnabled records that notifications of d.types are on from here, unless
// the log already says exactly that.
func (d *Dispatcher) markEnabled(ctx context.Context) error {
	evs, err := d.store.ReadStream(ctx, task.NotifyStream, 0)
	if err != nil {
		return fmt.Errorf("read notify stream: %w", err)
	}
	if n := len(evs); n > 0 && evs[n-1].Type == task.EventNotifyEnabled {
		var p task.NotifyEnabled
		if json.Unmarshal(evs[n-1].Data, &p) == nil && slices.Equal(p.Events, d.types) {
			return nil
		}
	}
	data, _ := json.Marshal(task.NotifyEnabled{Events: d.types})
	_, err = d.store.Append(ctx, task.NotifyStream, int64(len(evs)), eventstore.Proposed{
		Type: task.EventNotifyEnabled, SchemaVersion: task.SchemaVersion, Data: data, Actor: Actor,
	})
	if err != nil {
		return fmt.Errorf("record notifications on: %w", err)
	}
	return nil
}

// recover folds the whole log: the deliveries and their state, and the
// notified events that have no delivery yet. It returns the position to
// follow from.
func (d *Dispatcher) recover(ctx context.Context) (int64, error) {
	var after int64
	for {
		evs, err := d.store.ReadAll(ctx, after, 1024)
		if err != nil {
			return 0, fmt.Errorf("read events: %w", err)
		}
		if len(evs) == 0 {
			return after, nil
		}
		for _, e := range evs {
			d.observe(e)
		}
		after = evs[len(evs)-1].Position
	}
}

// observe applies one event of the log, and keeps it owed if it is one
// the host must be told about (Send schedules it).
func (d *Dispatcher) observe(e eventstore.Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e.StreamID == task.NotifyStream {
		switch e.Type {
		case task.EventNotifyEnabled:
			var p task.NotifyEnabled
			if err := json.Unmarshal(e.Data, &p); err != nil {
				d.log.Error("cannot read notify event", logkey.EventID, e.ID, logkey.Error, err)
				return
			}
			d.active = map[string]bool{}
			for _, t := range p.Events {
				d.active[t] = true
			}
		case task.EventNotifyDisabled:
			d.active = map[string]bool{}
		}
		return
	}
	if id := task.DeliveryIDFromStream(e.StreamID); id != "" {
		d.applyLocked(id, e)
		return
	}
	if d.active[e.Type] && !internal(e.Type) && d.deliveries[task.DeliveryIDFor(e.ID)] == nil {
		d.owed[e.ID] = e
		select {
		case d.owedWake <- struct{}{}:
		default:
		}
	}
}

// applyLocked folds a delivery event into the dispatcher's view, once.
func (d *Dispatcher) applyLocked(id string, e eventstore.Event) {
	dl := d.deliveries[id]
	if dl == nil {
		dl = &task.Delivery{ID: id}
	}
	if e.StreamVersion <= dl.Version {
		return // already applied: Run's own append, seen again in the log
	}
	next := *dl
	if err := next.Apply(e); err != nil {
		d.log.Error("cannot apply delivery event", "delivery_id", id, logkey.EventID, e.ID, logkey.Error, err)
		return
	}
	d.tally(d.deliveries[id], -1)
	d.deliveries[id] = &next
	d.tally(&next, 1)
	delete(d.owed, next.SourceEventID) // scheduled, here or by another server
	if next.State == task.DeliveryPending {
		d.pending[id] = &next
	} else {
		delete(d.pending, id)
	}
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// tally adds dl's share to the sums Stats reads (sign 1), or takes it away
// (sign -1) before dl is replaced. Under d.mu.
func (d *Dispatcher) tally(dl *task.Delivery, sign int) {
	if dl == nil {
		return
	}
	if d.states[dl.State] += sign; d.states[dl.State] == 0 {
		delete(d.states, dl.State)
	}
	failed := dl.Attempts
	if dl.Attempts > 0 && dl.LastError == "" {
		// The last attempt was accepted; every one before it failed. Told
		// by the attempt's error, not by the state: a server following the
		// log folds delivery_succeeded after the attempt, and a counter
		// must not go up and back down in between.
		failed--
	}
	d.failedAttempts += sign * failed
}

func (d *Dispatcher) apply(evs []eventstore.Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range evs {
		d.applyLocked(task.DeliveryIDFromStream(e.StreamID), e)
	}
}

// deliveryCause returns ctx carrying the Cause of dl's next events: the
// reported event's correlation id, and the request ctx names (a retry by
// hand) or else dl's latest event as causation.
func deliveryCause(ctx context.Context, dl task.Delivery) context.Context {
	c := eventstore.CauseOf(ctx)
	c.CorrelationID = dl.CorrelationID
	if c.CausationID == "" {
		c.CausationID = dl.LastEventID
	}
	return eventstore.WithCause(ctx, c)
}

// schedule records the delivery of event e, with the body every attempt
// will send. Scheduling an event twice finds the first delivery.
func (d *Dispatcher) schedule(ctx context.Context, e eventstore.Event) error {
	body, taskID, err := d.body(ctx, e)
	if err != nil {
		return err
	}
	data, err := json.Marshal(task.DeliveryScheduled{SourceEventID: e.ID, EventType: e.Type, TaskID: taskID, Payload: body})
	if err != nil {
		return fmt.Errorf("encode delivery of %s: %w", e.ID, err)
	}
	id := task.DeliveryIDFor(e.ID)
	stream := task.DeliveryStreamID(id)
	evs, err := d.store.Append(ctx, stream, 0, eventstore.Proposed{
		Type: task.EventDeliveryScheduled, SchemaVersion: task.SchemaVersion, Data: data,
		Actor: Actor, CausationID: e.ID, CorrelationID: e.CorrelationID,
	})
	if errors.Is(err, eventstore.ErrVersionConflict) {
		evs, err = d.store.ReadStream(ctx, stream, 0)
	}
	if err != nil {
		return fmt.Errorf("schedule delivery of %s: %w", e.ID, err)
	}
	d.apply(evs)
	return nil
}

// body builds the notification of event e.
func (d *Dispatcher) body(ctx context.Context, e eventstore.Event) (json.RawMessage, string, error) {
	var t task.Task
	if id := task.IDFromStream(e.StreamID); id != "" {
		evs, err := d.store.ReadStream(ctx, e.StreamID, 0)
		if err != nil {
			return nil, "", fmt.Errorf("read task %s: %w", id, err)
		}
		t.ID = id
		for _, te := range evs {
			if te.StreamVersion > e.StreamVersion {
				break
			}
			if err := t.Apply(te); err != nil {
				return nil, "", fmt.Errorf("fold task %s: %w", id, err)
			}
		}
	}
	var v any
	if e.Type == task.EventCompleted && t.ID != "" {
		var p task.Completed
		json.Unmarshal(e.Data, &p) // Apply above decoded it already
		v = completionBody(t, e, p.Reason)
	} else {
		v = Event{
			EventType: e.Type, EventID: e.ID, CorrelationID: e.CorrelationID, CausationID: e.CausationID,
			StreamID: e.StreamID, TaskID: t.ID, Status: t.Status,
			ConversationID: t.ConversationID, InterfaceType: t.InterfaceType, UserName: t.UserName,
			OccurredAt: e.RecordedAt.UTC(), Data: e.Data,
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, "", fmt.Errorf("encode notification of %s: %w", e.ID, err)
	}
	return b, t.ID, nil
}

// send starts the due attempts, at most Concurrency at once, until ctx is
// done.
func (d *Dispatcher) send(ctx context.Context, client *http.Client, wg *sync.WaitGroup) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := d.opts.Now()
		var due []task.Delivery
		var next time.Time
		d.mu.Lock()
		for id, dl := range d.pending {
			if d.inflight[id] {
				continue
			}
			c := *dl
			if c.NextAttemptAt == nil {
				c.NextAttemptAt = &now
			}
			at := *c.NextAttemptAt
			if !at.After(now) {
				due = append(due, c)
			} else if next.IsZero() || at.Before(next) {
				next = at
			}
		}
		// Oldest first, so a backlog drains in order.
		slices.SortFunc(due, func(a, b task.Delivery) int {
			return cmp.Or(a.NextAttemptAt.Compare(*b.NextAttemptAt), strings.Compare(a.ID, b.ID))
		})
		free := d.opts.Concurrency - len(d.inflight)
		if len(due) > free {
			due = due[:max(free, 0)]
		}
		for _, dl := range due {
			d.inflight[dl.ID] = true
		}
		d.mu.Unlock()
		for _, dl := range due {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d.attempt(ctx, client, dl)
				d.mu.Lock()
				delete(d.inflight, dl.ID)
				d.mu.Unlock()
				select {
				case d.wake <- struct{}{}:
				default:
				}
			}()
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(next.Sub(now), 0)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		case <-timer.C:
		}
	}
}

// attempt POSTs one delivery once and records the outcome.
func (d *Dispatcher) attempt(ctx context.Context, client *http.Client, dl task.Delivery) {
	n := dl.Attempts + 1
	start := d.opts.Now()
	code, err := d.post(ctx, client, dl.ID, dl.Payload)
	if ctx.Err() != nil {
		return // shutting down: not an attempt of the delivery's; the next start makes it again
	}
	now := d.opts.Now()
	a := task.DeliveryAttempted{Attempt: n, StatusCode: code, DurationMS: float64(now.Sub(start).Microseconds()) / 1000}
	log := d.log.With("delivery_id", dl.ID, logkey.TaskID, dl.TaskID, "attempt", n)
	var evs []eventstore.Proposed
	switch {
	case err == nil:
		if d.opts.Delivered != nil {
			d.opts.Delivered()
		}
		evs = append(evs, d.event(task.EventDeliveryAttempted, a), d.event(task.EventDeliverySucceeded, nil))
		log.Debug("notification delivered", "status_code", code)
	case n-dl.RoundStart >= d.opts.MaxAttempts:
		a.Error = err.Error()
		evs = append(evs, d.event(task.EventDeliveryAttempted, a),
			d.event(task.EventDeliveryFailed, task.DeliveryFailed{Reason: fmt.Sprintf("%d attempts failed; the last: %s", n-dl.RoundStart, a.Error)}))
		log.Info("notification given up", "status_code", code, logkey.Error, err)
	default:
		a.Error = err.Error()
		at := now.Add(Backoff(d.opts.InitialBackoff, d.opts.MaxBackoff, n-dl.RoundStart, d.opts.Jitter()))
		a.NextAttemptAt = &at
		evs = append(evs, d.event(task.EventDeliveryAttempted, a))
		log.Debug("notification attempt failed", "status_code", code, logkey.Error, err, "next_attempt_at", at)
	}
	got, aerr := d.store.Append(deliveryCause(ctx, dl), task.DeliveryStreamID(dl.ID), dl.Version, evs...)
	if aerr != nil {
		if ctx.Err() == nil {
			log.Error("cannot record notification attempt", logkey.Error, aerr)
			d.reload(ctx, dl.ID)
		}
		return
	}
	d.apply(got)
}

// reload replaces a delivery's view with its stream, after an append that
// failed; if even that fails the delivery waits InitialBackoff so a broken
// store is not hammered.
func (d *Dispatcher) reload(ctx context.Context, id string) {
	evs, err := d.store.ReadStream(ctx, task.DeliveryStreamID(id), 0)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil || len(evs) == 0 {
		if dl := d.pending[id]; dl != nil {
			at := d.opts.Now().Add(d.opts.InitialBackoff)
			dl.NextAttemptAt = &at
		}
		return
	}
	d.tally(d.deliveries[id], -1)
	delete(d.deliveries, id)
	delete(d.pending, id)
	for _, e := range evs {
		d.applyLocked(id, e)
	}
}

func (d *Dispatcher) event(typ string, payload any) eventstore.Proposed {
	data := json.RawMessage("{}")
	if payload != nil {
		data, _ = json.Marshal(payload) // plain structs
	}
	return eventstore.Proposed{Type: typ, SchemaVersion: task.SchemaVersion, Data: data, Actor: Actor}
}

// post sends one signed attempt and returns the status code and, for
// anything but a 2xx, why it failed. The error text never holds the URL,
// which may carry a credential.
func (d *Dispatcher) post(ctx context.Context, client *http.Client, id string, body []byte) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, d.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.opts.URL, bytes.NewReader(body))
	if err != nil {
		return 0, errors.New("bad notification url")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "corral-notify/1")
	d.opts.Signer.SetHeaders(req.Header, id, d.opts.Now(), body)
	resp, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return 0, fmt.Errorf("no answer within %s", d.opts.Timeout)
		}
		return 0, errors.New(clip.String(err.Error(), 200))
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("answered %s", resp.Status)
	}
	return resp.StatusCode, nil
}

// List returns the deliveries in state (all of them for ""), newest first,
// at most limit (all for limit ≤ 0). It waits for Run to fold the log.
func (d *Dispatcher) List(ctx context.Context, state task.DeliveryState, limit int) ([]task.Delivery, error) {
	if state != "" && !state.Valid() {
		return nil, errdefs.Field("state", fmt.Sprintf("must be pending, delivered or failed, got %q", clip.String(string(state), 32)))
	}
	if err := d.waitRecovered(ctx); err != nil {
		return nil, err
	}
	d.mu.Lock()
	out := []task.Delivery{}
	for _, dl := range d.deliveries {
		if state == "" || dl.State == state {
			out = append(out, *dl)
		}
	}
	d.mu.Unlock()
	slices.SortFunc(out, func(a, b task.Delivery) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), strings.Compare(b.ID, a.ID))
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Retry queues a dead letter again for a new round of attempts, recording
// actor as who asked. An unknown id is ErrNotFound; a delivery that is not
// failed is ErrConflict.
func (d *Dispatcher) Retry(ctx context.Context, id, actor string) (task.Delivery, error) {
	if err := task.CheckDeliveryID(id); err != nil {
		return task.Delivery{}, err
	}
	if err := d.waitRecovered(ctx); err != nil {
		return task.Delivery{}, err
	}
	d.mu.Lock()
	dl, ok := d.deliveries[id]
	var cur task.Delivery
	if ok {
		cur = *dl
	}
	d.mu.Unlock()
	if !ok {
		return task.Delivery{}, fmt.Errorf("no delivery %s: %w", id, errdefs.ErrNotFound)
	}
	if cur.State != task.DeliveryDead {
		return task.Delivery{}, fmt.Errorf("delivery %s is %s; only a failed delivery can be retried: %w", id, cur.State, errdefs.ErrConflict)
	}
	ev := d.event(task.EventDeliveryRetried, task.DeliveryRetried{By: actor})
	ev.Actor = actor
	evs, err := d.store.Append(deliveryCause(ctx, cur), task.DeliveryStreamID(id), cur.Version, ev)
	if errors.Is(err, eventstore.ErrVersionConflict) {
		return task.Delivery{}, fmt.Errorf("delivery %s changed meanwhile; list it again: %w", id, errdefs.ErrConflict)
	}
	if err != nil {
		return task.Delivery{}, fmt.Errorf("retry delivery %s: %w", id, err)
	}
	d.apply(evs)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.log.Info("notification retried", "delivery_id", id, "by", actor)
	return *d.deliveries[id], nil
}

func (d *Dispatcher) waitRecovered(ctx context.Context) error {
	select {
	case <-d.recovered:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("notifications are still starting: %w", errdefs.ErrUnavailable)
	}
}

func (d *Dispatcher) count(s task.DeliveryState) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.states[s]
}

// Stats returns the deliveries folded so far: before Run's first fold
// ends, part of them.
func (d *Dispatcher) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return Stats{ByState: maps.Clone(d.states), FailedAttempts: d.failedAttempts}
}
