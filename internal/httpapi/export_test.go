package httpapi

import (
	"log/slog"
	"net/http"
)

// RoutePatterns are the patterns a server registers, /mcp's among them,
// and those of its unix socket's handler.
func RoutePatterns() (api, socket []string) {
	s := newTestServer(&stub{}, Options{MCP: http.NotFoundHandler()}, slog.New(slog.DiscardHandler))
	for _, r := range s.socketRoutes() {
		socket = append(socket, r.pattern)
	}
	return s.patterns, socket
}

// NewTestHandler is the handler of a server with token and no backend.
func NewTestHandler(token string) http.Handler {
	return newTestServer(&stub{}, Options{Token: token}, slog.New(slog.DiscardHandler)).Handler()
}

// ErrorCodes are the codes error answers carry.
func ErrorCodes() []string {
	var out []string
	for _, c := range errorCodes {
		out = append(out, c)
	}
	return out
}
