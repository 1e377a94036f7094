package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// taskURIPrefix starts the URI of a task's resource, corral://tasks/{id}.
const taskURIPrefix = "corral://tasks/"

func taskURI(id string) string { return taskURIPrefix + id }

// taskIDOf is the id of the task a resource URI names, if it names one.
func taskIDOf(uri string) (string, bool) {
	id, ok := strings.CutPrefix(uri, taskURIPrefix)
	return id, ok && task.ValidID(id)
}

// sendTimeout bounds one notification to one session, so that a client
// that stopped reading delays the others told of the same end by this at
// most; a closed session fails at once.
const sendTimeout = 10 * time.Second

// endWatch follows one task's events until its end for the sessions to
// tell of it: those that spawned it (a logging notification) and those
// subscribed to its resource (resources/updated, which the SDK sends to
// every subscriber of the URI). It is stopped when neither is left: the
// sessions unsubscribed or closed.
type endWatch struct {
	spawners    map[*mcp.ServerSession]bool
	subscribers map[*mcp.ServerSession]bool
	stop        context.CancelFunc
}

func (w *endWatch) idle() bool { return len(w.spawners) == 0 && len(w.subscribers) == 0 }

// addTaskResource serves corral://tasks/{id}: a task as read_task_result
// answers it (without file contents), to read and to subscribe to.
func (s *Server) addTaskResource() {
	s.srv.AddResourceTemplate(&mcp.ResourceTemplate{
		URITemplate: taskURIPrefix + "{id}",
		Name:        "task",
		Title:       "Corral task",
		Description: "A task as read_task_result answers it. Subscribe to be sent notifications/resources/updated when the task ends.",
		MIMEType:    "application/json",
	}, s.readTask)
}

func (s *Server) readTask(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	id, ok := taskIDOf(uri)
	if !ok {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	r, err := s.svc.Tasks.Result(ctx, service.ResultRequest{TaskID: id})
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	if err != nil {
		return nil, errors.New(s.message("read "+uri, err))
	}
	b, err := marshal(r)
	if err != nil {
		return nil, errors.New(s.message("read "+uri, err))
	}
	// A task is its caller's, not for a shared cache.
	return &mcp.ReadResourceResult{
		Cacheable: mcp.Cacheable{CacheScope: "private"},
		Contents:  []*mcp.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(b)}},
	}, nil
}

// subscribe starts telling req's session of the task's end. A task that
// has already ended is sent nothing: it will not end again, and the read
// a client makes after subscribing shows its end. So does the read for an
// end in the moment between this handler and the SDK's record of the
// subscription, which the SDK makes after it returns.
func (s *Server) subscribe(ctx context.Context, req *mcp.SubscribeRequest) error {
	uri := req.Params.URI
	id, ok := taskIDOf(uri)
	if !ok {
		return mcp.ResourceNotFoundError(uri)
	}
	after, ended, err := s.position(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return mcp.ResourceNotFoundError(uri)
	}
	if err != nil {
		return errors.New(s.message("subscribe to "+uri, err))
	}
	if !ended {
		s.await(req.Session, id, after, false)
	}
	return nil
}

func (s *Server) unsubscribe(_ context.Context, req *mcp.UnsubscribeRequest) error {
	if id, ok := taskIDOf(req.Params.URI); ok {
		s.mu.Lock()
		defer s.mu.Unlock()
		if w := s.ends[id]; w != nil {
			delete(w.subscribers, req.Session)
			s.stopIfIdle(id, w)
		}
	}
	return nil
}

// watchSpawned tells session ss of the end of the task a spawn tool
// returned (its JSON result b), even one that ended before the call
// returned.
func (s *Server) watchSpawned(ctx context.Context, ss *mcp.ServerSession, b []byte) {
	var r struct {
		TaskID string `json:"task_id"`
	}
	if json.Unmarshal(b, &r) != nil || r.TaskID == "" {
		return
	}
	after, _, err := s.position(ctx, r.TaskID)
	if err != nil {
		s.log.Debug("task end not followed", logkey.TaskID, r.TaskID, logkey.Error, err)
		return
	}
	s.await(ss, r.TaskID, after, true)
}

// position returns the id of the task's last event before its end, and
// whether it has ended: following the task's events after that id meets
// its end, whenever it comes. ErrNotFound for an unknown task.
func (s *Server) position(ctx context.Context, id string) (after string, ended bool, err error) {
	err = s.svc.Tasks.Events(ctx, service.EventsRequest{TaskID: id}, func(e eventstore.Event) error {
		if e.Type == task.EventCompleted {
			ended = true
			return errEnded
		}
		after = e.ID
		return nil
	})
	if errors.Is(err, errEnded) {
		err = nil
	}
	return after, ended, err
}

// await adds session ss to those told of task id's end, as its spawner or
// a subscriber, starting the task's watch (following its events after
// event after) if it has none, and forgetting ss when it closes.
func (s *Server) await(ss *mcp.ServerSession, id, after string, spawner bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ends == nil {
		s.ends = map[string]*endWatch{}
		s.sessions = map[*mcp.ServerSession]bool{}
	}
	w := s.ends[id]
	if w == nil {
		ctx, cancel := context.WithCancel(context.Background())
		w = &endWatch{spawners: map[*mcp.ServerSession]bool{}, subscribers: map[*mcp.ServerSession]bool{}, stop: cancel}
		s.ends[id] = w
		go s.follow(ctx, id, after, w)
	}
	if spawner {
		w.spawners[ss] = true
	} else {
		w.subscribers[ss] = true
	}
	if !s.sessions[ss] {
		s.sessions[ss] = true
		go func() {
			ss.Wait()
			s.forget(ss)
		}()
	}
}

// forget drops a closed session from every watch.
func (s *Server) forget(ss *mcp.ServerSession) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sessions, ss)
	for id, w := range s.ends {
		delete(w.spawners, ss)
		delete(w.subscribers, ss)
		s.stopIfIdle(id, w)
	}
}

// stopIfIdle stops watch w of task id if no session is left to tell.
// s.mu is held.
func (s *Server) stopIfIdle(id string, w *endWatch) {
	if w.idle() {
		w.stop()
		delete(s.ends, id)
	}
}

// follow waits for task id's end and tells w's sessions of it.
func (s *Server) follow(ctx context.Context, id, after string, w *endWatch) {
	err := s.svc.Tasks.Events(ctx, service.EventsRequest{TaskID: id, After: after, Follow: true}, func(e eventstore.Event) error {
		if e.Type != task.EventCompleted {
			return nil
		}
		s.ended(id, e, w)
		return errEnded
	})
	if err != nil && !errors.Is(err, errEnded) {
		s.log.Debug("task end not followed", logkey.TaskID, id, logkey.Error, err)
	}
	// Whatever ended the watch, it is gone: a later spawn or subscribe
	// starts another.
	s.mu.Lock()
	if s.ends[id] == w {
		delete(s.ends, id)
	}
	s.mu.Unlock()
	w.stop()
}

// ended sends the notifications of task id's end e to w's sessions: a
// logging notification (level notice, logger "corral") with the task's
// id, URI, status and summary to each that spawned it, and
// resources/updated for its URI to its subscribers.
func (s *Server) ended(id string, e eventstore.Event, w *endWatch) {
	s.mu.Lock()
	if s.ends[id] != w {
		s.mu.Unlock()
		return // stopped meanwhile
	}
	delete(s.ends, id)
	spawners := make([]*mcp.ServerSession, 0, len(w.spawners))
	for ss := range w.spawners {
		spawners = append(spawners, ss)
	}
	subscribed := len(w.subscribers) > 0
	s.mu.Unlock()

	if subscribed {
		// The SDK bounds each send itself (10 seconds).
		s.srv.ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationParams{URI: taskURI(id)})
	}
	if len(spawners) == 0 {
		return
	}
	var c task.Completed
	json.Unmarshal(e.Data, &c)
	msg := taskEnd{EventType: e.Type, EventID: e.ID, TaskID: id, URI: taskURI(id), Status: c.Status, Summary: c.Summary, ErrorMessage: c.ErrorMessage}
	for _, f := range c.OutputFiles {
		msg.OutputFiles = append(msg.OutputFiles, f.Name)
	}
	for _, ss := range spawners {
		ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
		if err := ss.Log(ctx, &mcp.LoggingMessageParams{Level: "notice", Logger: "corral", Data: msg}); err != nil {
			s.log.Debug("task end notification not sent", logkey.TaskID, id, logkey.Error, err)
		}
		cancel()
	}
}

// taskEnd is the data of the logging notification of a task's end: what
// the host needs to decide what to do next without reading the task.
type taskEnd struct {
	EventType    string      `json:"event_type"`
	EventID      string      `json:"event_id"`
	TaskID       string      `json:"task_id"`
	URI          string      `json:"uri"`
	Status       task.Status `json:"status"`
	Summary      string      `json:"summary,omitempty"`
	ErrorMessage string      `json:"error_message,omitempty"`
	OutputFiles  []string    `json:"output_files,omitempty"`
}
