// Package execagent runs a session's commands from inside its sandbox. The
// agent (Run) is the sandbox's main process: it dials the server's unix
// socket (mounted into every sandbox), upgrades one HTTP request to a
// stream and then runs the commands the server sends over it, sending
// their output back as it comes. The server side (Conn) multiplexes any
// number of commands over that one connection. Dialling out works on every
// runtime (gVisor lets a sandbox connect to a host socket, not offer one),
// and a command started this way is a child of the sandbox's own process,
// under its seccomp filter and no_new_privs, which a command entered with
// nsenter is not. A server that restarts is dialled again.
//
// The protocol is JSON lines (Frame) in both directions.
package execagent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/errdefs"
)

// MaxFrame bounds one frame from the agent: its output comes in chunks of
// 32 KiB, base64-encoded in a line of JSON.
const MaxFrame = 1 << 20

// maxError bounds the error text an exit frame carries.
const maxError = 1024

// Upgrade is the protocol name of the upgraded connection.
const Upgrade = "corral-exec/1"

// Frame is one message. From the server: start (ID, Argv, Dir, Env,
// Stdin) and kill (ID). From the agent: out (ID, FD 1 or 2, Data) and exit
// (ID, Code, Error).
type Frame struct {
	Op    string   `json:"op"`
	ID    string   `json:"id"`
	Argv  []string `json:"argv,omitempty"`
	Dir   string   `json:"dir,omitempty"`
	Env   []string `json:"env,omitempty"`
	Stdin []byte   `json:"stdin,omitempty"`
	FD    int      `json:"fd,omitempty"`
	Data  []byte   `json:"data,omitempty"`
	Code  int      `json:"code,omitempty"`
	Error string   `json:"error,omitempty"`
}

// Run is the agent: it dials socket, asks path (the session's agent route)
// with token, and serves commands until ctx is done, dialling again when
// the connection ends. env is every command's base environment.
func Run(ctx context.Context, dial func(ctx context.Context) (net.Conn, error), path, token string, env []string, log *slog.Logger) error {
	const first = 10 * time.Millisecond
	delay := first
	for ctx.Err() == nil {
		served, err := serveOnce(ctx, dial, path, token, env)
		if ctx.Err() != nil {
			return nil
		}
		if served {
			// A connection that worked: the server restarted, say.
			// Dial the next one as soon as the first time.
			delay = first
		}
		log.Debug("exec agent: connection ended; dialling again", "err", err, "in", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
	return nil
}

// serveOnce dials, upgrades and serves one connection; served says the
// server took it.
func serveOnce(ctx context.Context, dial func(ctx context.Context) (net.Conn, error), path, token string, env []string) (served bool, err error) {
	conn, err := dial(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	req := "POST " + path + " HTTP/1.1\r\nHost: corral\r\nAuthorization: Bearer " + token +
		"\r\nConnection: Upgrade\r\nUpgrade: " + Upgrade + "\r\nContent-Length: 0\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		return false, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return false, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		resp.Body.Close()
		return false, fmt.Errorf("the server answered %s", resp.Status)
	}
	a := &agent{enc: json.NewEncoder(conn), env: env, procs: map[string]*exec.Cmd{}, killed: map[string]bool{}}
	dec := json.NewDecoder(br)
	for {
		var f Frame
		if err := dec.Decode(&f); err != nil {
			a.killAll()
			return true, err
		}
		switch f.Op {
		case "start":
			// Known before its goroutine runs: a kill that comes
			// before the command has started ends it as it starts.
			a.mu.Lock()
			a.procs[f.ID] = nil
			a.mu.Unlock()
			go a.start(f)
		case "kill":
			a.kill(f.ID)
		}
	}
}

// agent is one connection's commands.
type agent struct {
	env []string

	mu    sync.Mutex // guards enc, procs and killed
	enc   *json.Encoder
	procs map[string]*exec.Cmd // by id; nil until the command has started
	// killed are the commands a kill came for before they had started.
	killed map[string]bool
}

func (a *agent) send(f Frame) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.enc.Encode(f)
}

// start runs one command and reports its output and end.
func (a *agent) start(f Frame) {
	if len(f.Argv) == 0 {
		a.forget(f.ID)
		a.send(Frame{Op: "exit", ID: f.ID, Code: 127, Error: "empty command"})
		return
	}
	cmd := exec.Command(f.Argv[0], f.Argv[1:]...)
	cmd.Dir = f.Dir
	cmd.Env = append(append([]string(nil), a.env...), f.Env...)
	cmd.Stdin = strings.NewReader(string(f.Stdin))
	// Its own process group, so kill ends what it started too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	outs := make([]io.ReadCloser, 2)
	for i, pipe := range []func() (io.ReadCloser, error){cmd.StdoutPipe, cmd.StderrPipe} {
		r, err := pipe()
		if err != nil {
			a.forget(f.ID)
			a.send(Frame{Op: "exit", ID: f.ID, Code: 127, Error: err.Error()})
			return
		}
		outs[i] = r
	}
	if err := cmd.Start(); err != nil {
		code := 126
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, syscall.ENOENT) {
			code = 127
		}
		a.forget(f.ID)
		a.send(Frame{Op: "exit", ID: f.ID, Code: code, Error: err.Error()})
		return
	}
	a.mu.Lock()
	a.procs[f.ID] = cmd
	killed := a.killed[f.ID]
	a.mu.Unlock()
	if killed {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	var wg sync.WaitGroup
	for i, r := range outs {
		wg.Go(func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := r.Read(buf)
				if n > 0 {
					a.send(Frame{Op: "out", ID: f.ID, FD: i + 1, Data: append([]byte(nil), buf[:n]...)})
				}
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	err := cmd.Wait()
	a.forget(f.ID)
	code := cmd.ProcessState.ExitCode()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	msg := ""
	if err != nil && code < 0 {
		msg = err.Error()
	}
	a.send(Frame{Op: "exit", ID: f.ID, Code: code, Error: msg})
}

// forget drops command id, which has ended or never started.
func (a *agent) forget(id string) {
	a.mu.Lock()
	delete(a.procs, id)
	delete(a.killed, id)
	a.mu.Unlock()
}

// kill ends command id and what it started; one that has not started yet
// is killed as it starts.
func (a *agent) kill(id string) {
	a.mu.Lock()
	cmd, known := a.procs[id]
	if known && cmd == nil {
		a.killed[id] = true
	}
	a.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

func (a *agent) killAll() {
	a.mu.Lock()
	ids := make([]string, 0, len(a.procs))
	for id := range a.procs {
		ids = append(ids, id)
	}
	a.mu.Unlock()
	for _, id := range ids {
		a.kill(id)
	}
}

// Conn is the server's side of one agent's connection. It is safe for
// concurrent use.
type Conn struct {
	conn net.Conn

	mu     sync.Mutex // guards enc, execs, next
	enc    *json.Encoder
	execs  map[string]*pending
	next   int
	closed chan struct{}
}

// pending is one Exec's frames, and done, closed when it has returned.
type pending struct {
	frames chan Frame
	done   chan struct{}
}

// NewConn serves an agent's upgraded connection; r reads what the agent
// sends (the hijacked connection's buffered reader).
func NewConn(conn net.Conn, r io.Reader) *Conn {
	c := &Conn{conn: conn, enc: json.NewEncoder(conn), execs: map[string]*pending{}, closed: make(chan struct{})}
	go c.read(r)
	return c
}

// Done is closed when the connection has ended.
func (c *Conn) Done() <-chan struct{} { return c.closed }

// Close ends the connection.
func (c *Conn) Close() error { return c.conn.Close() }

func (c *Conn) read(r io.Reader) {
	defer close(c.closed)
	defer c.conn.Close()
	// The agent is inside the sandbox: what it sends is hostile. A frame is
	// one line of at most MaxFrame bytes; a longer one ends the connection.
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), MaxFrame)
	for sc.Scan() {
		var f Frame
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			return
		}
		f.Error = clip.String(strings.ToValidUTF8(f.Error, "\uFFFD"), maxError)
		c.mu.Lock()
		p := c.execs[f.ID]
		c.mu.Unlock()
		if p != nil {
			select {
			case p.frames <- f:
			case <-p.done: // its Exec has returned: nobody reads on
			}
		}
	}
}

func (c *Conn) send(f Frame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.enc.Encode(f)
}

// Exec runs argv in dir with env added, feeding stdin, and streams its
// output to stdout and stderr; it returns the exit code. When ctx ends the
// command is killed and Exec returns ctx's error.
func (c *Conn) Exec(ctx context.Context, argv []string, dir string, env []string, stdin []byte, stdout, stderr io.Writer) (int, error) {
	p := &pending{frames: make(chan Frame, 64), done: make(chan struct{})}
	ch := p.frames
	c.mu.Lock()
	c.next++
	id := fmt.Sprintf("e%d", c.next)
	c.execs[id] = p
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.execs, id)
		c.mu.Unlock()
		close(p.done)
	}()
	if err := c.send(Frame{Op: "start", ID: id, Argv: argv, Dir: dir, Env: env, Stdin: stdin}); err != nil {
		return -1, fmt.Errorf("the session's exec agent: %v: %w", err, errdefs.ErrUnavailable)
	}
	done := ctx.Done()
	var gone <-chan time.Time // after a kill: how long the exit may take
	for {
		select {
		case <-gone:
			return -1, ctx.Err()
		case f := <-ch:
			switch f.Op {
			case "out":
				w := stdout
				if f.FD == 2 {
					w = stderr
				}
				if w != nil {
					w.Write(f.Data)
				}
			case "exit":
				if ctx.Err() != nil {
					return f.Code, ctx.Err()
				}
				if f.Error != "" && f.Code >= 126 {
					return f.Code, fmt.Errorf("%s: %w", f.Error, errdefs.ErrFailedPrecondition)
				}
				return f.Code, nil
			}
		case <-done:
			c.send(Frame{Op: "kill", ID: id})
			done = nil
			gone = time.After(5 * time.Second)
			// The exit frame follows the kill; a connection that is gone
			// ends the wait below.
		case <-c.closed:
			if ctx.Err() != nil {
				return -1, ctx.Err()
			}
			return -1, fmt.Errorf("the session's exec agent went away: %w", errdefs.ErrUnavailable)
		}
	}
}
