package httpapi

import (
	"context"
	"errors"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/orchestrator/orchestratortest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/service/servicetest"
)

// The orchestrator and library in process and the HTTP client over the
// API in front of them answer the task and library contracts alike (the
// sessions group runs in internal/e2e, where sessions have sandboxes).
func TestServiceContract(t *testing.T) {
	servicetest.Run(t, map[string]func(*testing.T) service.Set{
		"orchestrator": func(t *testing.T) service.Set {
			return orchestratortest.New(t, nil).Set()
		},
		"http": func(t *testing.T) service.Set {
			f := orchestratortest.New(t, nil)
			hs := serveAt(t, "127.0.0.1:0", orchBackend{f.Orch, f.Library}, Options{})
			return NewClient(hs.URL, "").Set()
		},
	})
}

// A server without sessions answers the session contract over HTTP with
// ErrNotImplemented, as the tools do in process.
func TestSessionsOff(t *testing.T) {
	f := orchestratortest.New(t, nil)
	hs := serveAt(t, "127.0.0.1:0", orchBackend{f.Orch, f.Library}, Options{})
	sess := NewClient(hs.URL, "").Sessions()
	ctx := context.Background()
	_, err := sess.Get(ctx, "sess-00000000000000000000000000")
	_, _, cerr := sess.Create(ctx, service.CreateSessionRequest{})
	_, lerr := sess.List(ctx)
	_, berr := sess.ExecBounded(ctx, service.SessionExecRequest{SessionID: "sess-00000000000000000000000000", Command: "true"}, 10, nil)
	for what, err := range map[string]error{"Get": err, "Create": cerr, "List": lerr, "ExecBounded": berr} {
		if !errors.Is(err, errdefs.ErrNotImplemented) {
			t.Errorf("%s where sessions are off: %v, want ErrNotImplemented", what, err)
		}
	}
}
