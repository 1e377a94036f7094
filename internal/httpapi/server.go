// Package httpapi is Corral's HTTP transport: the JSON API of SPEC §7
// (tasks, events over SSE, workspace files, tools, the worker webhook,
// health and metrics) with bearer-token auth, and Client, which implements
// the service contracts over that API for the CLI. Handlers only parse
// input, call the service.Set they were given and map errors, in one
// function (writeError). openapi.json describes every route, and tests
// hold it to the routes and their answers.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/ids"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/tools"
	"github.com/corral-dev/corral/internal/webhook"
	"github.com/corral-dev/corral/internal/webui"
)

// Backend is what the server needs beyond its service.Set: the
// server-only operations that no client calls through the contracts.
type Backend interface {
	WorkerComplete(ctx context.Context, m webhook.Signed) (string, error)
	OpenOutput(ctx context.Context, id, path string) (*os.File, fs.FileInfo, error)
	// OpenShared opens a regular file of shared/ for reading, never
	// through a symbolic link.
	OpenShared(ctx context.Context, path string) (*os.File, fs.FileInfo, error)
	Stats() Stats
}

// Stats are the figures /metrics exports.
type Stats struct {
	ByStatus   map[task.Status]int
	Durations  Histogram // of ended tasks' run times, in seconds
	QueueDepth int
	Running    int
	// Agents are the tokens and cost agents reported, by agent name.
	Agents map[string]AgentUsage
	// Warm are the runtimes' pools of warm sandboxes.
	Warm []WarmPool
	// Commits are the event log's commits (one fsync each), in seconds,
	// and EventsCommitted the events they held.
	Commits         Histogram
	EventsCommitted uint64
	// Deliveries are the notifications to the host; nil when
	// notifications are off.
	Deliveries *DeliveryStats
}

// DeliveryStats are the notifications to the host by state, and the POSTs
// of them the host did not accept (notify.Stats).
type DeliveryStats struct {
	ByState        map[task.DeliveryState]int
	FailedAttempts int
}

// WarmPool is one pool of warm sandboxes (sandbox.WarmStats).
type WarmPool struct {
	Runtime   string `json:"runtime"`
	Shape     string `json:"shape"`
	Ready     int    `json:"ready"`
	Target    int    `json:"target"`
	Claims    uint64 `json:"claims"`
	Misses    uint64 `json:"misses"`
	Started   uint64 `json:"started"`
	Failed    uint64 `json:"failed"`
	Destroyed uint64 `json:"destroyed"`
}

// Histogram is a histogram of observed values: Within[i] of them are at
// most Bounds[i], Count in all, summing to Sum.
type Histogram struct {
	Bounds []float64
	Within []uint64
	Count  uint64
	Sum    float64
}

// AgentUsage sums what one agent's ended tasks reported.
type AgentUsage struct {
	InputTokens, OutputTokens int64
	CostUSD                   float64
}

// Options configure a Server.
type Options struct {
	// Token is the bearer token every /api request needs, except the worker
	// webhook (which is signed). Empty means no auth: the caller must only
	// listen on loopback.
	Token string
	// MaxRequestBytes bounds a JSON request body.
	MaxRequestBytes int64
	// MaxWebhookBytes bounds a completion webhook body.
	MaxWebhookBytes int64
	// MaxProgressBytes bounds a worker's progress report body (default
	// 64 KiB; the worker's largest is about half that).
	MaxProgressBytes int64
	// MaxUploadRequestBytes bounds a whole attachment upload request (each
	// file is bounded by the attachment store); 0 means no limit.
	MaxUploadRequestBytes int64
	// MaxUploadFiles bounds the files of one upload request (default 100).
	MaxUploadFiles int
	// Tokens are further bearer tokens, each named; the caller's name is
	// the actor of what it does. Token, if set, is named "default".
	Tokens []Token
	// SessionGate checks sessions' tokens and takes their exec agents'
	// connections; required when the Set has Sessions.
	SessionGate service.SessionGate
	// WarmGate answers warm pods' polls for their task; nil: no warm
	// pods.
	WarmGate WarmGate
	// Deliveries serves /api/deliveries; nil when notifications are off.
	Deliveries Deliveries
	// MCP, when set, is served at /mcp behind the same bearer auth as the
	// API (the MCP streamable HTTP transport; app passes it in so that this
	// package does not depend on the MCP SDK).
	MCP http.Handler
	// Listen is the configured listen address. Every route but the
	// worker's answers only a Host naming the server: localhost, a loopback
	// address or the address the request came in on, with the port it came
	// in on; the host of Listen, if it is a name; or one of AllowedHosts
	// (host, or host:port).
	Listen       string
	AllowedHosts []string
	// AllowedOrigins are the Origins (scheme://host[:port]) besides the
	// server's own whose pages' requests are answered; any other Origin is
	// refused.
	AllowedOrigins []string
	// BodyStall closes a connection whose request body sends nothing for
	// this long; default DefaultBodyStall.
	BodyStall time.Duration
	// SSEHeartbeat is how long an event stream may stay quiet before the
	// server sends a comment line; default DefaultSSEHeartbeat.
	SSEHeartbeat time.Duration
	// ToolLimits are the server limits the tool schemas state.
	ToolLimits tools.Limits
	// Ready is closed once the server has reconciled what it found at
	// start-up; until then /healthz answers 503 "starting". Nil: ready.
	Ready <-chan struct{}
	// Version is the server's version, which /api/health and
	// corral_build_info report.
	Version string
	// Revision is the commit the server was built from, which
	// corral_build_info reports; empty when unknown.
	Revision string
	// Replica is this server's id in its cluster (cluster.Replica), which
	// /healthz names: behind a load balancer, which replica answered.
	Replica string
	// Holding reports whether this server holds its store (its lease is
	// renewed): while it does not, /healthz answers 503 "store
	// unreachable", so a load balancer sends its clients to another
	// replica. Nil: always.
	Holding func() bool
	// Doctor returns corral doctor's findings for /api/health and when they
	// were made; nil: none.
	Doctor func(context.Context) ([]Check, time.Time)
	// RateLimit is each caller's token bucket: each API token's (the local
	// caller's when there is none) and each session token's; see
	// ratelimit.go for what has none. Zero: no limit.
	RateLimit RateLimit
}

// Server serves the API.
type Server struct {
	svc   service.Set
	b     Backend
	tools *tools.Catalogue
	opts  Options
	log   *slog.Logger
	mux   *http.ServeMux
	trust webTrust
	rate  *limiter
	ended endedResults // the results of tasks just ended, encoded once
	// patterns are the routes of mux, as registered.
	patterns []string
	prom     *metrics
}

// New returns a Server of svc's use cases and b's server-only operations.
func New(svc service.Set, b Backend, opts Options, log *slog.Logger) *Server {
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = 1 << 20
	}
	if opts.MaxWebhookBytes <= 0 {
		opts.MaxWebhookBytes = 256 << 10
	}
	if opts.MaxProgressBytes <= 0 {
		opts.MaxProgressBytes = 64 << 10
	}
	if opts.BodyStall <= 0 {
		opts.BodyStall = DefaultBodyStall
	}
	s := &Server{svc: svc, b: b, tools: tools.New(svc, opts.ToolLimits), opts: opts, log: log, mux: http.NewServeMux(), trust: newWebTrust(opts),
		rate: newLimiter(opts.RateLimit, log), prom: newMetrics(b, opts.Version, opts.Revision, log)}
	s.routes()
	return s
}

// Handler returns the server's root handler.
func (s *Server) Handler() http.Handler {
	return stallGuard(s.prom.instrument(s.mux), s.opts.BodyStall)
}

// WebhookHandler serves only the worker completion webhook, for the unix
// socket that sandboxes reach.
func (s *Server) WebhookHandler() http.Handler {
	m := http.NewServeMux()
	for _, r := range s.socketRoutes() {
		m.Handle(r.pattern, r.h)
	}
	return stallGuard(s.prom.instrument(m), s.opts.BodyStall)
}

// socketRoute is a route of the unix socket's handler.
type socketRoute struct {
	pattern string
	h       http.Handler
}

// socketRoutes are WebhookHandler's routes.
func (s *Server) socketRoutes() []socketRoute {
	return []socketRoute{
		{"POST /api/webhooks/worker-complete", s.wrap(s.workerComplete, fromWorker)},
		{"POST /api/webhooks/worker-progress", s.wrap(s.workerProgress, fromWorker)},
		// An agent working through a session runs its commands here, with
		// that session's token alone: every sandbox reaches this socket.
		{"POST /api/sessions/{id}/exec", s.wrap(func(w http.ResponseWriter, r *http.Request) error {
			return s.execSession(w, r, s.sessionTokenCaller)
		}, fromWorker|jsonBody)},
		{"GET /api/sessions/{id}/execs/{exec_id}", s.wrap(func(w http.ResponseWriter, r *http.Request) error {
			return s.readExec(w, r, s.sessionTokenCaller)
		}, fromWorker)},
		{"DELETE /api/sessions/{id}/execs/{exec_id}", s.wrap(func(w http.ResponseWriter, r *http.Request) error {
			return s.killExec(w, r, s.sessionTokenCaller)
		}, fromWorker)},
		// A session's exec agent dials in here from inside its sandbox.
		{"POST /api/sessions/{id}/agent", s.wrap(s.attachAgent, fromWorker)},
	}
}

// route says what wrap checks before a handler.
type route int

const (
	// needAuth: the bearer token, when one is configured.
	needAuth route = 1 << iota
	// jsonBody: a POST, PUT or PATCH body must be application/json.
	jsonBody
	// fromWorker: the worker webhook, signed per task and reached over the
	// unix socket: no Host or Origin checks (the socket has no host name).
	fromWorker
)

func (s *Server) routes() {
	auth := func(h handlerFunc) http.Handler { return s.wrap(h, needAuth) }
	authJSON := func(h handlerFunc) http.Handler { return s.wrap(h, needAuth|jsonBody) }
	open := func(h handlerFunc) http.Handler { return s.wrap(h, 0) }
	worker := func(h handlerFunc) http.Handler { return s.wrap(h, fromWorker) }
	// handle registers a route and keeps its pattern, which the OpenAPI
	// document's test walks.
	handle := func(pattern string, h http.Handler) {
		s.patterns = append(s.patterns, pattern)
		s.mux.Handle(pattern, h)
	}
	handle("GET /api/openapi.json", open(s.openAPI))
	handle("POST /api/tasks", authJSON(s.createTask))
	handle("POST /api/exec", authJSON(s.execute))
	handle("GET /api/workspaces", auth(s.listProjects))
	handle("POST /api/workspaces", authJSON(s.createProject))
	handle("GET /api/workspaces/{name}/files/{path...}", auth(s.projectFiles))
	handle("POST /api/sessions", authJSON(s.createSession))
	handle("GET /api/sessions", auth(s.listSessions))
	handle("PATCH /api/sessions/{id}/network", authJSON(s.setSessionNetwork))
	handle("POST /api/sessions/{id}/fork", authJSON(s.forkSession))
	// A session's own token reaches these: sessionCaller checks it.
	handle("GET /api/sessions/{id}", open(s.getSession))
	handle("GET /api/sessions/{id}/history", open(s.sessionHistory))
	handle("DELETE /api/sessions/{id}", open(s.deleteSession))
	handle("POST /api/sessions/{id}/exec", s.wrap(func(w http.ResponseWriter, r *http.Request) error {
		return s.execSession(w, r, s.sessionCaller)
	}, jsonBody))
	handle("GET /api/sessions/{id}/execs/{exec_id}", s.wrap(func(w http.ResponseWriter, r *http.Request) error {
		return s.readExec(w, r, s.sessionCaller)
	}, 0))
	handle("POST /api/sessions/{id}/suspend", s.wrap(s.suspendSession, jsonBody))
	handle("POST /api/sessions/{id}/resume", s.wrap(s.resumeSession, jsonBody))
	handle("DELETE /api/sessions/{id}/execs/{exec_id}", s.wrap(func(w http.ResponseWriter, r *http.Request) error {
		return s.killExec(w, r, s.sessionCaller)
	}, 0))
	handle("GET /api/tasks", auth(s.listTasks))
	handle("GET /api/tasks/{id}", auth(s.getTask))
	handle("GET /api/tasks/{id}/result", auth(s.taskResult))
	handle("POST /api/tasks/{id}/cancel", authJSON(s.cancelTask))
	handle("PATCH /api/tasks/{id}/network", authJSON(s.setTaskNetwork))
	handle("GET /api/tasks/{id}/logs", auth(s.taskLogs))
	handle("GET /api/tasks/{id}/events", auth(s.taskEvents))
	handle("GET /api/tasks/{id}/files/{path...}", auth(s.taskFile))
	handle("GET /api/events", auth(s.allEvents))
	handle("GET /api/conversations/{id}/events", auth(s.conversationEvents))
	handle("POST /api/webhooks/worker-complete", worker(s.workerComplete))
	handle("POST /api/webhooks/worker-progress", worker(s.workerProgress))
	// A session's exec agent in a pod dials in here, over the network
	// (a pod has no socket of this host's), with its agent token.
	handle("POST /api/sessions/{id}/agent", worker(s.attachAgent))
	// A warm pod's worker polls here for its task, with its own token.
	handle("GET /api/warm/{id}/start", worker(s.warmStart))
	handle("GET /api/workspace/{path...}", auth(s.readWorkspace))
	handle("PUT /api/workspace/{path...}", auth(s.writeWorkspace))
	handle("POST /api/attachments", auth(s.uploadAttachments))
	handle("GET /api/attachments/{id}", auth(s.downloadAttachment))
	handle("POST /api/gc", authJSON(s.gc))
	handle("GET /api/tools", auth(s.listTools))
	handle("POST /api/tools/{name}", authJSON(s.callTool))
	handle("GET /healthz", open(s.healthz))
	handle("GET /api/health", auth(s.health))
	handle("GET /metrics", auth(s.metrics))
	handle("GET /api/deliveries", auth(s.listDeliveries))
	handle("POST /api/deliveries/{id}/retry", authJSON(s.retryDelivery))
	handle("POST /api/documents", authJSON(s.ingestDocument))
	handle("GET /api/documents", auth(s.searchDocuments))
	handle("POST /api/documents/export", authJSON(s.exportNotes))
	handle("GET /api/skills", auth(s.listSkills))
	handle("GET /api/skills/{name}", auth(s.getSkill))
	handle("POST /api/skills", authJSON(s.createSkill))
	if s.opts.MCP != nil {
		handle("/mcp", authJSON(func(w http.ResponseWriter, r *http.Request) error {
			s.opts.MCP.ServeHTTP(w, r)
			return nil
		}))
	}
	handle("/api/", open(func(w http.ResponseWriter, r *http.Request) error {
		return fmt.Errorf("no route %s %s: %w", r.Method, r.URL.Path, errdefs.ErrNotFound)
	}))
	// The web UI: its pages and assets need no token (the app asks for it
	// and sends it to the API); the Host and Origin checks apply as
	// everywhere.
	handle("/", open(s.ui(webui.Handler())))
}

type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// ui serves the web UI (package webui) at every path it knows; any other
// path outside the API's routes is a 404 like an unknown API route.
func (s *Server) ui(ui http.Handler) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if !webui.Serves(r.URL.Path) {
			return fmt.Errorf("no route %s %s: %w", r.Method, r.URL.Path, errdefs.ErrNotFound)
		}
		ui.ServeHTTP(w, r)
		return nil
	}
}

// wrap adds the request id, the checks of rt (Host and Origin, auth, the
// body's type), the actor and error mapping to h.
func (s *Server) wrap(h handlerFunc, rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rid := newRequestID()
		w.Header().Set("X-Request-Id", rid)
		corr, err := correlationID(r)
		if err != nil {
			s.writeError(w, r, rid, err)
			return
		}
		w.Header().Set(HeaderCorrelationID, corr)
		// Everything the request records shares its correlation id (a
		// task's events keep the task's) and is caused by the request.
		ctx := eventstore.WithCause(r.Context(), eventstore.Cause{CorrelationID: corr, CausationID: "request/" + rid})
		if rt&fromWorker == 0 {
			if err := s.checkWebTrust(r); err != nil {
				s.writeError(w, r, rid, err)
				return
			}
		}
		actor := "anonymous"
		if rt&needAuth != 0 {
			name, err := s.caller(r)
			if err != nil {
				w.Header().Set("WWW-Authenticate", `Bearer realm="corral"`)
				s.writeError(w, r, rid, err)
				return
			}
			actor = name
			// After authentication: only a caller that holds a token has
			// a bucket (ratelimit.go).
			if err := s.rate.allow(apiCaller(name)); err != nil {
				s.writeError(w, r, rid, err)
				return
			}
		}
		if rt&jsonBody != 0 {
			if err := checkJSONBody(r); err != nil {
				s.writeError(w, r, rid, err)
				return
			}
		}
		ctx = service.WithActor(ctx, actor)
		start := time.Now()
		err = h(w, r.WithContext(ctx))
		if err != nil {
			s.writeError(w, r, rid, s.noSpace(rid, err))
		}
		// Changes are logged, reads and the workers' reports only at debug.
		lvl := slog.LevelInfo
		if r.Method == http.MethodGet || r.Method == http.MethodHead || rt&fromWorker != 0 {
			lvl = slog.LevelDebug
		}
		s.log.Log(ctx, lvl, "request", "method", r.Method, "path", r.URL.Path, logkey.RequestID, rid,
			logkey.CorrelationID, corr, "actor", actor, "duration_ms", time.Since(start).Milliseconds(), "failed", err != nil)
	})
}

// errorBody is every error response.
type errorBody struct {
	Error string `json:"error"`
	// Code names the status's class (errorCodes), for clients that branch
	// on the kind of failure without a table of HTTP statuses.
	Code      string       `json:"code"`
	Fields    []fieldError `json:"fields,omitempty"`
	RequestID string       `json:"request_id"`
}

// errorCodes are error answers' codes by HTTP status: the errdefs classes'
// names, as the OpenAPI document lists them.
var errorCodes = map[int]string{
	http.StatusBadRequest:            "invalid_argument",
	http.StatusUnauthorized:          "unauthenticated",
	http.StatusForbidden:             "permission_denied",
	http.StatusNotFound:              "not_found",
	http.StatusConflict:              "conflict",
	http.StatusRequestEntityTooLarge: "too_large",
	http.StatusUnsupportedMediaType:  "unsupported_media_type",
	http.StatusUnprocessableEntity:   "failed_precondition",
	http.StatusTooManyRequests:       "resource_exhausted",
	http.StatusInternalServerError:   "internal",
	http.StatusNotImplemented:        "not_implemented",
	http.StatusServiceUnavailable:    "unavailable",
	http.StatusInsufficientStorage:   "no_space",
}

type fieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// writeError maps an error to its HTTP status, in this one place. Client
// errors carry their message as a person should read it (errdefs.Message:
// no class names, system calls or host paths); anything unclassified is a
// 500 whose detail goes to the log only.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, rid string, err error) {
	status := statusOf(err)
	body := errorBody{Error: errdefs.Message(err), Code: errorCodes[status], RequestID: rid}
	if status == http.StatusInternalServerError {
		body.Error = "internal error"
		s.log.Error("request failed", logkey.RequestID, rid, "method", r.Method, "path", r.URL.Path, logkey.Error, err)
	}
	for _, fe := range fieldErrors(err) {
		body.Fields = append(body.Fields, fieldError{Field: fe.Field, Message: errdefs.Message(fe.Err)})
	}
	if status == http.StatusInternalServerError {
		body.Fields = nil
	}
	var rl *rateLimitError
	if errors.As(err, &rl) {
		w.Header().Set("Retry-After", rl.RetryAfter())
	}
	writeJSON(w, status, body)
}

// statusOf is errdefs.HTTPStatus with this transport's own cases: a body
// of a type the route does not take, and a FieldError about a missing file,
// which is the caller's input (422), unless the field is the path itself.
func statusOf(err error) int {
	if errors.Is(err, errUnsupportedMediaType) {
		return http.StatusUnsupportedMediaType
	}
	status := errdefs.HTTPStatus(err)
	var fe *errdefs.FieldError
	if status == http.StatusNotFound && errors.As(err, &fe) && fe.Field != "path" {
		return http.StatusUnprocessableEntity
	}
	return status
}

// fieldErrors returns every FieldError in err's tree.
func fieldErrors(err error) []*errdefs.FieldError {
	var out []*errdefs.FieldError
	var walk func(error)
	walk = func(e error) {
		if fe, ok := e.(*errdefs.FieldError); ok {
			out = append(out, fe)
			return
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, c := range u.Unwrap() {
				walk(c)
			}
		case interface{ Unwrap() error }:
			if c := u.Unwrap(); c != nil {
				walk(c)
			}
		}
	}
	walk(err)
	return out
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

// readBody reads a bounded request body into raw bytes. A JSON body is then
// decoded with tools.Decode, which refuses what encoding/json would take
// silently: text that is not UTF-8, a name given twice, an unknown field.
func (s *Server) readBody(r *http.Request, max int64) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, max))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, fmt.Errorf("request body is over the limit of %d bytes: %w", max, errdefs.ErrTooLarge)
		}
		return nil, fmt.Errorf("read request body: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return body, nil
}

func newRequestID() string { return "req_" + ids.New() }

// noSpace gives a write the filesystem refused (ENOSPC) the class of a
// full disk, with a message a caller can act on; the detail, which names
// host paths, goes to the log.
func (s *Server) noSpace(rid string, err error) error {
	if !errors.Is(err, syscall.ENOSPC) || errors.Is(err, errdefs.ErrNoSpace) {
		return err
	}
	s.log.Error("disk full", logkey.RequestID, rid, logkey.Error, err)
	return fmt.Errorf("the server's disk is full: free space on the data root (corral gc removes ended tasks' directories past retention): %w", errdefs.ErrNoSpace)
}

// HeaderCorrelationID is the header that carries a request's correlation
// id, both ways: a caller may choose it, and every response names it.
const HeaderCorrelationID = "X-Correlation-ID"

// maxCorrelationID bounds a caller's correlation id.
const maxCorrelationID = 128

// correlationID returns the request's X-Correlation-ID, or a new one when
// it has none. A caller's id is 1 to 128 of A-Z a-z 0-9 and . _ : / -, so
// it can go into logs, headers and event envelopes as it is.
func correlationID(r *http.Request) (string, error) {
	v := r.Header.Values(HeaderCorrelationID)
	switch {
	case len(v) == 0:
		return eventstore.NewCorrelationID(), nil
	case len(v) > 1:
		return "", fmt.Errorf("%s is given %d times; give it once: %w", HeaderCorrelationID, len(v), errdefs.ErrInvalidArgument)
	}
	id := v[0]
	ok := id != "" && len(id) <= maxCorrelationID
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._:/-", c) >= 0
	}
	if !ok {
		return "", fmt.Errorf("%s must be 1 to %d characters of letters, digits and . _ : / -: %w", HeaderCorrelationID, maxCorrelationID, errdefs.ErrInvalidArgument)
	}
	return id, nil
}
