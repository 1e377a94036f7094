package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/corral-dev/corral/internal/errdefs"
)

// WarmGate is the runtime that keeps pods warm (kubernetes.Runtime's
// WarmStart): it answers a warm pod's poll, authenticated by the pod's
// own token, with its task's start once a task claims it, with nil when
// none has yet, and with an error wrapping errdefs.ErrNotFound for a pod
// that will get no task. WarmAnswered is told once a start is written and
// flushed to its pod.
type WarmGate interface {
	WarmStart(ctx context.Context, id, token string) ([]byte, error)
	WarmAnswered(id string)
}

// warmStart is a warm pod's long poll for its task: 200 with the start
// (the same start to every poll once claimed, until the task's sandbox
// is destroyed: a pod whose answer was cut asks again), 204 for none yet
// (the pod polls again), 404 for none ever.
func (s *Server) warmStart(w http.ResponseWriter, r *http.Request) error {
	token, ok := bearer(r)
	if s.opts.WarmGate == nil || !ok {
		return fmt.Errorf("no warm pod waits for a task here: %w", errdefs.ErrNotFound)
	}
	start, err := s.opts.WarmGate.WarmStart(r.Context(), r.PathValue("id"), token)
	if err != nil {
		return err
	}
	if start == nil {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	// Its length, not chunks: a flushed answer is then whole in the
	// socket (chunked, its last chunk waits for the handler's return), and
	// one cut short by the server's death is an error to the pod, which
	// asks again.
	w.Header().Set("Content-Length", strconv.Itoa(len(start)))
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(start); err == nil && http.NewResponseController(w).Flush() == nil {
		s.opts.WarmGate.WarmAnswered(r.PathValue("id"))
	}
	return nil
}
