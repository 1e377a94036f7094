package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/filetype"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/strictjson"
	"github.com/corral-dev/corral/internal/webhook"
	"github.com/corral-dev/corral/internal/workspace"
)

// SpawnResponse is POST /api/tasks's answer.
type SpawnResponse struct {
	TaskID   string `json:"task_id"`
	Status   string `json:"status"`
	Existing bool   `json:"existing,omitempty"`
}

func (s *Server) createTask(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeBody[service.SpawnRequest](s, r)
	if err != nil {
		return err
	}
	t, existing, err := s.svc.Tasks.Spawn(r.Context(), req)
	if err != nil {
		return err
	}
	status := http.StatusCreated
	if existing {
		status = http.StatusOK
	}
	w.Header().Set("Location", "/api/tasks/"+t.ID)
	writeJSON(w, status, SpawnResponse{TaskID: t.ID, Status: string(t.Status), Existing: existing})
	return nil
}

// execute runs a code_execute call and answers when it ends: 200 with the
// result, whether the command succeeded or not (success says which).
func (s *Server) execute(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeBody[service.ExecRequest](s, r)
	if err != nil {
		return err
	}
	res, err := s.svc.Tasks.Execute(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

func (s *Server) listTasks(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	req := service.ListRequest{Status: q.Get("status"), ConversationID: q.Get("conversation_id"), Workspace: q.Get("workspace"), Cursor: q.Get("cursor")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return errdefs.Field("limit", "must be a number between 1 and 500")
		}
		req.Limit = n
	}
	page, err := s.svc.Tasks.List(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

func (s *Server) getTask(w http.ResponseWriter, r *http.Request) error {
	t, err := s.svc.Tasks.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, t)
	return nil
}

func (s *Server) taskResult(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	req := service.ResultRequest{TaskID: r.PathValue("id"), IncludeFileContents: q["include_file_contents"]}
	if v := q.Get("wait"); v != "" {
		d, err := parseWait(v)
		if err != nil {
			return err
		}
		req.Wait = d
	}
	res, err := s.svc.Tasks.Result(r.Context(), req)
	if err != nil {
		return err
	}
	if !res.Done || res.FileContents != nil {
		writeJSON(w, http.StatusOK, res)
		return nil
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(s.ended.encode(res))
	return nil
}

// parseWait takes "30s", "2m" or a number of seconds.
func parseWait(v string) (time.Duration, error) {
	if n, err := strconv.Atoi(v); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, errdefs.Field("wait", "must be a duration such as 30s or a number of seconds")
	}
	return d, nil
}

func (s *Server) cancelTask(w http.ResponseWriter, r *http.Request) error {
	t, err := s.svc.Tasks.Cancel(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, t)
	return nil
}

// setTaskNetwork is PATCH /api/tasks/{id}/network.
func (s *Server) setTaskNetwork(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeBody[service.NetworkRequest](s, r)
	if err != nil {
		return err
	}
	req.TaskID = r.PathValue("id")
	t, err := s.svc.Tasks.SetNetwork(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, t)
	return nil
}

func (s *Server) taskLogs(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	req := service.LogsRequest{TaskID: r.PathValue("id"), Follow: isTrue(q.Get("follow")), Stream: q.Get("stream")}
	if _, err := s.svc.Tasks.Get(r.Context(), req.TaskID); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	fw := &flushWriter{w: w, rc: http.NewResponseController(w)}
	return s.svc.Tasks.Logs(r.Context(), req, fw)
}

func isTrue(v string) bool { return v == "1" || v == "true" || v == "yes" }

// flushWriter flushes after each write, so a followed log streams.
type flushWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (f *flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	f.rc.Flush()
	return n, err
}

func (f *flushWriter) Flush() { f.rc.Flush() }

func (s *Server) taskEvents(w http.ResponseWriter, r *http.Request) error {
	return s.events(w, r, service.EventsRequest{TaskID: r.PathValue("id")})
}

func (s *Server) allEvents(w http.ResponseWriter, r *http.Request) error {
	return s.events(w, r, service.EventsRequest{})
}

// conversationEvents serves GET /api/conversations/{id}/events: the
// reports of the workspace tasks that conversation asked for.
func (s *Server) conversationEvents(w http.ResponseWriter, r *http.Request) error {
	return s.events(w, r, service.EventsRequest{ConversationID: r.PathValue("id")})
}

// events answers with JSON, or with SSE when the client accepts
// text/event-stream; SSE resumes after Last-Event-ID or ?after=.
func (s *Server) events(w http.ResponseWriter, r *http.Request, req service.EventsRequest) error {
	q := r.URL.Query()
	req.After = q.Get("after")
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		req.After = id
	}
	sse := strings.Contains(r.Header.Get("Accept"), "text/event-stream")
	if !sse {
		var evs []eventstore.Event
		err := s.svc.Tasks.Events(r.Context(), req, func(e eventstore.Event) error {
			evs = append(evs, e)
			if len(evs) > 10000 {
				return errAbort
			}
			return nil
		})
		if err != nil && !errors.Is(err, errAbort) {
			return err
		}
		if evs == nil {
			evs = []eventstore.Event{}
		}
		writeJSON(w, http.StatusOK, map[string]any{"events": evs})
		return nil
	}
	req.Follow = true
	if req.TaskID != "" {
		if _, err := s.svc.Tasks.Get(r.Context(), req.TaskID); err != nil {
			return err
		}
	}
	if req.After != "" {
		// Check the cursor before the stream starts, so a bad one is a 4xx.
		if err := s.svc.Tasks.Events(r.Context(), service.EventsRequest{After: req.After, TaskID: req.TaskID, ConversationID: req.ConversationID}, func(eventstore.Event) error { return errAbort }); err != nil && !errors.Is(err, errAbort) {
			return err
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	rc := http.NewResponseController(w)
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, ": corral events\n\n")
	rc.Flush()
	// A stream quiet for the heartbeat interval gets a comment line, which
	// clients ignore, so that proxies and load balancers that cut idle
	// connections leave it open. The writes share a lock, and the
	// heartbeat stops before the handler returns.
	beat := s.opts.SSEHeartbeat
	if beat <= 0 {
		beat = DefaultSSEHeartbeat
	}
	var mu sync.Mutex
	quiet := time.NewTimer(beat)
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-quiet.C:
			case <-stop:
				return
			}
			mu.Lock()
			_, err := io.WriteString(w, ": ping\n\n")
			if err == nil {
				err = rc.Flush()
			}
			quiet.Reset(beat)
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		close(stop)
		<-stopped
		quiet.Stop()
	}()
	return s.svc.Tasks.Events(r.Context(), req, func(e eventstore.Event) error {
		data, _ := json.Marshal(e)
		mu.Lock()
		defer mu.Unlock()
		quiet.Reset(beat)
		if _, err := fmt.Fprintf(w, "id: %s\nevent: %s\ndata: %s\n\n", e.ID, e.Type, data); err != nil {
			return err
		}
		return rc.Flush()
	})
}

// DefaultSSEHeartbeat is how long an event stream stays quiet before the
// server sends a comment line: well under the 60 s idle timeout that
// common proxies (nginx's proxy_read_timeout, AWS ALB) apply by default.
const DefaultSSEHeartbeat = 15 * time.Second

var errAbort = errors.New("abort")

// taskFile serves a task's output file. A worker chose its name and its
// bytes, so the browser must never run it: its type is what its content
// is (not its name), nosniff holds the browser to that type, the CSP
// sandboxes anything opened anyway, and every file but a PNG, JPEG, GIF or
// WebP image is a download (Content-Disposition: attachment), never a
// page of this origin. SVG, which can carry script, is a download too.
func (s *Server) taskFile(w http.ResponseWriter, r *http.Request) error {
	f, info, err := s.b.OpenOutput(r.Context(), r.PathValue("id"), r.PathValue("path"))
	if err != nil {
		return err
	}
	defer f.Close()
	return serveUntrusted(w, r, f, info)
}

// serveUntrusted serves a file a worker wrote, as taskFile says.
func serveUntrusted(w http.ResponseWriter, r *http.Request, f *os.File, info fs.FileInfo) error {
	head := make([]byte, filetype.HeadBytes)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("read output file: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("read output file: %w", err)
	}
	typ := filetype.Detect(info.Name(), head[:n])
	h := w.Header()
	h.Set("Content-Type", typ)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'none'; sandbox")
	if !InlineImage(typ) {
		disp := mime.FormatMediaType("attachment", map[string]string{"filename": info.Name()})
		if disp == "" {
			disp = "attachment"
		}
		h.Set("Content-Disposition", disp)
	}
	http.ServeContent(w, r, info.Name(), info.ModTime(), f)
	return nil
}

// InlineImage reports whether a file of MIME type typ may be shown inline:
// the raster image types browsers decode without running anything.
func InlineImage(typ string) bool {
	mt, _, _ := mime.ParseMediaType(typ)
	switch mt {
	case "image/png", "image/jpeg", "image/gif", "image/webp":
		return true
	}
	return false
}

func (s *Server) workerComplete(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(r, s.opts.MaxWebhookBytes)
	if err != nil {
		return err
	}
	id, err := s.b.WorkerComplete(r.Context(), webhook.Received(r.Header, body))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "accepted", "event_id": id})
	return nil
}

// readWorkspace is GET /api/workspace/{path}: a directory's entries, or a
// file as JSON (its content cut at the read limit); with ?raw=1 (or
// Accept: application/octet-stream) a file's bytes whole, served as a
// worker's output file is (workers write shared/ through save_to_shared).
func (s *Server) readWorkspace(w http.ResponseWriter, r *http.Request) error {
	if isTrue(r.URL.Query().Get("raw")) || r.Header.Get("Accept") == "application/octet-stream" {
		f, info, err := s.b.OpenShared(r.Context(), r.PathValue("path"))
		if err != nil {
			return err
		}
		defer f.Close()
		return serveUntrusted(w, r, f, info)
	}
	return serveFiles(w, r, r.PathValue("path"), s.svc.Library.ListWorkspace, s.svc.Library.ReadWorkspace)
}

// serveFiles answers a GET of path p of a file tree: a directory's entries
// (recursive=true for all below it), or a file's content.
func serveFiles(w http.ResponseWriter, r *http.Request, p string,
	list func(context.Context, string, bool) ([]workspace.Entry, error),
	read func(context.Context, string) (service.File, error)) error {
	ents, err := list(r.Context(), p, isTrue(r.URL.Query().Get("recursive")))
	if err == nil {
		writeJSON(w, http.StatusOK, map[string]any{"path": p, "entries": ents})
		return nil
	}
	if !errors.Is(err, workspace.ErrNotDir) {
		return err
	}
	f, err := read(r.Context(), p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, f)
	return nil
}

func (s *Server) writeWorkspace(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(r, s.opts.MaxRequestBytes)
	if err != nil {
		return err
	}
	e, err := s.svc.Library.WriteWorkspace(r.Context(), r.PathValue("path"), body)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, e)
	return nil
}

func (s *Server) listTools(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, s.tools.Functions())
	return nil
}

func (s *Server) callTool(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(r, s.opts.MaxRequestBytes)
	if err != nil {
		return err
	}
	res, err := s.tools.Call(r.Context(), r.PathValue("name"), body)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// healthz answers 200 "ok" (with the replica's id) once the server is
// ready, 503 "starting" while it still reconciles the tasks and sandboxes
// it found at start-up (the API already answers then; new tasks wait in
// the queue), and 503 "store unreachable" while it cannot renew its lease
// on its store (Options.Holding).
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) error {
	if !s.ready() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "starting"})
		return nil
	}
	if s.opts.Holding != nil && !s.opts.Holding() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "store unreachable", "replica": s.opts.Replica})
		return nil
	}
	body := map[string]string{"status": "ok"}
	if s.opts.Replica != "" {
		body["replica"] = s.opts.Replica
	}
	writeJSON(w, http.StatusOK, body)
	return nil
}

// decodeBody reads r's JSON body, at most MaxRequestBytes, strictly into a
// T (strictjson: one way to read it only).
func decodeBody[T any](s *Server, r *http.Request) (T, error) {
	var v T
	body, err := s.readBody(r, s.opts.MaxRequestBytes)
	if err != nil {
		return v, err
	}
	err = strictjson.Decode(body, &v)
	return v, err
}
