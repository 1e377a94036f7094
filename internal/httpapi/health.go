package httpapi

import (
	"context"
	"net/http"
	"time"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// Check is one finding of corral doctor: what was checked, whether it
// works, and if not, how to fix it.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
	// Required checks must pass for the default configuration to run tasks.
	Required bool `json:"required"`
}

// Health is GET /api/health's answer: what the web UI's health page shows.
type Health struct {
	Version    string              `json:"version"`
	Ready      bool                `json:"ready"`
	Tasks      map[task.Status]int `json:"tasks"`
	QueueDepth int                 `json:"queue_depth"`
	Running    int                 `json:"running"`
	// Sessions counts the sessions running.
	Sessions int `json:"sessions"`
	// Checks are corral doctor's findings, as of CheckedAt.
	Checks    []Check   `json:"checks"`
	CheckedAt time.Time `json:"checked_at"`
}

// health serves GET /api/health: the server's state, its queue and the
// doctor's findings (Options.Doctor, which may answer from a cache).
func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	st := s.b.Stats()
	h := Health{Version: s.opts.Version, Ready: s.ready(), Tasks: st.ByStatus, QueueDepth: st.QueueDepth, Running: st.Running, Checks: []Check{}}
	if h.Tasks == nil {
		h.Tasks = map[task.Status]int{}
	}
	if s.svc.Sessions != nil {
		list, err := s.svc.Sessions.List(r.Context())
		if err != nil {
			return err
		}
		for _, sess := range list {
			if sess.Status == service.SessionRunning {
				h.Sessions++
			}
		}
	}
	if s.opts.Doctor != nil {
		h.Checks, h.CheckedAt = s.opts.Doctor(r.Context())
	}
	writeJSON(w, http.StatusOK, h)
	return nil
}

// ready reports whether the server has reconciled what it found at start.
func (s *Server) ready() bool {
	if s.opts.Ready == nil {
		return true
	}
	select {
	case <-s.opts.Ready:
		return true
	default:
		return false
	}
}

// Health returns the server's state and its doctor's findings (GET
// /api/health).
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	err := c.call(ctx, http.MethodGet, "/api/health", nil, &h)
	return h, err
}
