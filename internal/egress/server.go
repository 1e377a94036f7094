package egress

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/logkey"
)

// SocketName is the proxy's socket in a task's directory.
const SocketName = "proxy.sock"

// maxSocketPath is the longest unix socket path Linux takes (108 bytes
// with the terminating NUL), less a margin.
const maxSocketPath = 104

// Server runs one Proxy per task, each on a unix socket of its own at
// Dir/<task id>/proxy.sock. The task's directory, not the socket, is what a
// sandbox mounts: a restarted server makes a new socket in the same
// directory, and the sandbox sees it. Sandboxes on other machines reach
// the same proxies over TCP instead (ServeTCP).
//
// Lifecycle of a task's listener: Open creates the directory and starts
// listening (again, after a restart: Open is idempotent and replaces a
// stale socket file); Shutdown stops every listener but keeps the
// directories, since running sandboxes hold them mounted; Close stops the
// task's listener, ends its tunnels and removes its directory, for a task
// that ended. Server is safe for concurrent use.
type Server struct {
	dir  string
	opts Options
	log  *slog.Logger

	mu    sync.Mutex
	tasks map[string]*taskProxy
	down  bool
}

type taskProxy struct {
	proxy *Proxy
	srv   *http.Server
	ln    net.Listener
	join  *joinListener // ln's source: the socket and ServeTCP's connections
	done  chan struct{}
	// dirFile holds the directory open while the listener lives, when the
	// socket was bound through /proc/self/fd (see listenUnix); nil if not.
	dirFile *os.File
}

// NewServer returns a server whose task directories live under dir, which
// it creates.
func NewServer(dir string, opts Options, log *slog.Logger) (*Server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create egress directory: %w", err)
	}
	opts.defaults()
	return &Server{dir: dir, opts: opts, log: log, tasks: map[string]*taskProxy{}}, nil
}

// Dir returns the host directory holding the socket of task id.
func (s *Server) Dir(id string) string { return filepath.Join(s.dir, id) }

func checkID(id string) error {
	if id == "" || id == "." || id == ".." || strings.ContainsAny(id, "/\\\x00") {
		return fmt.Errorf("task id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Open starts the proxy of task id under policy, listening on the task's
// socket, and returns the task's directory. If the task's proxy already
// listens, Open returns its directory and keeps its policy.
func (s *Server) Open(id string, policy Policy) (string, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	dir := s.Dir(id)
	sock := filepath.Join(dir, SocketName)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return "", fmt.Errorf("open egress proxy for task %s: the server is shutting down: %w", id, errdefs.ErrUnavailable)
	}
	if _, ok := s.tasks[id]; ok {
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create egress directory of task %s: %w", id, err)
	}
	// The directory may be mounted in a sandbox already (a restarted
	// server): a socket file left by the last server cannot be listened on
	// again, so it goes first.
	if err := os.Remove(sock); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("remove stale egress socket of task %s: %w", id, err)
	}
	ln, dirFile, err := listenUnix(dir, SocketName)
	if err != nil {
		return "", fmt.Errorf("listen on egress socket of task %s: %w", id, err)
	}
	// The sandbox's user must be able to connect; the directory is
	// reachable only by what mounts it or can already read the data root.
	if err := os.Chmod(sock, 0o666); err != nil {
		ln.Close()
		closeFile(dirFile)
		return "", fmt.Errorf("open egress socket of task %s to its sandbox: %w", id, err)
	}
	log := s.log.With(logkey.TaskID, id)
	p := NewProxy(id, policy, s.opts, s.log)
	join := newJoinListener(ln)
	tp := &taskProxy{
		proxy: p,
		join:  join,
		ln:    &limitListener{Listener: join, sem: make(chan struct{}, 2*s.opts.MaxConns)},
		srv: &http.Server{
			Handler:           p,
			ReadHeaderTimeout: s.opts.ReadHeaderTimeout,
			IdleTimeout:       s.opts.IdleTimeout,
			MaxHeaderBytes:    s.opts.MaxHeaderBytes,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		},
		done:    make(chan struct{}),
		dirFile: dirFile,
	}
	go func() {
		defer close(tp.done)
		if err := tp.srv.Serve(tp.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("egress proxy stopped", logkey.Error, err)
		}
	}()
	s.tasks[id] = tp
	log.Debug("egress proxy listening", "socket", sock, "open", policy.Open, "allow", len(policy.Allow))
	return dir, nil
}

// stop closes a task's listener, its idle connections and its tunnels, and
// waits for Serve to return. Requests being forwarded end on their own
// deadlines.
func (tp *taskProxy) stop() {
	tp.srv.Close() // closes the listener, which removes the socket file
	tp.proxy.CloseTunnels()
	<-tp.done
	closeFile(tp.dirFile)
}

func closeFile(f *os.File) {
	if f != nil {
		f.Close()
	}
}

// listenUnix listens on the unix socket name in dir. A socket path holds
// at most 107 bytes, and a data root deep in the file system with a task
// id (31 bytes) goes over: then the socket is bound through the short
// /proc/self/fd/N/name of the directory opened, and the directory stays
// open (returned) until the listener closes, which removes the socket by
// that same path.
func listenUnix(dir, name string) (net.Listener, *os.File, error) {
	if p := filepath.Join(dir, name); len(p) <= maxSocketPath {
		ln, err := net.Listen("unix", p)
		return ln, nil, err
	}
	d, err := os.Open(dir)
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("unix", fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), name))
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	return ln, d, nil
}

// Close stops the proxy of task id and removes its directory. Closing a
// task that has no proxy removes its directory if there is one.
func (s *Server) Close(id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	s.mu.Lock()
	tp := s.tasks[id]
	delete(s.tasks, id)
	s.mu.Unlock()
	if tp != nil {
		tp.stop()
	}
	if err := os.RemoveAll(s.Dir(id)); err != nil {
		return fmt.Errorf("remove egress directory of task %s: %w", id, err)
	}
	return nil
}

// Tasks returns the ids of the tasks with a directory here, open or not
// (a directory outlives a server that stopped), sorted.
func (s *Server) Tasks() ([]string, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("list egress directories: %w", err)
	}
	ids := make([]string, 0, len(ents))
	for _, e := range ents {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// SetPolicy gives the proxy of task id policy from now on (Proxy.SetPolicy).
// A task whose proxy does not listen here is ErrNotFound.
func (s *Server) SetPolicy(id string, policy Policy) error {
	s.mu.Lock()
	tp := s.tasks[id]
	s.mu.Unlock()
	if tp == nil {
		return fmt.Errorf("task %s has no egress proxy here: %w", id, errdefs.ErrNotFound)
	}
	tp.proxy.SetPolicy(policy)
	s.log.Info("egress policy changed", logkey.TaskID, id, "open", policy.Open, "allow", len(policy.Allow), "models", len(policy.Models))
	return nil
}

// Listening reports whether task id's proxy listens.
func (s *Server) Listening(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.tasks[id]
	return ok
}

// Shutdown stops every proxy and refuses to open more. It keeps the task
// directories: their sandboxes may outlive this server, and the next one
// listens in the same directories again.
func (s *Server) Shutdown() {
	s.mu.Lock()
	s.down = true
	tps := s.tasks
	s.tasks = map[string]*taskProxy{}
	s.mu.Unlock()
	for _, tp := range tps {
		tp.stop()
	}
}

// limitListener closes connections over its limit as soon as they are
// accepted, so that a worker cannot hold an unbounded number of idle
// connections to the server.
type limitListener struct {
	net.Listener
	sem chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.sem <- struct{}{}:
			return &releaseConn{Conn: c, release: func() { <-l.sem }}, nil
		default:
			c.Close()
		}
	}
}

type releaseConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *releaseConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite half-closes the connection, for tunnels.
func (c *releaseConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
