package httpapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/execagent"
	"github.com/corral-dev/corral/internal/service"
)

// SessionCreated is POST /api/sessions's answer: the token is shown once.
type SessionCreated = service.SessionCreated

// ExecBody is POST /api/sessions/{id}/exec's body. Command is an argv (a
// JSON array) or one string run with sh -c. Detach answers the exec's id
// at once (ExecStarted) instead of its output.
type ExecBody struct {
	Command        json.RawMessage   `json:"command"`
	Cwd            string            `json:"cwd,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Stdin          string            `json:"stdin,omitempty"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty"`
	Detach         bool              `json:"detach,omitempty"`
}

// ExecStarted answers a detached exec.
type ExecStarted struct {
	ExecID string `json:"exec_id"`
}

// execHeartbeat is how often a quiet exec stream says it is alive.
const execHeartbeat = 15 * time.Second

// ExecChunk is one line of an exec's stream: first "started" with the
// exec's id, then its output as it comes (type stdout or stderr, from byte
// Offset of the whole output; Data when it is UTF-8, else DataBase64),
// "gap" for Bytes of output the server does not have, "heartbeat" when
// nothing came for a while, and last "exit" with the command's end. A
// client that lost the stream reads on with GET
// /api/sessions/{id}/execs/{exec_id}?offset= the offset it got to.
type ExecChunk struct {
	Type string `json:"type"`
	// ExecID is on the first line and the last (where it hides the end's,
	// which Decode puts back).
	ExecID     string `json:"exec_id,omitempty"`
	Offset     *int64 `json:"offset,omitempty"`
	Data       string `json:"data,omitempty"`
	DataBase64 string `json:"data_base64,omitempty"`
	Missing    int64  `json:"bytes,omitempty"` // a gap's
	*service.SessionExecEnd
}

// sessionCaller allows the admin token or session id's own token: another
// session's token is refused with 403, anything else with 401. Each takes
// its request from its own rate bucket: the session's token is looked at
// first, so that it has its bucket also where no API token is configured
// (and every loopback caller is the local one).
func (s *Server) sessionCaller(r *http.Request) error {
	if s.svc.Sessions == nil {
		return service.ErrSessionsOff
	}
	token, _ := bearer(r)
	id := r.PathValue("id")
	if s.opts.SessionGate.Authorize(id, token) {
		return s.rate.allow(sessionCallerKey(id, token))
	}
	if name, err := s.caller(r); err == nil {
		return s.rate.allow(apiCaller(name))
	}
	if strings.HasPrefix(token, service.SessionTokenPrefix) {
		return fmt.Errorf("a session token reaches its own session only: %w", errdefs.ErrPermissionDenied)
	}
	return fmt.Errorf("missing or wrong bearer token: %w", errdefs.ErrUnauthenticated)
}

// sessionTokenCaller allows session id's own token and nothing else (the
// unix socket sandboxes reach).
func (s *Server) sessionTokenCaller(r *http.Request) error {
	if s.svc.Sessions == nil {
		return service.ErrSessionsOff
	}
	token, _ := bearer(r)
	if id := r.PathValue("id"); s.opts.SessionGate.Authorize(id, token) {
		return s.rate.allow(sessionCallerKey(id, token))
	}
	return fmt.Errorf("this socket takes a session's own token only: %w", errdefs.ErrPermissionDenied)
}

// attachAgent upgrades a session's exec agent's request to the stream its
// commands run over (package execagent).
func (s *Server) attachAgent(w http.ResponseWriter, r *http.Request) error {
	if s.svc.Sessions == nil {
		return service.ErrSessionsOff
	}
	token, _ := bearer(r)
	if !s.opts.SessionGate.AuthorizeAgent(r.PathValue("id"), token) {
		return fmt.Errorf("only the session's exec agent attaches here: %w", errdefs.ErrPermissionDenied)
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), execagent.Upgrade) {
		return fmt.Errorf("want Upgrade: %s: %w", execagent.Upgrade, errdefs.ErrInvalidArgument)
	}
	hijacked := false
	upgrade := func() (net.Conn, io.Reader, error) {
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return nil, nil, fmt.Errorf("take over the agent's connection: %w", err)
		}
		hijacked = true
		if _, err := io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+execagent.Upgrade+"\r\n\r\n"); err != nil {
			conn.Close()
			return nil, nil, err
		}
		conn.SetDeadline(time.Time{})
		return conn, rw.Reader, nil
	}
	local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	hostSocket := local != nil && local.Network() == "unix"
	err := s.opts.SessionGate.AttachAgent(r.Context(), r.PathValue("id"), hostSocket, upgrade)
	if err != nil {
		s.log.Info("session exec agent refused", "session_id", r.PathValue("id"), "err", err)
	}
	if hijacked { // the answer is the connection's now
		return nil
	}
	return err
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request) error {
	if s.svc.Sessions == nil {
		return service.ErrSessionsOff
	}
	req, err := decodeBody[service.CreateSessionRequest](s, r)
	if err != nil {
		return err
	}
	sess, token, err := s.svc.Sessions.Create(r.Context(), req)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/api/sessions/"+sess.ID)
	writeJSON(w, http.StatusCreated, SessionCreated{SessionID: sess.ID, Token: token, Session: sess})
	return nil
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request) error {
	if s.svc.Sessions == nil {
		return service.ErrSessionsOff
	}
	list, err := s.svc.Sessions.List(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"sessions": list})
	return nil
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request) error {
	return s.answerSession(w, r, nil)
}

func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request) error {
	return s.answerSession(w, r, s.svc.Sessions.Delete)
}

// setSessionNetwork is PATCH /api/sessions/{id}/network: the API's token
// only (needAuth), never the session's own, which its sandbox holds.
func (s *Server) setSessionNetwork(w http.ResponseWriter, r *http.Request) error {
	if s.svc.Sessions == nil {
		return service.ErrSessionsOff
	}
	req, err := decodeBody[service.NetworkRequest](s, r)
	if err != nil {
		return err
	}
	sess, err := s.svc.Sessions.SetNetwork(r.Context(), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sess)
	return nil
}

// answerSession checks the caller, does act (if any) to the session the
// path names, and answers with the session.
func (s *Server) answerSession(w http.ResponseWriter, r *http.Request, act func(context.Context, string) error) error {
	if err := s.sessionCaller(r); err != nil {
		return err
	}
	id := r.PathValue("id")
	if act != nil {
		if err := act(r.Context(), id); err != nil {
			return err
		}
	}
	sess, err := s.svc.Sessions.Get(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sess)
	return nil
}

// execSession runs a command in a session and streams its output as it
// comes: NDJSON (one ExecChunk a line), or server-sent events (event:
// stdout|stderr|exit) with Accept: text/event-stream. A client that goes
// away stops the command.
func (s *Server) execSession(w http.ResponseWriter, r *http.Request, check func(*http.Request) error) error {
	if forwarded, err := s.onSessionReplica(w, r, check); forwarded || err != nil {
		return err
	}
	b, err := decodeBody[ExecBody](s, r)
	if err != nil {
		return err
	}
	// The session manager checks the command; this only reads the wire's
	// shapes into it.
	req := service.SessionCommand{Dir: b.Cwd, Timeout: time.Duration(b.TimeoutSeconds) * time.Second}
	if err := json.Unmarshal(b.Command, &req.Shell); err != nil {
		if err := json.Unmarshal(b.Command, &req.Command); err != nil {
			return errdefs.Field("command", "must be an argv (an array of strings) or a string run with sh -c")
		}
	}
	for k, v := range b.Env {
		if strings.Contains(k, "=") {
			return errdefs.Field("env", "names must be non-empty without = or NUL, values without NUL")
		}
		req.Env = append(req.Env, k+"="+v)
	}
	if b.Stdin != "" {
		req.Stdin = strings.NewReader(b.Stdin)
	}
	id := r.PathValue("id")
	execID, err := s.svc.Sessions.StartExec(r.Context(), id, req)
	if err != nil {
		return err
	}
	if b.Detach {
		writeJSON(w, http.StatusAccepted, ExecStarted{ExecID: execID})
		return nil
	}
	s.streamExec(w, r, id, execID, 0, true)
	return nil
}

// readExec is GET /api/sessions/{id}/execs/{exec_id}?offset=N: the exec's
// stream from byte N of its output (0 when absent), following it to its
// end; with follow=false, only what the server has now (an exit line if
// the command has ended).
func (s *Server) readExec(w http.ResponseWriter, r *http.Request, check func(*http.Request) error) error {
	if forwarded, err := s.onSessionReplica(w, r, check); forwarded || err != nil {
		return err
	}
	var from int64
	if v := r.URL.Query().Get("offset"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return errdefs.Field("offset", "must be a byte offset, 0 or more")
		}
		from = n
	}
	follow := r.URL.Query().Get("follow") != "false"
	// The exec must be there before the stream's first line: a wrong id
	// is a plain HTTP error.
	if _, err := s.svc.Sessions.ReadExec(r.Context(), r.PathValue("id"), r.PathValue("exec_id"), from, false, func(service.ExecOutput) error { return errStopRead }); err != nil && !errors.Is(err, errStopRead) {
		return err
	}
	s.streamExec(w, r, r.PathValue("id"), r.PathValue("exec_id"), from, follow)
	return nil
}

// onSessionReplica checks the caller of a session's route, then sends the
// request to the replica that runs the session if another does (it holds
// the session's exec agent), once (a replica that finds the session moved
// again answers for itself), with the caller's credential, which that
// replica checks again; forwarded says it did.
func (s *Server) onSessionReplica(w http.ResponseWriter, r *http.Request, check func(*http.Request) error) (forwarded bool, err error) {
	if err := check(r); err != nil {
		return false, err
	}
	if url, ok := s.opts.SessionGate.Forward(r.PathValue("id")); ok && r.Header.Get(ForwardedHeader) == "" {
		return true, forward(w, r, url, s.opts.Replica)
	}
	return false, nil
}

// suspendSession is POST /api/sessions/{id}/suspend (and resume): on
// the replica that runs the session.
func (s *Server) suspendSession(w http.ResponseWriter, r *http.Request) error {
	if forwarded, err := s.onSessionReplica(w, r, s.sessionCaller); forwarded || err != nil {
		return err
	}
	res, err := s.svc.Sessions.Suspend(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// sessionHistory is GET /api/sessions/{id}/history: a page of its
// lifecycle and the commands run in it, the latest ?limit= events before
// ?before=.
func (s *Server) sessionHistory(w http.ResponseWriter, r *http.Request) error {
	if err := s.sessionCaller(r); err != nil {
		return err
	}
	before, err := wholeQuery(r, "before")
	if err != nil {
		return err
	}
	limit, err := wholeQuery(r, "limit")
	if err != nil {
		return err
	}
	req := service.SessionHistoryRequest{ID: r.PathValue("id"), Before: before, Limit: int(min(limit, service.SessionHistoryMaxLimit+1))}
	page, err := s.svc.Sessions.History(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// wholeQuery is the query parameter name as a whole number above 0, or 0
// where the request has none.
func wholeQuery(r *http.Request, name string) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		return 0, errdefs.Field(name, "must be a whole number above 0")
	}
	return n, nil
}

// forkBody is POST /api/sessions/{id}/fork's body.
type forkBody struct {
	Count int `json:"count"`
}

// forkSession is POST /api/sessions/{id}/fork: sessions made from a copy
// of the session's files, as POST /api/sessions makes one.
func (s *Server) forkSession(w http.ResponseWriter, r *http.Request) error {
	if s.svc.Sessions == nil {
		return service.ErrSessionsOff
	}
	req, err := decodeBody[forkBody](s, r)
	if err != nil {
		return err
	}
	if req.Count == 0 {
		req.Count = 1
	}
	res, err := s.svc.Sessions.Fork(r.Context(), r.PathValue("id"), req.Count)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, res)
	return nil
}

func (s *Server) resumeSession(w http.ResponseWriter, r *http.Request) error {
	if forwarded, err := s.onSessionReplica(w, r, s.sessionCaller); forwarded || err != nil {
		return err
	}
	sess, err := s.svc.Sessions.Resume(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sess)
	return nil
}

// errStopRead ends a read early.
var errStopRead = errors.New("stop")

// killExec is DELETE /api/sessions/{id}/execs/{exec_id}: the command is
// killed; its end follows on its stream.
func (s *Server) killExec(w http.ResponseWriter, r *http.Request, check func(*http.Request) error) error {
	if forwarded, err := s.onSessionReplica(w, r, check); forwarded || err != nil {
		return err
	}
	if err := s.svc.Sessions.KillExec(r.Context(), r.PathValue("id"), r.PathValue("exec_id")); err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, ExecStarted{ExecID: r.PathValue("exec_id")})
	return nil
}

// streamExec writes exec execID's stream from byte from to the client
// until the command's end or the client's leaving (which leaves the
// command running). Quiet, it sends a heartbeat every execHeartbeat.
func (s *Server) streamExec(w http.ResponseWriter, r *http.Request, id, execID string, from int64, follow bool) {
	sse := strings.Contains(r.Header.Get("Accept"), "text/event-stream")
	st := &execStream{w: w, sse: sse}
	if sse {
		w.Header().Set("Content-Type", "text/event-stream")
	} else {
		w.Header().Set("Content-Type", "application/x-ndjson")
	}
	w.Header().Set("Cache-Control", "no-store")
	offset := from
	st.send(ExecChunk{Type: "started", ExecID: execID, Offset: &offset})
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var last atomic.Int64 // the offset last sent
	last.Store(from)
	beat := time.NewTicker(execHeartbeat)
	defer beat.Stop()
	quiet := make(chan struct{}, 1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-beat.C:
				select {
				case <-quiet:
				default:
					off := last.Load()
					if st.send(ExecChunk{Type: "heartbeat", Offset: &off}) != nil {
						cancel()
						return
					}
				}
			}
		}
	}()
	end, err := s.svc.Sessions.ReadExec(ctx, id, execID, from, follow, func(o service.ExecOutput) error {
		select {
		case quiet <- struct{}{}: // not quiet: skip the next beat
		default:
		}
		off := o.Offset
		ch := ExecChunk{Type: o.Stream, Offset: &off}
		switch {
		case o.Stream == "gap":
			ch.Missing = o.Bytes
		case utf8.Valid(o.Data):
			ch.Data = string(o.Data)
		default:
			ch.DataBase64 = base64.StdEncoding.EncodeToString(o.Data)
		}
		last.Store(o.Offset + o.Bytes)
		return st.send(ch)
	})
	if err != nil || end == nil {
		if r.Context().Err() == nil && err != nil {
			s.log.Warn("an exec's stream ended early", "session_id", id, "exec_id", execID, "err", err)
		}
		return
	}
	st.send(ExecChunk{Type: "exit", ExecID: end.ExecID, SessionExecEnd: end})
}

// execStream writes an exec's chunks to the client, flushing each.
type execStream struct {
	w   http.ResponseWriter
	sse bool

	mu   sync.Mutex
	sent bool
}

func (st *execStream) started() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.sent
}

func (st *execStream) send(c ExecChunk) error {
	b, _ := json.Marshal(c)
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.sent {
		st.w.WriteHeader(http.StatusOK)
		st.sent = true
	}
	var err error
	if st.sse {
		_, err = fmt.Fprintf(st.w, "event: %s\ndata: %s\n\n", c.Type, b)
	} else {
		_, err = fmt.Fprintf(st.w, "%s\n", b)
	}
	if f, ok := st.w.(http.Flusher); ok {
		f.Flush()
	}
	return err
}

// WithToken returns a client like c that sends token instead (a session's
// own token, say).
func (c *Client) WithToken(token string) *Client {
	cc := *c
	cc.token = token
	return &cc
}

// CreateSession starts a session (POST /api/sessions).
func (c *Client) CreateSession(ctx context.Context, req service.CreateSessionRequest) (SessionCreated, error) {
	var r SessionCreated
	err := c.call(ctx, http.MethodPost, "/api/sessions", req, &r)
	return r, err
}

// ListSessions lists the sessions, newest first.
func (c *Client) ListSessions(ctx context.Context) ([]service.Session, error) {
	var r struct {
		Sessions []service.Session `json:"sessions"`
	}
	err := c.call(ctx, http.MethodGet, "/api/sessions", nil, &r)
	return r.Sessions, err
}

// GetSession returns a session.
func (c *Client) GetSession(ctx context.Context, id string) (service.Session, error) {
	var s service.Session
	err := c.call(ctx, http.MethodGet, "/api/sessions/"+url.PathEscape(id), nil, &s)
	return s, err
}

// SetSessionNetwork changes a running session's network policy
// (PATCH /api/sessions/{id}/network).
func (c *Client) SetSessionNetwork(ctx context.Context, id string, req service.NetworkRequest) (service.Session, error) {
	var s service.Session
	err := c.call(ctx, http.MethodPatch, "/api/sessions/"+url.PathEscape(id)+"/network", req, &s)
	return s, err
}

// DeleteSession ends a session.
func (c *Client) DeleteSession(ctx context.Context, id string) (service.Session, error) {
	var s service.Session
	err := c.call(ctx, http.MethodDelete, "/api/sessions/"+url.PathEscape(id), nil, &s)
	return s, err
}

// ExecSession runs a command in a session and calls fn with each chunk of
// its output as it arrives, exactly once however often the stream breaks:
// a stream that ends before the command's end is read on from the offset
// it got to (GET .../execs/{exec_id}), for as long as reconnecting keeps
// working within a minute. It returns the command's end.
func (c *Client) ExecSession(ctx context.Context, id string, body ExecBody, fn func(ExecChunk) error) (service.SessionExecEnd, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return service.SessionExecEnd{}, err
	}
	resp, err := c.do(ctx, http.MethodPost, "/api/sessions/"+url.PathEscape(id)+"/exec", bytes.NewReader(b), "application/x-ndjson")
	if err != nil {
		return service.SessionExecEnd{}, err
	}
	var execID string
	var next int64
	var failing time.Time // when reconnecting started failing
	for {
		end, err := readExecStream(resp.Body, &execID, &next, fn)
		resp.Body.Close()
		if err == nil {
			return end, nil
		}
		if cerr := ctx.Err(); cerr != nil {
			return service.SessionExecEnd{ExecID: execID}, cerr
		}
		var fnErr *callbackError
		if execID == "" || errors.As(err, &fnErr) {
			if fnErr != nil {
				err = fnErr.err
			}
			return service.SessionExecEnd{}, err
		}
		// Read on from where the stream broke, waiting a little between
		// tries: the server may be restarting.
		for {
			if failing.IsZero() {
				failing = time.Now()
			}
			resp, err = c.do(ctx, http.MethodGet, "/api/sessions/"+url.PathEscape(id)+"/execs/"+url.PathEscape(execID)+"?offset="+strconv.FormatInt(next, 10), nil, "application/x-ndjson")
			if err == nil {
				failing = time.Time{}
				break
			}
			if ctx.Err() != nil || time.Since(failing) > time.Minute || errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrPermissionDenied) {
				return service.SessionExecEnd{}, fmt.Errorf("read exec %s again from byte %d: %w", execID, next, err)
			}
			select {
			case <-ctx.Done():
				return service.SessionExecEnd{}, ctx.Err()
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
}

// callbackError is an error of ExecSession's fn, which ends it.
type callbackError struct{ err error }

func (e *callbackError) Error() string { return e.err.Error() }

// readExecStream reads one exec stream: the exec's id into execID, each
// chunk of output from *next on to fn (a chunk partly before it cut), and
// the end; an error when the stream breaks first.
func readExecStream(body io.Reader, execID *string, next *int64, fn func(ExecChunk) error) (service.SessionExecEnd, error) {
	dec := json.NewDecoder(body)
	for {
		var ch ExecChunk
		if err := dec.Decode(&ch); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return service.SessionExecEnd{}, fmt.Errorf("read the exec's stream: %w", err)
		}
		switch ch.Type {
		case "started":
			*execID = ch.ExecID
			continue
		case "heartbeat":
			continue
		case "exit":
			if ch.SessionExecEnd != nil {
				ch.SessionExecEnd.ExecID = ch.ExecID
				return *ch.SessionExecEnd, nil
			}
			continue
		}
		if ch.Offset != nil {
			n := int64(len(ch.Bytes()))
			if ch.Type == "gap" {
				n = ch.Missing
			}
			if *ch.Offset+n <= *next {
				continue // had it
			}
			if cut := *next - *ch.Offset; cut > 0 {
				b := ch.Bytes()[cut:]
				ch.Data, ch.DataBase64 = "", base64.StdEncoding.EncodeToString(b)
				if utf8.Valid(b) {
					ch.Data, ch.DataBase64 = string(b), ""
				}
				off := *next
				ch.Offset = &off
			}
			*next = *ch.Offset + n
		}
		if err := fn(ch); err != nil {
			return service.SessionExecEnd{}, &callbackError{err}
		}
	}
}

// StartExec implements service.Sessions: a detached exec.
func (s sessionClient) StartExec(ctx context.Context, id string, req service.SessionCommand) (string, error) {
	body, err := execBody(req)
	if err != nil {
		return "", err
	}
	body.Detach = true
	var r ExecStarted
	err = s.c.call(ctx, http.MethodPost, "/api/sessions/"+url.PathEscape(id)+"/exec", body, &r)
	return r.ExecID, err
}

// ReadExec implements service.Sessions over GET .../execs/{exec_id}.
func (s sessionClient) ReadExec(ctx context.Context, id, execID string, from int64, follow bool, fn func(service.ExecOutput) error) (*service.SessionExecEnd, error) {
	resp, err := s.c.do(ctx, http.MethodGet, "/api/sessions/"+url.PathEscape(id)+"/execs/"+url.PathEscape(execID)+"?offset="+strconv.FormatInt(from, 10)+"&follow="+strconv.FormatBool(follow), nil, "application/x-ndjson")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ch ExecChunk
		if err := dec.Decode(&ch); err != nil {
			if !follow && errors.Is(err, io.EOF) {
				return nil, nil // what the server had; the command runs on
			}
			return nil, fmt.Errorf("read the exec's stream: %w", err)
		}
		switch ch.Type {
		case "started", "heartbeat":
		case "exit":
			if ch.SessionExecEnd != nil {
				ch.SessionExecEnd.ExecID = ch.ExecID
			}
			return ch.SessionExecEnd, nil
		default:
			o := service.ExecOutput{Stream: ch.Type, Data: ch.Bytes(), Bytes: int64(len(ch.Bytes()))}
			if ch.Type == "gap" {
				o.Data, o.Bytes = nil, ch.Missing
			}
			if ch.Offset != nil {
				o.Offset = *ch.Offset
			}
			if err := fn(o); err != nil {
				return nil, err
			}
		}
	}
}

// Suspend implements service.Sessions.
func (s sessionClient) Suspend(ctx context.Context, id string) (service.SessionSuspend, error) {
	var r service.SessionSuspend
	err := s.c.call(ctx, http.MethodPost, "/api/sessions/"+url.PathEscape(id)+"/suspend", struct{}{}, &r)
	return r, err
}

// History implements service.Sessions.
func (s sessionClient) History(ctx context.Context, req service.SessionHistoryRequest) (service.SessionHistory, error) {
	q := url.Values{}
	if req.Before > 0 {
		q.Set("before", strconv.FormatInt(req.Before, 10))
	}
	if req.Limit > 0 {
		q.Set("limit", strconv.Itoa(req.Limit))
	}
	path := "/api/sessions/" + url.PathEscape(req.ID) + "/history"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var r service.SessionHistory
	err := s.c.call(ctx, http.MethodGet, path, nil, &r)
	return r, err
}

// Fork implements service.Sessions.
func (s sessionClient) Fork(ctx context.Context, id string, count int) (service.SessionFork, error) {
	var r service.SessionFork
	err := s.c.call(ctx, http.MethodPost, "/api/sessions/"+url.PathEscape(id)+"/fork", forkBody{Count: count}, &r)
	return r, err
}

// Resume implements service.Sessions.
func (s sessionClient) Resume(ctx context.Context, id string) (service.Session, error) {
	var r service.Session
	err := s.c.call(ctx, http.MethodPost, "/api/sessions/"+url.PathEscape(id)+"/resume", struct{}{}, &r)
	return r, err
}

// KillExec implements service.Sessions.
func (s sessionClient) KillExec(ctx context.Context, id, execID string) error {
	return s.c.call(ctx, http.MethodDelete, "/api/sessions/"+url.PathEscape(id)+"/execs/"+url.PathEscape(execID), nil, nil)
}

// Bytes is the chunk's output as bytes, whichever way it was sent.
func (ch ExecChunk) Bytes() []byte {
	if ch.DataBase64 != "" {
		b, _ := base64.StdEncoding.DecodeString(ch.DataBase64)
		return b
	}
	return []byte(ch.Data)
}

// Sessions returns the session contract over c's API.
func (c *Client) Sessions() service.Sessions { return sessionClient{c} }

// Set returns every contract over c's API.
func (c *Client) Set() service.Set {
	return service.Set{Tasks: c, Library: c, Sessions: c.Sessions()}
}

// sessionClient implements service.Sessions over /api/sessions.
type sessionClient struct{ c *Client }

var _ service.Sessions = sessionClient{}

func (s sessionClient) Create(ctx context.Context, req service.CreateSessionRequest) (service.Session, string, error) {
	r, err := s.c.CreateSession(ctx, req)
	return r.Session, r.Token, err
}

func (s sessionClient) Get(ctx context.Context, id string) (service.Session, error) {
	return s.c.GetSession(ctx, id)
}

func (s sessionClient) List(ctx context.Context) ([]service.Session, error) {
	return s.c.ListSessions(ctx)
}

func (s sessionClient) SetNetwork(ctx context.Context, id string, req service.NetworkRequest) (service.Session, error) {
	return s.c.SetSessionNetwork(ctx, id, req)
}

func (s sessionClient) Delete(ctx context.Context, id string) error {
	_, err := s.c.DeleteSession(ctx, id)
	return err
}

// Exec runs req over ExecSession (execBody).
func (s sessionClient) Exec(ctx context.Context, id string, req service.SessionCommand, stdout, stderr io.Writer) (service.SessionExecEnd, error) {
	body, err := execBody(req)
	if err != nil {
		return service.SessionExecEnd{}, err
	}
	end, err := s.c.ExecSession(ctx, id, body, func(ch ExecChunk) error {
		w := stdout
		if ch.Type == "stderr" {
			w = stderr
		}
		if ch.Type == "gap" || w == nil {
			return nil
		}
		_, err := w.Write(ch.Bytes())
		return err
	})
	if err != nil && ctx.Err() != nil && end.ExecID != "" {
		// The contract's Exec stops a command its caller left.
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		s.KillExec(kctx, id, end.ExecID)
	}
	return end, err
}

// ExecBounded runs workspace_exec over POST /api/sessions/{id}/exec,
// keeping at most max bytes of each stream.
func (s sessionClient) ExecBounded(ctx context.Context, req service.SessionExecRequest, max int, onOutput func(stream string, data []byte)) (service.SessionExecResult, error) {
	cmd, _ := json.Marshal(req.Command)
	out, errb := &clip.Writer{Max: max}, &clip.Writer{Max: max}
	end, err := s.c.ExecSession(ctx, req.SessionID, ExecBody{Command: cmd, Cwd: req.Cwd, TimeoutSeconds: req.TimeoutSeconds}, func(ch ExecChunk) error {
		p := ch.Bytes()
		if onOutput != nil {
			onOutput(ch.Type, p)
		}
		if ch.Type == "stderr" {
			errb.Write(p)
		} else {
			out.Write(p)
		}
		return nil
	})
	if err != nil {
		return service.SessionExecResult{}, err
	}
	return service.SessionExecResult{ExitCode: end.ExitCode, DurationMS: end.DurationMS, Error: end.Error,
		Stdout: out.String(), Stderr: errb.String(), StdoutTruncated: out.Cut, StderrTruncated: errb.Cut}, nil
}

// ForwardedHeader marks a request one replica forwarded to another, naming
// the replica that did.
const ForwardedHeader = "Corral-Forwarded-By"

// forward sends r to the replica at base (an http URL) as it came, and its
// answer back as it comes (an exec streams its output).
func forward(w http.ResponseWriter, r *http.Request, base, self string) error {
	target, err := url.Parse(base)
	if err != nil || target.Scheme != "http" && target.Scheme != "https" || target.Host == "" {
		return fmt.Errorf("the replica that runs this session has no usable address (%q): %w", clip.String(base, 100), errdefs.ErrUnavailable)
	}
	var failed error
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = target.Host
			pr.Out.Header.Set(ForwardedHeader, self)
		},
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			failed = fmt.Errorf("the replica that runs this session (%s) does not answer: %v: %w", target.Host, err, errdefs.ErrUnavailable)
		},
	}
	proxy.ServeHTTP(w, r)
	return failed
}

// execBody is req as an ExecBody: its timeout in whole seconds (rounded
// up), its stdin read whole, which must be UTF-8 text (the body is JSON).
func execBody(req service.SessionCommand) (ExecBody, error) {
	body := ExecBody{Cwd: req.Dir, TimeoutSeconds: int((req.Timeout + time.Second - 1) / time.Second)}
	var err error
	if req.Shell != "" {
		body.Command, err = json.Marshal(req.Shell)
	} else {
		body.Command, err = json.Marshal(req.Command)
	}
	if err != nil {
		return body, err
	}
	for _, kv := range req.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return body, errdefs.Field("env", "each entry must be NAME=value")
		}
		if body.Env == nil {
			body.Env = map[string]string{}
		}
		body.Env[k] = v
	}
	if req.Stdin != nil {
		in, err := io.ReadAll(req.Stdin)
		if err != nil {
			return body, fmt.Errorf("read the command's stdin: %w", err)
		}
		if !utf8.Valid(in) {
			return body, errdefs.Field("stdin", "must be UTF-8 text over the HTTP API")
		}
		body.Stdin = string(in)
	}
	return body, nil
}
