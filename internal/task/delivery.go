package task

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/corral-dev/corral/internal/clip"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/ids"

	"github.com/corral-dev/corral/internal/eventstore"
)

// DeliveryState is where one outbound notification is.
//
//	pending → delivered
//	pending → failed (dead letter) → pending (retried by hand) → ...
type DeliveryState string

// The delivery states.
const (
	DeliveryPending   DeliveryState = "pending"
	DeliveryDelivered DeliveryState = "delivered"
	DeliveryDead      DeliveryState = "failed" // retries exhausted: the dead-letter list
)

// Valid reports whether s is a known delivery state.
func (s DeliveryState) Valid() bool {
	return s == DeliveryPending || s == DeliveryDelivered || s == DeliveryDead
}

// Delivery is one notification to the host as folded from its stream. Its
// ID is also the webhook-id header of every attempt, so a receiver can
// drop a repeat.
type Delivery struct {
	ID             string        `json:"delivery_id"`
	State          DeliveryState `json:"state"`
	EventType      string        `json:"event_type"`
	TaskID         string        `json:"task_id,omitempty"`
	SourceEventID  string        `json:"source_event_id"`
	Attempts       int           `json:"attempts"`
	LastStatusCode int           `json:"last_status_code,omitempty"`
	LastError      string        `json:"last_error,omitempty"`
	NextAttemptAt  *time.Time    `json:"next_attempt_at,omitempty"`
	CreatedAt      time.Time     `json:"created_at"`
	UpdatedAt      time.Time     `json:"updated_at"`
	DeliveredAt    *time.Time    `json:"delivered_at,omitempty"`
	FailedAt       *time.Time    `json:"failed_at,omitempty"`
	Version        int64         `json:"version"`
	// CorrelationID is the reported event's; LastEventID causes the next
	// event of the delivery.
	CorrelationID string `json:"correlation_id,omitempty"`
	LastEventID   string `json:"-"`

	// Payload is the body every attempt sends.
	Payload json.RawMessage `json:"-"`
	// RoundStart is how many attempts came before the current round of
	// retries (a dead letter retried by hand starts a new round).
	RoundStart int `json:"-"`
}

const deliveryPrefix = "dlv_"

// DeliveryIDFor returns the id of the delivery of the event with id
// eventID. It is a function of the event, so scheduling the same event
// twice (after a crash) finds the delivery already there.
func DeliveryIDFor(eventID string) string {
	if rest, ok := strings.CutPrefix(eventID, "evt_"); ok && ids.Valid(rest) {
		return deliveryPrefix + rest
	}
	sum := sha256.Sum256([]byte(eventID))
	return deliveryPrefix + hex.EncodeToString(sum[:13]) // 26 characters, like an id
}

// CheckDeliveryID returns an ErrInvalidArgument naming field if id is not a
// delivery id.
func CheckDeliveryID(id string) error {
	rest, ok := strings.CutPrefix(id, deliveryPrefix)
	if !ok || len(rest) != 26 || strings.Trim(rest, "0123456789abcdefghjkmnpqrstvwxyz") != "" {
		return errdefs.Field("delivery_id", fmt.Sprintf("%q is not a delivery id (want dlv_ and 26 lowercase letters or digits)", clip.String(id, 64)))
	}
	return nil
}

// DeliveryStreamID returns the stream that holds a delivery's events.
func DeliveryStreamID(id string) string { return "delivery/" + id }

// DeliveryIDFromStream returns the delivery id of a delivery stream, or ""
// for other streams.
func DeliveryIDFromStream(stream string) string {
	id, ok := strings.CutPrefix(stream, "delivery/")
	if !ok {
		return ""
	}
	return id
}

// Apply folds one event of the delivery's stream into d, as Task.Apply does
// for tasks.
func (d *Delivery) Apply(e eventstore.Event) error {
	typ, data, version, at := e.Type, e.Data, e.StreamVersion, e.RecordedAt
	if version != d.Version+1 {
		return fmt.Errorf("apply %s to delivery %s: version %d after %d", typ, d.ID, version, d.Version)
	}
	switch typ {
	case EventDeliveryScheduled:
		var p DeliveryScheduled
		if err := json.Unmarshal(data, &p); err != nil {
			return fmt.Errorf("decode %s: %w", typ, err)
		}
		d.State, d.EventType, d.TaskID, d.SourceEventID, d.Payload = DeliveryPending, p.EventType, p.TaskID, p.SourceEventID, p.Payload
		d.CreatedAt = at
		d.NextAttemptAt = &at
		d.CorrelationID = e.CorrelationID
	case EventDeliveryAttempted:
		var p DeliveryAttempted
		if err := json.Unmarshal(data, &p); err != nil {
			return fmt.Errorf("decode %s: %w", typ, err)
		}
		d.Attempts, d.LastStatusCode, d.LastError, d.NextAttemptAt = p.Attempt, p.StatusCode, p.Error, p.NextAttemptAt
	case EventDeliverySucceeded:
		d.State, d.DeliveredAt, d.NextAttemptAt = DeliveryDelivered, &at, nil
		d.Payload = nil // sent; the event keeps it
	case EventDeliveryFailed:
		d.State, d.FailedAt, d.NextAttemptAt = DeliveryDead, &at, nil
	case EventDeliveryRetried:
		if d.State != DeliveryDead {
			return fmt.Errorf("apply %s to delivery %s: it is %s, not failed", typ, d.ID, d.State)
		}
		d.State, d.FailedAt, d.NextAttemptAt, d.RoundStart = DeliveryPending, nil, &at, d.Attempts
	default:
		// Unknown event types (from a newer version) change nothing but the version.
	}
	d.Version = version
	d.UpdatedAt = at
	d.LastEventID = e.ID
	return nil
}
