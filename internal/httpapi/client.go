package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/tools"
	"github.com/corral-dev/corral/internal/workspace"
)

// Client implements service.Tasks and service.Library over the HTTP API,
// and service.Sessions with Sessions.
//
// Events and Logs with Follow outlive a restart of the server: when their
// stream breaks they reconnect, with backoff, and resume where they
// stopped, for as long as Reconnect allows without reaching the server.
type Client struct {
	base  string
	token string
	hc    *http.Client
	// Reconnect bounds how long a followed stream keeps trying to reach
	// the server again after it was lost; zero means DefaultReconnect.
	Reconnect time.Duration
	// OnReconnect, when set, is called with the cause each time a followed
	// stream is lost, before it tries to reconnect.
	OnReconnect func(cause error)
	// ForwardedBy, when set, marks every request as one that replica of
	// the cluster forwards (Corral-Forwarded-By): the server answers it
	// itself and never forwards it again.
	ForwardedBy string
}

// DefaultReconnect is how long a followed stream tries to reach a server
// that went away: long enough for a restart, an upgrade or a reboot.
const DefaultReconnect = 2 * time.Minute

// The backoff between attempts to reconnect a followed stream.
const (
	firstBackoff = 100 * time.Millisecond
	maxBackoff   = 5 * time.Second
)

var (
	_ service.Tasks   = (*Client)(nil)
	_ service.Library = (*Client)(nil)
)

// NewClient returns a client for the server at base (e.g.
// "http://127.0.0.1:7777"), sending token as a bearer token when set.
// A base of unix:///path reaches the server's unix socket (the one
// sandboxes reach, which serves the worker routes and a session's exec).
func NewClient(base, token string) *Client {
	if sock, ok := strings.CutPrefix(base, "unix://"); ok {
		var d net.Dialer
		return &Client{base: "http://corral", token: token, hc: &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return d.DialContext(ctx, "unix", sock) },
		}}}
	}
	return &Client{base: strings.TrimRight(base, "/"), token: token, hc: &http.Client{}}
}

// ErrNoServer is the ErrUnavailable of a server address where nothing
// listens: no corral server runs there.
var ErrNoServer = errors.New("no corral server is running")

func (c *Client) do(ctx context.Context, method, path string, body io.Reader, accept string) (*http.Response, error) {
	req, err := c.newRequest(ctx, method, path, body, accept)
	if err != nil {
		return nil, err
	}
	return c.send(req)
}

func (c *Client) newRequest(ctx context.Context, method, path string, body io.Reader, accept string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	if c.ForwardedBy != "" {
		req.Header.Set(ForwardedHeader, c.ForwardedBy)
	}
	return req, nil
}

// send sends req and turns an error answer into a classified error.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		if cerr := req.Context().Err(); cerr != nil {
			// The caller gave up: its own reason, not the server's.
			return nil, cerr
		}
		return nil, c.unreachable(err)
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// unreachable is the error of a request that got no answer, said plainly:
// ErrNoServer when nothing listens at the address.
func (c *Client) unreachable(err error) error {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%w at %s: %w", ErrNoServer, c.base, errdefs.ErrUnavailable)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // "Get URL: " would repeat the address
	}
	return fmt.Errorf("cannot reach the corral server at %s: %s: %w", c.base, errdefs.Message(err), errdefs.ErrUnavailable)
}

// call sends in as JSON (unless nil) and decodes the answer into out.
func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	resp, err := c.do(ctx, method, path, body, "application/json")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode answer to %s %s: %w", method, path, err)
	}
	return nil
}

// decodeError turns an error response back into a classified error.
func decodeError(resp *http.Response) error {
	var eb errorBody
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if json.Unmarshal(b, &eb) != nil || eb.Error == "" {
		eb.Error = strings.TrimSpace(string(b))
		if eb.Error == "" {
			eb.Error = resp.Status
		}
	}
	if errdefs.FromHTTPStatus(resp.StatusCode) == nil {
		return fmt.Errorf("%s (HTTP %d, request %s)", eb.Error, resp.StatusCode, eb.RequestID)
	}
	return &apiError{msg: eb.Error, status: resp.StatusCode, fields: eb.Fields}
}

// apiError is an error answer from the server. Its message is already
// the one a person should read, so it reports its class through Is rather
// than wrapping it: errdefs.Message leaves it whole.
type apiError struct {
	msg    string
	status int
	fields []fieldError
}

func (e *apiError) Error() string        { return e.msg }
func (e *apiError) Is(target error) bool { return errdefs.HTTPStatusIs(e.status, target) }

// Spawn creates a task.
func (c *Client) Spawn(ctx context.Context, req service.SpawnRequest) (task.Task, bool, error) {
	var r SpawnResponse
	if err := c.call(ctx, http.MethodPost, "/api/tasks", req, &r); err != nil {
		return task.Task{}, false, err
	}
	t, err := c.Get(ctx, r.TaskID)
	return t, r.Existing, err
}

// Execute runs a code_execute call (POST /api/exec) and waits for its end.
func (c *Client) Execute(ctx context.Context, req service.ExecRequest) (service.ExecResult, error) {
	var r service.ExecResult
	err := c.call(ctx, http.MethodPost, "/api/exec", req, &r)
	return r, err
}

// Get returns a task.
func (c *Client) Get(ctx context.Context, id string) (task.Task, error) {
	var t task.Task
	err := c.call(ctx, http.MethodGet, "/api/tasks/"+url.PathEscape(id), nil, &t)
	return t, err
}

// List returns a page of tasks.
func (c *Client) List(ctx context.Context, req service.ListRequest) (service.ListPage, error) {
	q := url.Values{}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("status", req.Status)
	set("conversation_id", req.ConversationID)
	set("workspace", req.Workspace)
	set("cursor", req.Cursor)
	if req.Limit != 0 {
		q.Set("limit", strconv.Itoa(req.Limit))
	}
	var page service.ListPage
	err := c.call(ctx, http.MethodGet, "/api/tasks?"+q.Encode(), nil, &page)
	return page, err
}

// Result returns a task's result, waiting up to req.Wait.
func (c *Client) Result(ctx context.Context, req service.ResultRequest) (service.Result, error) {
	q := url.Values{}
	if req.Wait > 0 {
		q.Set("wait", req.Wait.String())
	}
	for _, f := range req.IncludeFileContents {
		q.Add("include_file_contents", f)
	}
	var r service.Result
	err := c.call(ctx, http.MethodGet, "/api/tasks/"+url.PathEscape(req.TaskID)+"/result?"+q.Encode(), nil, &r)
	return r, err
}

// Cancel cancels a task.
func (c *Client) Cancel(ctx context.Context, id string) (task.Task, error) {
	var t task.Task
	err := c.call(ctx, http.MethodPost, "/api/tasks/"+url.PathEscape(id)+"/cancel", nil, &t)
	return t, err
}

// SetNetwork changes a running task's network policy
// (PATCH /api/tasks/{id}/network).
func (c *Client) SetNetwork(ctx context.Context, req service.NetworkRequest) (task.Task, error) {
	var t task.Task
	err := c.call(ctx, http.MethodPatch, "/api/tasks/"+url.PathEscape(req.TaskID)+"/network", req, &t)
	return t, err
}

// Logs copies a task's transcript to w. With req.Follow it copies until
// the task ends, across restarts of the server: the transcript only grows,
// so a resumed stream skips what was already copied.
func (c *Client) Logs(ctx context.Context, req service.LogsRequest, w io.Writer) error {
	q := url.Values{}
	if req.Follow {
		q.Set("follow", "1")
	}
	if req.Stream != "" {
		q.Set("stream", req.Stream)
	}
	path := "/api/tasks/" + url.PathEscape(req.TaskID) + "/logs?" + q.Encode()
	if !req.Follow {
		resp, err := c.do(ctx, http.MethodGet, path, nil, "")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.Copy(w, resp.Body)
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	out := &countingWriter{w: w}
	return c.follow(ctx, func(resume bool) error {
		resp, err := c.do(ctx, http.MethodGet, path, nil, "")
		if err != nil {
			return lostIf(resume, false, err)
		}
		defer resp.Body.Close()
		if _, err := io.CopyN(io.Discard, resp.Body, out.n); err != nil && !errors.Is(err, io.EOF) {
			return &lostError{err: fmt.Errorf("read the transcript: %w", err), reached: true}
		}
		_, err = io.Copy(out, resp.Body)
		switch {
		case ctx.Err() != nil:
			return nil
		case out.err != nil:
			return out.err
		case err != nil:
			return &lostError{err: fmt.Errorf("read the transcript: %w", err), reached: true}
		}
		// The server ends a followed transcript when the task ends, and
		// when it shuts down: ask which.
		t, err := c.Get(ctx, req.TaskID)
		if err != nil {
			return lostIf(true, true, err)
		}
		if !t.Status.Terminal() {
			return &lostError{err: errors.New("the server ended the transcript before the task ended"), reached: true}
		}
		return nil
	})
}

// countingWriter counts what it wrote and keeps the first error, to tell
// a failing w from a failing stream.
type countingWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (cw *countingWriter) Write(p []byte) (int, error) {
	n, err := cw.w.Write(p)
	cw.n += int64(n)
	if err != nil && cw.err == nil {
		cw.err = err
	}
	return n, err
}

// Events calls fn with events; with req.Follow it reads the SSE stream,
// across restarts of the server (it resumes after the last event it saw),
// until fn returns an error or ctx is done.
func (c *Client) Events(ctx context.Context, req service.EventsRequest, fn func(eventstore.Event) error) error {
	path := "/api/events"
	if req.TaskID != "" {
		path = "/api/tasks/" + url.PathEscape(req.TaskID) + "/events"
	} else if req.ConversationID != "" {
		path = "/api/conversations/" + url.PathEscape(req.ConversationID) + "/events"
	}
	if req.After != "" {
		path += "?after=" + url.QueryEscape(req.After)
	}
	if !req.Follow {
		var r struct {
			Events []eventstore.Event `json:"events"`
		}
		if err := c.call(ctx, http.MethodGet, path, nil, &r); err != nil {
			return err
		}
		for _, e := range r.Events {
			if err := fn(e); err != nil {
				return err
			}
		}
		return nil
	}
	last := ""
	return c.follow(ctx, func(resume bool) error {
		hr, err := c.newRequest(ctx, http.MethodGet, path, nil, "text/event-stream")
		if err != nil {
			return err
		}
		if last != "" {
			hr.Header.Set("Last-Event-ID", last)
		}
		resp, err := c.send(hr)
		if err != nil {
			return lostIf(resume, false, err)
		}
		defer resp.Body.Close()
		err = readSSE(resp.Body, func(id string, e eventstore.Event) error {
			last = id
			return fn(e)
		})
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, errStreamBroke):
			return &lostError{err: err, reached: true}
		case err != nil:
			return err
		}
		// The server never ends a followed stream but when it shuts down.
		return &lostError{err: errors.New("the server closed the event stream"), reached: true}
	})
}

// errStreamBroke is readSSE's error when the connection failed under it.
var errStreamBroke = errors.New("the event stream broke")

// readSSE calls fn with each event of an SSE stream and the event's id,
// until the stream ends (nil) or fn fails. Comment lines (": ping", the
// server's heartbeat) are skipped.
func readSSE(r io.Reader, fn func(id string, e eventstore.Event) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var data []byte
	id := ""
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			if len(data) == 0 {
				continue
			}
			var e eventstore.Event
			if err := json.Unmarshal(data, &e); err != nil {
				return fmt.Errorf("decode event: %w", err)
			}
			data = data[:0]
			if id == "" {
				id = e.ID
			}
			if err := fn(id, e); err != nil {
				return err
			}
			id = ""
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "data":
			if len(data) > 0 {
				data = append(data, '\n')
			}
			data = append(data, value...)
		case "id":
			id = string(value)
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("read events: %w", err)
		}
		return fmt.Errorf("%w: %w", errStreamBroke, err)
	}
	return nil
}

// lostError is how an attempt of a followed stream ends when it may be
// resumed: the stream broke (reached: the server had answered), or the
// server could not be reached again.
type lostError struct {
	err     error
	reached bool
}

func (e *lostError) Error() string { return e.err.Error() }
func (e *lostError) Unwrap() error { return e.err }

// lostIf returns err as a lostError when it says the server is not there
// (or not answering) and resume allows it: a followed stream tries again.
// The first attempt does not resume: with no server at all, it fails at
// once with the reason.
func lostIf(resume, reached bool, err error) error {
	if resume && errors.Is(err, errdefs.ErrUnavailable) {
		return &lostError{err: err, reached: reached}
	}
	return err
}

// follow calls attempt until it returns anything but a lostError: first
// with resume false, then, after each loss, with resume true after a
// backoff. It gives up once the server has not been reached for
// c.Reconnect.
func (c *Client) follow(ctx context.Context, attempt func(resume bool) error) error {
	limit := c.Reconnect
	if limit <= 0 {
		limit = DefaultReconnect
	}
	wait := firstBackoff
	var lost time.Time // when the server was lost, while it is
	for resume := false; ; resume = true {
		err := attempt(resume)
		var le *lostError
		if ctx.Err() != nil {
			return nil
		}
		if !errors.As(err, &le) {
			return err
		}
		if le.reached { // a new loss: only a resumed attempt fails unreached
			lost, wait = time.Now(), firstBackoff
			if c.OnReconnect != nil {
				c.OnReconnect(le.err)
			}
		} else if time.Since(lost) >= limit {
			return fmt.Errorf("gave up: the corral server at %s has not come back within %s: %w", c.base, limit, le.err)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil
		}
		wait = min(2*wait, maxBackoff)
	}
}

// ListWorkspace lists a directory of shared/.
func (c *Client) ListWorkspace(ctx context.Context, p string, recursive bool) ([]workspace.Entry, error) {
	return c.listFiles(ctx, "/api/workspace/", p, recursive)
}

// listFiles lists directory p of the file tree served at base.
func (c *Client) listFiles(ctx context.Context, base, p string, recursive bool) ([]workspace.Entry, error) {
	q := ""
	if recursive {
		q = "?recursive=1"
	}
	var r struct {
		Entries []workspace.Entry `json:"entries"`
	}
	if err := c.call(ctx, http.MethodGet, base+escapePath(p)+q, nil, &r); err != nil {
		return nil, err
	}
	if r.Entries == nil {
		return nil, fmt.Errorf("%s is a file, not a directory: %w", p, workspace.ErrNotDir)
	}
	return r.Entries, nil
}

// ReadWorkspace reads a file of shared/.
func (c *Client) ReadWorkspace(ctx context.Context, p string) (service.File, error) {
	return c.readFile(ctx, "/api/workspace/", p)
}

// readFile reads file p of the file tree served at base.
func (c *Client) readFile(ctx context.Context, base, p string) (service.File, error) {
	var r struct {
		service.File
		Entries []workspace.Entry `json:"entries"`
	}
	err := c.call(ctx, http.MethodGet, base+escapePath(p), nil, &r)
	if err == nil && r.Entries != nil {
		return r.File, fmt.Errorf("%s is a directory: %w", p, errdefs.ErrFailedPrecondition)
	}
	return r.File, err
}

// WriteWorkspace writes a file of shared/.
func (c *Client) WriteWorkspace(ctx context.Context, p string, content []byte) (workspace.Entry, error) {
	resp, err := c.do(ctx, http.MethodPut, "/api/workspace/"+escapePath(p), bytes.NewReader(content), "application/json")
	if err != nil {
		return workspace.Entry{}, err
	}
	defer resp.Body.Close()
	var e workspace.Entry
	err = json.NewDecoder(resp.Body).Decode(&e)
	return e, err
}

// CallTool calls a tool by name with JSON arguments.
func (c *Client) CallTool(ctx context.Context, name string, args json.RawMessage) (json.RawMessage, error) {
	resp, err := c.do(ctx, http.MethodPost, "/api/tools/"+url.PathEscape(name), bytes.NewReader(args), "application/json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// Download streams a task's output file to w.
func (c *Client) Download(ctx context.Context, id, p string, w io.Writer) error {
	resp, err := c.do(ctx, http.MethodGet, "/api/tasks/"+url.PathEscape(id)+"/files/"+escapePath(p), nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	return err
}

// escapePath puts a caller's path into a URL so that the server sees it
// as given and decides what it means: what the URL's path cleaning would
// change ("." and ".." segments, a leading "/", empty segments) is
// percent-encoded, so "../x" reaches the server as "../x" (and is refused
// there as escaping the workspace) instead of becoming another route.
func escapePath(p string) string {
	parts := strings.Split(p, "/")
	var b strings.Builder
	for i, s := range parts {
		if i > 0 {
			if s == "" || parts[i-1] == "" {
				b.WriteString("%2F")
			} else {
				b.WriteByte('/')
			}
		}
		if s == "." || s == ".." {
			b.WriteString(strings.ReplaceAll(s, ".", "%2E"))
		} else {
			b.WriteString(url.PathEscape(s))
		}
	}
	return b.String()
}

// Tools returns the tool catalogue as OpenAI-style function definitions.
func (c *Client) Tools(ctx context.Context) ([]tools.Function, error) {
	var defs []tools.Function
	err := c.call(ctx, http.MethodGet, "/api/tools", nil, &defs)
	return defs, err
}
