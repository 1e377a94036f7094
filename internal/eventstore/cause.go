package eventstore

import (
	"context"

	"github.com/corral-dev/corral/internal/ids"
)

// Cause is what every event appended under a context carries besides its
// own data (SPEC §3): the correlation id shared by everything one request or
// task brings about, and the id of the event or request that caused it.
type Cause struct {
	CorrelationID string
	CausationID   string
}

type causeKey struct{}

// WithCause returns ctx carrying c; Append stamps it on the events it
// appends under ctx.
func WithCause(ctx context.Context, c Cause) context.Context {
	return context.WithValue(ctx, causeKey{}, c)
}

// CauseOf returns the Cause ctx carries, or the zero Cause.
func CauseOf(ctx context.Context) Cause {
	c, _ := ctx.Value(causeKey{}).(Cause)
	return c
}

// NewCorrelationID returns a new correlation id, for a request or a task
// that comes with none.
func NewCorrelationID() string { return "corr_" + ids.New() }

// Stamp fills what e leaves empty from c: the correlation id, and the
// causation id, which then moves on to e so that the next event of the same
// append reads as caused by e. Stores call it on each event of an Append,
// in order, once e has its id.
func (c *Cause) Stamp(e *Event) {
	if e.CorrelationID == "" {
		e.CorrelationID = c.CorrelationID
	}
	if e.CausationID == "" {
		e.CausationID = c.CausationID
	}
	c.CausationID = e.ID
}

// Begin returns ctx carrying a new correlation id and what as its cause:
// for work that no request or event brought about, such as a start-up
// reconciliation ("start") or a retention pass ("retention").
func Begin(ctx context.Context, what string) context.Context {
	return WithCause(ctx, Cause{CorrelationID: NewCorrelationID(), CausationID: what})
}
