package httpapi

import (
	"context"
	"fmt"
	"net/http"

	"github.com/corral-dev/corral/internal/errdefs"
)

// progressBackend is implemented by a Backend that records worker progress
// reports (the orchestrator does).
type progressBackend interface {
	WorkerProgress(ctx context.Context, h http.Header, body []byte) (int, error)
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
	n, err := pb.WorkerProgress(r.Context(), r.Header, body)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "accepted", "events": n})
	return nil
}
