package httpapi

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// The UI answers its page paths without a token (the app asks for it) and
// never takes a route of the API's, /mcp, /healthz or /metrics.
func TestUIRoutesLeaveTheAPIAlone(t *testing.T) {
	url := MustServeOpts(t, Options{Token: "tok", MCP: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "mcp") })})
	for _, c := range []struct {
		method, path, token string
		code                int
		body                string
	}{
		{"GET", "/", "", 200, `src="/assets/boot.js"`},
		{"GET", "/tasks/task-01abc", "", 200, `src="/assets/boot.js"`},
		{"GET", "/assets/app.js", "", 200, "import "},
		{"POST", "/tasks", "", 405, ""},
		{"GET", "/nowhere", "", 404, `"error"`},
		{"GET", "/api/nowhere", "tok", 404, `"error"`},
		{"GET", "/api/tasks", "", 401, `"error"`},
		{"GET", "/metrics", "", 401, `"error"`},
		{"GET", "/healthz", "", 200, `"ok"`},
		{"POST", "/mcp", "", 401, `"error"`},
		{"POST", "/mcp", "tok", 200, "mcp"},
	} {
		code, body := call(t, c.method, url+c.path, c.token)
		if code != c.code || !strings.Contains(body, c.body) {
			t.Errorf("%s %s: %d %.80q, want %d with %q", c.method, c.path, code, body, c.code, c.body)
		}
	}
	// A foreign page cannot load the UI through a rebound name either.
	req, _ := http.NewRequest("GET", url+"/tasks", nil)
	req.Host = "evil.example:80"
	if code, _ := roundTrip(t, req); code != http.StatusForbidden {
		t.Errorf("UI with a foreign Host: %d, want 403", code)
	}
}
