// Package mcpserver serves Corral's tool catalogue (internal/tools) over the
// Model Context Protocol, with the official Go SDK: streamable HTTP through
// Handler (mounted at /mcp behind the API's bearer auth) and stdio through
// ServeStdio (corral mcp). It adds no tools of its own: every tool, its
// schema and its handler come from the catalogue, so MCP and the HTTP
// function API (/api/tools) cannot drift apart.
//
// A tool's failure is a tool result with isError set and the error's
// message, never a protocol error, so the model sees it and can correct
// itself. An unclassified error is "internal error" and a request id, its
// detail only logged: the rule httpapi applies to HTTP answers. A call to a
// tool that does not exist stays a protocol error (-32602), as the MCP
// specification says.
//
// While read_task_result waits (wait_seconds > 0) for a client that sent a
// progress token, the task's events become progress notifications.
//
// A task is also a resource, corral://tasks/{id}. Its end is pushed, once,
// to the session that spawned it (a logging notification with its status
// and summary) and to each session subscribed to its resource
// (notifications/resources/updated), whether or not a call waits.
package mcpserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/tools"
)

// Options configure a Server.
type Options struct {
	// Version is the server version reported to clients at initialize.
	Version string
	// MaxArgumentBytes bounds one tool call's arguments (JSON); a larger
	// call is a tool error naming the limit, and changes nothing. Default
	// 1 MiB, the API's request limit.
	MaxArgumentBytes int64
	// SessionTimeout closes a streamable HTTP session idle this long.
	// Default 30 minutes.
	SessionTimeout time.Duration
	// Limits are the server limits the tool schemas state.
	Limits tools.Limits
	// Session, when set, serves workspace_exec alone, bound to that
	// session: the MCP server an agent working through a session gets.
	Session string
}

// Server is an MCP server over one service.Set. It is safe for
// concurrent use: any number of sessions, over both transports, may share
// it.
type Server struct {
	mu       sync.Mutex
	watching map[string]bool // session id and conversation: watched
	ends     map[string]*endWatch
	sessions map[*mcp.ServerSession]bool // sessions in ends, forgotten as they close
	svc      service.Set
	cat      *tools.Catalogue
	opts     Options
	log      *slog.Logger
	srv      *mcp.Server
}

// New returns a Server with every tool of tools.New(svc, opts.Limits).
func New(svc service.Set, opts Options, log *slog.Logger) *Server {
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.MaxArgumentBytes <= 0 {
		opts.MaxArgumentBytes = 1 << 20
	}
	if opts.SessionTimeout <= 0 {
		opts.SessionTimeout = 30 * time.Minute
	}
	cat := tools.New(svc, opts.Limits)
	if opts.Session != "" {
		cat = tools.NewSession(svc.Sessions, opts.Session)
	}
	s := &Server{svc: svc, cat: cat, opts: opts, log: log}
	sopts := &mcp.ServerOptions{
		Logger:       log,
		Instructions: "Corral runs AI coding agents in sandboxes. spawn_worker starts a task; read_task_result with wait_seconds waits for it and returns its output files. A task's end is sent to the session that spawned it as a logging notification, and to subscribers of corral://tasks/{id} as resources/updated.",
	}
	// A session's server reads no tasks: it has workspace_exec alone.
	if opts.Session == "" {
		sopts.SubscribeHandler = s.subscribe
		sopts.UnsubscribeHandler = s.unsubscribe
	}
	s.srv = mcp.NewServer(&mcp.Implementation{Name: "corral", Title: "Corral", Version: opts.Version}, sopts)
	if opts.Session == "" {
		s.addTaskResource()
	}
	for _, t := range s.cat.All() {
		s.srv.AddTool(&mcp.Tool{Name: t.Name, Description: t.Description, InputSchema: t.Schema, Annotations: annotations(t.Effect)}, s.handler(t.Name))
	}
	return s
}

// Handler returns the streamable HTTP transport. The caller mounts it (at
// /mcp) behind its own authentication and its own Host and Origin checks
// (httpapi's, which also answer the names an operator lists in
// http.allowed_hosts, such as a reverse proxy's on the same machine), so
// the SDK's loopback-only Host check is off.
func (s *Server) Handler() http.Handler {
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.srv }, &mcp.StreamableHTTPOptions{
		Logger:                     s.log,
		SessionTimeout:             s.opts.SessionTimeout,
		DisableLocalhostProtection: true,
		// Twice the argument limit and some room for the envelope, so that
		// moderately oversize arguments reach the handler and get a tool
		// error that names the limit rather than a bare 413.
		MaxRequestBodyBytes: 2*s.opts.MaxArgumentBytes + 64<<10,
	})
}

// ServeStdio serves one session over r and w (newline-delimited JSON-RPC)
// until the client closes r or ctx ends. Nothing else may write to w.
func (s *Server) ServeStdio(ctx context.Context, r io.ReadCloser, w io.WriteCloser) error {
	return s.serve(ctx, &mcp.IOTransport{Reader: r, Writer: w})
}

func (s *Server) serve(ctx context.Context, t mcp.Transport) error {
	err := s.srv.Run(ctx, t)
	if ctx.Err() != nil || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// handler runs one catalogue tool for MCP.
func (s *Server) handler(name string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		args := req.Params.Arguments
		if n := int64(len(args)); n > s.opts.MaxArgumentBytes {
			return s.errorResult(name, fmt.Errorf("arguments are %d bytes, over the limit of %d: %w", n, s.opts.MaxArgumentBytes, errdefs.ErrTooLarge)), nil
		}
		stop := s.followProgress(ctx, req, name, args)
		ctx = s.outputProgress(ctx, req)
		watch := s.beforeSpawn(ctx, req, name, args)
		res, err := s.cat.Call(ctx, name, args)
		r, ok := res.(service.Result)
		stop(err == nil && ok && r.Done)
		if err != nil {
			return s.errorResult(name, err), nil
		}
		b, err := marshal(res)
		if err != nil {
			return s.errorResult(name, fmt.Errorf("encode the result of %s: %v", name, err)), nil
		}
		watch(b)
		return &mcp.CallToolResult{
			Content:           []mcp.Content{&mcp.TextContent{Text: string(b)}},
			StructuredContent: json.RawMessage(b),
		}, nil
	}
}

func marshal(v any) ([]byte, error) {
	var buf jsonBuffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.b[:len(buf.b)-1], nil // drop Encode's newline
}

type jsonBuffer struct{ b []byte }

func (j *jsonBuffer) Write(p []byte) (int, error) { j.b = append(j.b, p...); return len(p), nil }

// errorResult turns a tool's error into an isError result. A classified
// error carries its message as a person should read it (errdefs.Message; a
// FieldError names the argument); anything else is "internal error" with a
// request id, its detail only logged.
func (s *Server) errorResult(name string, err error) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: s.message(name, err)}}}
}

// message is what a client is told of err, which failed what: the
// classified error's message, or "internal error" and a request id, under
// which the detail is logged.
func (s *Server) message(what string, err error) string {
	if errdefs.Classified(err) {
		return errdefs.Message(err)
	}
	rid := newRequestID()
	s.log.Error("mcp request failed", "what", what, logkey.RequestID, rid, logkey.Error, err)
	return "internal error (request id " + rid + ")"
}

func newRequestID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// beforeSpawn returns, for a call that spawns a task, what starts telling
// the calling session of the task's end once the call has returned its
// result (JSON), as MCP logging notifications while the session is
// connected (the client sets a log level to receive them). For a workspace
// task reporting to a conversation, it notes where that conversation's
// stream is now, and the session is told of the reports that follow: the
// task's end is one of them. For any other task it is the task's own end
// (watchSpawned). For any other call it returns a no-op.
func (s *Server) beforeSpawn(ctx context.Context, req *mcp.CallToolRequest, name string, args json.RawMessage) (watch func(result []byte)) {
	if req.Session == nil || (name != "spawn_workspace_task" && name != "spawn_worker") {
		return func([]byte) {}
	}
	ownEnd := func(b []byte) { s.watchSpawned(ctx, req.Session, b) }
	var a struct {
		Workspace          string `json:"workspace"`
		WorkspacePath      string `json:"workspace_path"`
		ConversationID     string `json:"conversation_id"`
		OriginConversation string `json:"origin_conversation"`
	}
	// Lenient on purpose: bad arguments are the tool's to report.
	if json.Unmarshal(args, &a) != nil || (a.Workspace == "" && a.WorkspacePath == "") {
		return ownEnd
	}
	conv := a.OriginConversation
	if conv == "" {
		conv = a.ConversationID
	}
	if conv == "" {
		return ownEnd
	}
	var last string
	if err := s.svc.Tasks.Events(ctx, service.EventsRequest{ConversationID: conv}, func(e eventstore.Event) error {
		last = e.ID
		return nil
	}); err != nil {
		return ownEnd
	}
	return func([]byte) { s.watchConversation(req.Session, conv, last) }
}

// watchConversation sends session ss the workspace task reports on
// conversation conv after event after, until ss closes. One watch per
// session and conversation.
func (s *Server) watchConversation(ss *mcp.ServerSession, conv, after string) {
	key := ss.ID() + "\x00" + conv
	s.mu.Lock()
	if s.watching == nil {
		s.watching = map[string]bool{}
	}
	if s.watching[key] {
		s.mu.Unlock()
		return
	}
	s.watching[key] = true
	s.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		ss.Wait()
		cancel()
	}()
	go func() {
		defer func() {
			cancel()
			s.mu.Lock()
			delete(s.watching, key)
			s.mu.Unlock()
		}()
		err := s.svc.Tasks.Events(ctx, service.EventsRequest{ConversationID: conv, After: after, Follow: true}, func(e eventstore.Event) error {
			if e.Type != task.EventWorkspaceTaskCompleted && e.Type != task.EventWorkspaceTaskFailed {
				return nil
			}
			return ss.Log(ctx, &mcp.LoggingMessageParams{Level: "notice", Logger: "corral", Data: map[string]any{
				"event_type": e.Type, "event_id": e.ID, "conversation_id": conv, "report": json.RawMessage(e.Data),
			}})
		})
		if err != nil && ctx.Err() == nil {
			s.log.Debug("conversation notifications ended", "conversation_id", conv, logkey.Error, err)
		}
	}()
}

// outputProgress makes a command's output (workspace_exec) progress
// notifications as it comes, if the client asked for progress: the
// message is the chunk, prefixed "stderr: " for standard error. They are
// sent in order, each before the next chunk is read, so all precede the
// result.
func (s *Server) outputProgress(ctx context.Context, req *mcp.CallToolRequest) context.Context {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return ctx
	}
	var n float64
	return tools.WithOutput(ctx, func(stream string, data []byte) {
		n++
		msg := strings.ToValidUTF8(string(data), "\uFFFD")
		if stream == "stderr" {
			msg = "stderr: " + msg
		}
		if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: n, Message: msg}); err != nil {
			s.log.Debug("output notification not sent", logkey.Error, err)
		}
	})
}

// followProgress sends the task's events as progress notifications while
// read_task_result waits, if the client asked for progress. The returned
// stop ends the subscription and returns once nothing more will be sent, so
// no notification follows the result. stop(true) says the task has ended:
// its terminal event is committed, and the notifications up to it are sent
// first (within drainProgress), so a fast task's client still hears every
// step.
func (s *Server) followProgress(ctx context.Context, req *mcp.CallToolRequest, name string, args json.RawMessage) (stop func(ended bool)) {
	token := req.Params.GetProgressToken()
	nothing := func(bool) {}
	if name != "read_task_result" || token == nil || req.Session == nil {
		return nothing
	}
	var a struct {
		TaskID      string `json:"task_id"`
		WaitSeconds int    `json:"wait_seconds"`
	}
	// Lenient on purpose: bad arguments are the tool's to report.
	if json.Unmarshal(args, &a) != nil || a.WaitSeconds <= 0 || !task.ValidID(a.TaskID) {
		return nothing
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var n float64
		err := s.svc.Tasks.Events(ctx, service.EventsRequest{TaskID: a.TaskID, Follow: true}, func(e eventstore.Event) error {
			msg, ok := progressMessage(e)
			if !ok {
				return nil
			}
			n++
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: n, Message: msg}); err != nil {
				return err
			}
			if e.Type == task.EventCompleted {
				return errEnded
			}
			return nil
		})
		if err != nil && ctx.Err() == nil && !errors.Is(err, errEnded) {
			s.log.Debug("progress notifications ended", logkey.TaskID, a.TaskID, logkey.Error, err)
		}
	}()
	return func(ended bool) {
		if ended {
			select {
			case <-done:
			case <-time.After(drainProgress):
			}
		}
		cancel()
		<-done
	}
}

// errEnded stops following a task's events at its terminal event.
var errEnded = errors.New("task ended")

// drainProgress bounds how long a result waits for the notifications
// before it: they are read from events already committed, so this is
// only a guard against a stuck client.
const drainProgress = 2 * time.Second

// progressMessage is the progress notification message for an event, if
// the event is one a waiting client cares about.
func progressMessage(e eventstore.Event) (string, bool) {
	switch e.Type {
	case task.EventCreated:
		return "created", true
	case task.EventQueued:
		return "queued", true
	case task.EventStarting:
		return "starting", true
	case task.EventStarted:
		return "running", true
	case task.EventCancelRequested:
		return "cancel requested", true
	case task.EventReattached:
		return "running (reattached after a server restart)", true
	case task.EventCompleted:
		var c struct {
			Status string `json:"status"`
		}
		json.Unmarshal(e.Data, &c)
		return "ended: " + c.Status, true
	case task.EventProgress:
		var p task.Progress
		if json.Unmarshal(e.Data, &p) == nil {
			if line := p.Line(); line != "" {
				return line, true
			}
		}
		return "progress", true
	}
	return "", false
}

// annotations tell a client what a tool does: reads only, writes Corral's
// state (nothing it cannot take back is destroyed), or runs code in a
// sandbox that may reach the network the server allows.
func annotations(e tools.Effect) *mcp.ToolAnnotations {
	no, yes := false, true
	switch e {
	case tools.Reads:
		return &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no}
	case tools.Writes:
		return &mcp.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no}
	default:
		return &mcp.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &yes}
	}
}
