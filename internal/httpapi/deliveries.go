package httpapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/task"
)

// Token is one bearer token and the name recorded as the actor of what
// its caller does.
type Token struct {
	Name  string
	Value string
}

// Deliveries are the outbound notifications to the host (package notify).
type Deliveries interface {
	// List returns the deliveries in state ("" for all), newest first, at
	// most limit. A bad state is ErrInvalidArgument.
	List(ctx context.Context, state task.DeliveryState, limit int) ([]task.Delivery, error)
	// Retry queues a failed delivery again, for the actor in ctx. An
	// unknown id is ErrNotFound; a delivery that is not failed is
	// ErrConflict.
	Retry(ctx context.Context, id string) (task.Delivery, error)
}

// caller returns the name of the token the request carries: "default" for
// Options.Token, the token's name for Options.Tokens, and "local" when no
// token is configured (the server then listens on loopback only). The
// presented token is compared with every configured one, by their SHA-256
// so that neither the length nor the position of a match shows in the time.
func (s *Server) caller(r *http.Request) (string, error) {
	tokens := s.opts.Tokens
	if s.opts.Token != "" {
		tokens = append([]Token{{Name: "default", Value: s.opts.Token}}, tokens...)
	}
	if len(tokens) == 0 {
		return "local", nil
	}
	got, ok := bearer(r)
	sum := sha256.Sum256([]byte(got))
	name := ""
	for _, t := range tokens {
		want := sha256.Sum256([]byte(t.Value))
		if subtle.ConstantTimeCompare(sum[:], want[:]) == 1 && name == "" {
			name = t.Name
		}
	}
	if !ok || name == "" {
		return "", fmt.Errorf("missing or wrong bearer token: %w", errdefs.ErrUnauthenticated)
	}
	return name, nil
}

// bearer is r's bearer token, and whether it has one.
func bearer(r *http.Request) (string, bool) {
	return strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
}

// listDeliveries serves GET /api/deliveries?state=failed|pending|delivered&limit=N.
func (s *Server) listDeliveries(w http.ResponseWriter, r *http.Request) error {
	if s.opts.Deliveries == nil {
		return errNotifyOff
	}
	q := r.URL.Query()
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return errdefs.Field("limit", "must be a whole number from 1 to 1000")
		}
		limit = n
	}
	ds, err := s.opts.Deliveries.List(r.Context(), task.DeliveryState(q.Get("state")), limit)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"deliveries": ds})
	return nil
}

// retryDelivery serves POST /api/deliveries/{id}/retry.
func (s *Server) retryDelivery(w http.ResponseWriter, r *http.Request) error {
	if s.opts.Deliveries == nil {
		return errNotifyOff
	}
	d, err := s.opts.Deliveries.Retry(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, d)
	return nil
}

var errNotifyOff = fmt.Errorf("notifications are off; set notify.url and notify.secret_file: %w", errdefs.ErrNotImplemented)
