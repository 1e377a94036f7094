package app

import (
	"context"

	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/session"
)

// replicaSessions is the session contract as the MCP tools and callers in
// the process meet it: workspace_exec for a session another live replica
// runs (holding its exec agent) goes to that replica's API, with this
// server's API token, which every replica of the cluster shares, as the
// HTTP API's exec route forwards a caller's own request.
type replicaSessions struct {
	*session.Manager
	self  string
	token string
}

func (r replicaSessions) ExecBounded(ctx context.Context, req service.SessionExecRequest, max int, onOutput func(stream string, data []byte)) (service.SessionExecResult, error) {
	url, ok := r.Forward(req.SessionID)
	if !ok {
		return r.Manager.ExecBounded(ctx, req, max, onOutput)
	}
	c := httpapi.NewClient(url, r.token)
	c.ForwardedBy = r.self
	return c.Sessions().ExecBounded(ctx, req, max, onOutput)
}
