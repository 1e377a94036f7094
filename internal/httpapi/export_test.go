package httpapi

import (
	"log/slog"
	"net/http"
)

// RoutePatterns are the patterns a server registers, /mcp's among them.
func RoutePatterns() []string {
	s := newTestServer(&stub{}, Options{MCP: http.NotFoundHandler()}, slog.New(slog.DiscardHandler))
	return s.patterns
}

// NewTestHandler is the handler of a server with token and no backend.
func NewTestHandler(token string) http.Handler {
	return newTestServer(&stub{}, Options{Token: token}, slog.New(slog.DiscardHandler)).Handler()
}
