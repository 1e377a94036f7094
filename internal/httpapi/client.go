package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/orchestrator"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/tools"
	"github.com/corral-dev/corral/internal/workspace"
)

// Client implements orchestrator.Service over the HTTP API.
type Client struct {
	base  string
	token string
	hc    *http.Client
}

var _ orchestrator.Service = (*Client)(nil)

// NewClient returns a client for the server at base (e.g.
// "http://127.0.0.1:7777"), sending token as a bearer token when set.
func NewClient(base, token string) *Client {
	return &Client{base: strings.TrimRight(base, "/"), token: token, hc: &http.Client{}}
}

func (c *Client) do(ctx context.Context, method, path string, body io.Reader, accept string) (*http.Response, error) {
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
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reach corral at %s: %v: %w", c.base, err, errdefs.ErrUnavailable)
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
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
	class := map[int]error{
		400: errdefs.ErrInvalidArgument, 401: errdefs.ErrUnauthenticated, 403: errdefs.ErrPermissionDenied,
		404: errdefs.ErrNotFound, 409: errdefs.ErrConflict, 413: errdefs.ErrTooLarge, 415: errdefs.ErrInvalidArgument,
		422: errdefs.ErrFailedPrecondition, 429: errdefs.ErrResourceExhausted,
		501: errdefs.ErrNotImplemented, 503: errdefs.ErrUnavailable,
	}[resp.StatusCode]
	if class == nil {
		return fmt.Errorf("%s (HTTP %d, request %s)", eb.Error, resp.StatusCode, eb.RequestID)
	}
	return &apiError{msg: eb.Error, class: class, fields: eb.Fields}
}

// apiError is an error answer from the server.
type apiError struct {
	msg    string
	class  error
	fields []fieldError
}

func (e *apiError) Error() string { return e.msg }
func (e *apiError) Unwrap() error { return e.class }

// Spawn creates a task.
func (c *Client) Spawn(ctx context.Context, req orchestrator.SpawnRequest) (task.Task, bool, error) {
	var r SpawnResponse
	if err := c.call(ctx, http.MethodPost, "/api/tasks", req, &r); err != nil {
		return task.Task{}, false, err
	}
	t, err := c.Get(ctx, r.TaskID)
	return t, r.Existing, err
}

// Get returns a task.
func (c *Client) Get(ctx context.Context, id string) (task.Task, error) {
	var t task.Task
	err := c.call(ctx, http.MethodGet, "/api/tasks/"+url.PathEscape(id), nil, &t)
	return t, err
}

// List returns a page of tasks.
func (c *Client) List(ctx context.Context, req orchestrator.ListRequest) (orchestrator.ListPage, error) {
	q := url.Values{}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("status", req.Status)
	set("conversation_id", req.ConversationID)
	set("cursor", req.Cursor)
	if req.Limit != 0 {
		q.Set("limit", strconv.Itoa(req.Limit))
	}
	var page orchestrator.ListPage
	err := c.call(ctx, http.MethodGet, "/api/tasks?"+q.Encode(), nil, &page)
	return page, err
}

// Result returns a task's result, waiting up to req.Wait.
func (c *Client) Result(ctx context.Context, req orchestrator.ResultRequest) (orchestrator.Result, error) {
	q := url.Values{}
	if req.Wait > 0 {
		q.Set("wait", req.Wait.String())
	}
	for _, f := range req.IncludeFileContents {
		q.Add("include_file_contents", f)
	}
	var r orchestrator.Result
	err := c.call(ctx, http.MethodGet, "/api/tasks/"+url.PathEscape(req.TaskID)+"/result?"+q.Encode(), nil, &r)
	return r, err
}

// Cancel cancels a task.
func (c *Client) Cancel(ctx context.Context, id string) (task.Task, error) {
	var t task.Task
	err := c.call(ctx, http.MethodPost, "/api/tasks/"+url.PathEscape(id)+"/cancel", nil, &t)
	return t, err
}

// Logs copies a task's transcript to w.
func (c *Client) Logs(ctx context.Context, req orchestrator.LogsRequest, w io.Writer) error {
	q := url.Values{}
	if req.Follow {
		q.Set("follow", "1")
	}
	if req.Stream != "" {
		q.Set("stream", req.Stream)
	}
	resp, err := c.do(ctx, http.MethodGet, "/api/tasks/"+url.PathEscape(req.TaskID)+"/logs?"+q.Encode(), nil, "")
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

// Events calls fn with events; with req.Follow it reads the SSE stream.
func (c *Client) Events(ctx context.Context, req orchestrator.EventsRequest, fn func(eventstore.Event) error) error {
	path := "/api/events"
	if req.TaskID != "" {
		path = "/api/tasks/" + url.PathEscape(req.TaskID) + "/events"
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
	resp, err := c.do(ctx, http.MethodGet, path, nil, "text/event-stream")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var data []byte
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) == 0 && len(data) > 0:
			var e eventstore.Event
			if err := json.Unmarshal(data, &e); err != nil {
				return fmt.Errorf("decode event: %w", err)
			}
			data = data[:0]
			if err := fn(e); err != nil {
				return err
			}
		case bytes.HasPrefix(line, []byte("data: ")):
			data = append(data, line[len("data: "):]...)
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read events: %w", err)
	}
	return nil
}

// ListWorkspace lists a directory of shared/.
func (c *Client) ListWorkspace(ctx context.Context, p string, recursive bool) ([]workspace.Entry, error) {
	q := ""
	if recursive {
		q = "?recursive=1"
	}
	var r struct {
		Entries []workspace.Entry `json:"entries"`
	}
	if err := c.call(ctx, http.MethodGet, "/api/workspace/"+escapePath(p)+q, nil, &r); err != nil {
		return nil, err
	}
	if r.Entries == nil {
		return nil, fmt.Errorf("%s is a file, not a directory: %w", p, orchestrator.ErrNotDir)
	}
	return r.Entries, nil
}

// ReadWorkspace reads a file of shared/.
func (c *Client) ReadWorkspace(ctx context.Context, p string) (orchestrator.File, error) {
	var r struct {
		orchestrator.File
		Entries []workspace.Entry `json:"entries"`
	}
	err := c.call(ctx, http.MethodGet, "/api/workspace/"+escapePath(p), nil, &r)
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

func escapePath(p string) string {
	parts := strings.Split(strings.TrimLeft(p, "/"), "/")
	for i, s := range parts {
		parts[i] = url.PathEscape(s)
	}
	return strings.Join(parts, "/")
}

// Tools returns the tool catalogue as OpenAI-style function definitions.
func (c *Client) Tools(ctx context.Context) ([]tools.Function, error) {
	var defs []tools.Function
	err := c.call(ctx, http.MethodGet, "/api/tools", nil, &defs)
	return defs, err
}
