package httpapi

import (
	"context"
	"fmt"
	"net/http"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/webhook"
)

// progressBackend is implemented by a Backend that records worker progress
// reports (the orchestrator does).
type progressBackend interface {
	WorkerProgress(ctx context.Context, m webhook.Signed) (int, error)
}

func (s *Server) workerProgress(w http.ResponseWriter, r *http.Request) error {
	pb, ok := s.b.(progressBackend)
	if !ok {
		return fmt.Errorf("worker progress: not recorded by this server: %w", errdefs.ErrNotImplemented)
	}
	body, err := s.readBody(r, s.opts.MaxProgressBytes)
	if err != nil {
		return err
	}
	n, err := pb.WorkerProgress(r.Context(), webhook.Received(r.Header, body))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "accepted", "events": n})
	return nil
}
