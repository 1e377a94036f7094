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
// Commands outlive the connection: the agent keeps running them when the
// server goes away, and keeps their output the server has not
// acknowledged (up to MaxUnacked bytes a command, the oldest dropped past
// it). Every byte of a command's output has an offset. When it dials in
// again, the agent says which commands it has (hello); the server answers
// each with the offset it has (resume), and the agent sends the rest, and
// the command's exit, from there; or tells it to kill and forget one it
// does not know.
//
// Before its sandbox is checkpointed, the server parks the agent: the agent
// closes its connection (a connected host socket cannot be saved) and
// dials again only on SIGCONT, which the runtime sends once the sandbox
// runs again (restored, or on after a checkpoint that failed), or after
// parkMax.
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
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/errdefs"
)

// MaxFrame bounds one frame from the agent: its output comes in chunks of
// 32 KiB, base64-encoded in a line of JSON, and a hello names at most
// maxHello commands.
const MaxFrame = 1 << 20

// MaxUnacked bounds the output of one command the agent keeps for a
// server that has not acknowledged it (one that went away meanwhile).
const MaxUnacked = 8 << 20

// maxError bounds the error text an exit frame carries.
const maxError = 1024

// maxHello bounds the commands a hello names.
const maxHello = 1024

// Upgrade is the protocol name of the upgraded connection.
const Upgrade = "corral-exec/2"

// Frame is one message. From the server: start (ID, Argv, Dir, Env,
// Stdin), kill (ID), resume (ID, Off: send from there), ack (ID, Off: the
// server has the output before it), forget (ID: the server has the
// command's exit) and park (close the connection and dial again on
// SIGCONT). From the agent: hello (Execs, first on a connection),
// out (ID, FD 1 or 2, Off, Data) and exit (ID, Code, Error, Off: the
// output's length).
type Frame struct {
	Op    string      `json:"op"`
	ID    string      `json:"id,omitempty"`
	Argv  []string    `json:"argv,omitempty"`
	Dir   string      `json:"dir,omitempty"`
	Env   []string    `json:"env,omitempty"`
	Stdin []byte      `json:"stdin,omitempty"`
	FD    int         `json:"fd,omitempty"`
	Off   int64       `json:"off,omitempty"`
	Data  []byte      `json:"data,omitempty"`
	Code  int         `json:"code,omitempty"`
	Error string      `json:"error,omitempty"`
	Execs []ExecState `json:"execs,omitempty"`
}

// ExecState is a command a hello names: its id, the offset of its next
// byte, and whether it has ended.
type ExecState struct {
	ID    string `json:"id"`
	Off   int64  `json:"off"`
	Ended bool   `json:"ended,omitempty"`
}

// Run is the agent: it dials socket, asks path() (the session's agent
// route, asked again before each dial) with token, and serves commands until ctx is done, dialling again when
// the connection ends. env is every command's base environment. park, if
// not nil, is called with true when the server parks the agent, before it
// closes its connection (the egress relay lets go of its own), and with
// false when it wakes.
func Run(ctx context.Context, dial func(ctx context.Context) (net.Conn, error), path func() string, token string, env []string, park func(bool), log *slog.Logger) error {
	if park == nil {
		park = func(bool) {}
	}
	const first = 10 * time.Millisecond
	delay := first
	a := &agent{env: env, execs: map[string]*command{}}
	defer a.stopAll(stopWait)
	wake := make(chan os.Signal, 1)
	signal.Notify(wake, syscall.SIGCONT)
	defer signal.Stop(wake)
	for ctx.Err() == nil {
		served, err := a.serveOnce(ctx, dial, path, token, wake, park)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errParked) {
			log.Debug("exec agent: parked until SIGCONT")
			select {
			case <-ctx.Done():
				return nil
			case <-wake:
			case <-time.After(parkMax):
			}
			park(false)
			delay = first
			continue
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

// stopWait bounds how long a stopping agent waits for its commands to end
// after their SIGTERM; the sandbox's runtime kills everything once its
// grace (limits.stop_grace) is over, mostly sooner.
const stopWait = time.Minute

// parkMax bounds how long a parked agent waits for its SIGCONT: a server
// that died while it checkpointed the sandbox sends none.
const parkMax = time.Minute

// errParked ends a connection the server parked.
var errParked = errors.New("parked")

// serveOnce dials, upgrades and serves one connection; served says the
// server took it, errParked that it parked the agent. The commands go on
// when it ends.
func (a *agent) serveOnce(ctx context.Context, dial func(ctx context.Context) (net.Conn, error), path func() string, token string, wake <-chan os.Signal, park func(bool)) (served bool, err error) {
	conn, err := dial(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	req := "POST " + path() + " HTTP/1.1\r\nHost: corral\r\nAuthorization: Bearer " + token +
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
	a.attach(json.NewEncoder(conn))
	defer a.detach()
	dec := json.NewDecoder(br)
	for {
		var f Frame
		if err := dec.Decode(&f); err != nil {
			return true, err
		}
		switch f.Op {
		case "start":
			a.start(f)
		case "kill":
			a.kill(f.ID)
		case "resume":
			a.resume(f.ID, f.Off)
		case "ack":
			a.ack(f.ID, f.Off)
		case "forget":
			a.forget(f.ID)
		case "park":
			// A SIGCONT from before (a checkpoint that failed) must not
			// wake this park.
			select {
			case <-wake:
			default:
			}
			park(true)
			return true, errParked
		}
	}
}

// agent is the commands of a session, across its connections.
type agent struct {
	env []string

	mu    sync.Mutex // guards enc, execs
	enc   *json.Encoder
	execs map[string]*command
}

// command is one command the agent runs or ran.
type command struct {
	cmd *exec.Cmd // nil until started
	// killed: a kill came before the command had started.
	killed bool
	// next is the offset of the command's next byte of output.
	next int64
	// unacked are its out frames the server has not acknowledged, in
	// order, unackedBytes their data.
	unacked      []Frame
	unackedBytes int
	// exit is its end, once it has ended.
	exit *Frame
	// paused: the server has not said where to go on from since this
	// connection began; frames wait in unacked.
	paused bool
	// ended is closed once the command has ended (exit is set).
	ended chan struct{}
}

// attach makes enc the connection frames go to, and says hello: the
// commands the agent has, each paused until the server resumes it.
func (a *agent) attach(enc *json.Encoder) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.enc = enc
	hello := Frame{Op: "hello", Execs: []ExecState{}}
	for id, c := range a.execs {
		c.paused = true
		hello.Execs = append(hello.Execs, ExecState{ID: id, Off: c.next, Ended: c.exit != nil})
	}
	a.sendLocked(hello)
}

func (a *agent) detach() {
	a.mu.Lock()
	a.enc = nil
	a.mu.Unlock()
}

// sendLocked sends f on the connection, if there is one; the caller holds
// mu. A connection that fails to take it is dropped until the next.
func (a *agent) sendLocked(f Frame) {
	if a.enc != nil && a.enc.Encode(f) != nil {
		a.enc = nil
	}
}

// start runs one command and reports its output and end.
func (a *agent) start(f Frame) {
	a.mu.Lock()
	if _, dup := a.execs[f.ID]; dup || f.ID == "" {
		a.mu.Unlock()
		return
	}
	// Known before its goroutine runs: a kill that comes before the
	// command has started ends it as it starts.
	c := &command{ended: make(chan struct{})}
	a.execs[f.ID] = c
	a.mu.Unlock()
	go a.run(f, c)
}

func (a *agent) run(f Frame, c *command) {
	if len(f.Argv) == 0 {
		a.exited(f.ID, c, 127, "empty command")
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
			a.exited(f.ID, c, 127, err.Error())
			return
		}
		outs[i] = r
	}
	if err := cmd.Start(); err != nil {
		code := 126
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, syscall.ENOENT) {
			code = 127
		}
		a.exited(f.ID, c, code, err.Error())
		return
	}
	a.mu.Lock()
	c.cmd = cmd
	killed := c.killed
	a.mu.Unlock()
	if killed {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	// One reader at a time hands its chunk over, so that offsets follow
	// the order the chunks are sent in.
	var wg sync.WaitGroup
	for i, r := range outs {
		wg.Go(func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := r.Read(buf)
				if n > 0 {
					a.output(f.ID, c, i+1, buf[:n])
				}
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	err := cmd.Wait()
	code := cmd.ProcessState.ExitCode()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	msg := ""
	if err != nil && code < 0 {
		msg = err.Error()
	}
	a.exited(f.ID, c, code, msg)
}

// output keeps a chunk of command id's output until the server
// acknowledges it, and sends it unless the command is paused.
func (a *agent) output(id string, c *command, fd int, data []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f := Frame{Op: "out", ID: id, FD: fd, Off: c.next, Data: append([]byte(nil), data...)}
	c.next += int64(len(data))
	c.unacked = append(c.unacked, f)
	c.unackedBytes += len(data)
	for c.unackedBytes > MaxUnacked && len(c.unacked) > 1 {
		// The oldest goes: the server finds a gap there.
		c.unackedBytes -= len(c.unacked[0].Data)
		c.unacked = c.unacked[1:]
	}
	if !c.paused && a.execs[id] == c {
		a.sendLocked(f)
	}
}

// exited records command id's end and sends it unless it is paused.
func (a *agent) exited(id string, c *command, code int, msg string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c.exit = &Frame{Op: "exit", ID: id, Code: code, Error: msg, Off: c.next}
	close(c.ended)
	if !c.paused && a.execs[id] == c {
		a.sendLocked(*c.exit)
	}
}

// resume sends command id's output from off on, as far as the agent has
// it (a server that lost more finds a gap at the first offset sent), and
// its exit if it has ended; then its output flows again.
func (a *agent) resume(id string, off int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.execs[id]
	if c == nil {
		return
	}
	c.paused = false
	for _, f := range c.unacked {
		if end := f.Off + int64(len(f.Data)); end > off {
			if f.Off < off {
				cut := off - f.Off
				f.Off, f.Data = off, f.Data[cut:]
			}
			a.sendLocked(f)
		}
	}
	if c.exit != nil {
		a.sendLocked(*c.exit)
	}
}

// ack drops what the server has of command id's output.
func (a *agent) ack(id string, off int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.execs[id]
	if c == nil {
		return
	}
	for len(c.unacked) > 0 && c.unacked[0].Off+int64(len(c.unacked[0].Data)) <= off {
		c.unackedBytes -= len(c.unacked[0].Data)
		c.unacked = c.unacked[1:]
	}
}

// forget drops command id: the server has its end, or does not know it
// (and has killed it).
func (a *agent) forget(id string) {
	a.mu.Lock()
	delete(a.execs, id)
	a.mu.Unlock()
}

// kill ends command id and what it started; one that has not started yet
// is killed as it starts.
func (a *agent) kill(id string) {
	a.mu.Lock()
	c := a.execs[id]
	var cmd *exec.Cmd
	if c != nil {
		c.killed = true
		cmd = c.cmd
	}
	a.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

// stopAll ends every command as the agent stops (its sandbox is stopped,
// with SIGTERM): each running command's group gets SIGTERM, as a task's
// agent does, and the agent waits up to wait for them all to end, so that
// a command that cleans up on SIGTERM (a server flushing its files) may;
// then it kills what is left.
func (a *agent) stopAll(wait time.Duration) {
	a.mu.Lock()
	var ended []chan struct{}
	for _, c := range a.execs {
		if c.exit != nil {
			continue
		}
		ended = append(ended, c.ended)
		if c.cmd != nil && c.cmd.Process != nil {
			syscall.Kill(-c.cmd.Process.Pid, syscall.SIGTERM)
		} else {
			c.killed = true // not started: killed as it starts
		}
	}
	a.mu.Unlock()
	t := time.NewTimer(wait)
	defer t.Stop()
waiting:
	for _, ch := range ended {
		select {
		case <-ch:
		case <-t.C:
			break waiting
		}
	}
	a.killAll()
}

// killAll ends every command: the agent is stopping.
func (a *agent) killAll() {
	a.mu.Lock()
	ids := make([]string, 0, len(a.execs))
	for id := range a.execs {
		ids = append(ids, id)
	}
	a.mu.Unlock()
	for _, id := range ids {
		a.kill(id)
	}
}

// Handler is what a Conn does with what the agent sends. Its methods are
// called on the connection's reading goroutine, one at a time.
type Handler interface {
	// Hello says which commands the agent has, after it dialled in;
	// Resume follows for each.
	Hello(execs []ExecState)
	// Resume answers for command id of a hello: the offset from which the
	// server wants its output, or false for a command it does not know,
	// which the agent is told to kill and forget.
	Resume(id string) (off int64, ok bool)
	// Output is a chunk of command id's output at offset off; it returns
	// the offset up to which the server now has the output (what the
	// agent may drop).
	Output(id string, fd int, off int64, data []byte) int64
	// Exit is command id's end, after all its output (off bytes).
	Exit(id string, code int, msg string, off int64)
}

// Conn is the server's side of one agent's connection. It is safe for
// concurrent use.
type Conn struct {
	conn   net.Conn
	r      io.Reader
	h      Handler
	wmu    sync.Mutex // guards enc: one frame at a time
	enc    *json.Encoder
	mu     sync.Mutex // guards acks
	closed chan struct{}
	// acks are the acknowledgements not sent yet, by command: the reading
	// goroutine never waits on a write (the agent may be writing to it
	// while holding what its reader waits for), ackSignal wakes their
	// writer.
	acks      map[string]int64
	ackSignal chan struct{}
}

// NewConn returns the server's side of an agent's upgraded connection;
// r reads what the agent sends (the hijacked connection's buffered
// reader), which goes to h once Serve is called.
func NewConn(conn net.Conn, r io.Reader, h Handler) *Conn {
	return &Conn{conn: conn, r: r, h: h, enc: json.NewEncoder(conn), closed: make(chan struct{}), acks: map[string]int64{}, ackSignal: make(chan struct{}, 1)}
}

// Serve starts taking what the agent sends; it returns at once.
func (c *Conn) Serve() {
	go c.read(c.r)
	go c.sendAcks()
}

// ackLater queues an acknowledgement of command id's output up to off.
func (c *Conn) ackLater(id string, off int64) {
	c.mu.Lock()
	c.acks[id] = max(c.acks[id], off)
	c.mu.Unlock()
	select {
	case c.ackSignal <- struct{}{}:
	default:
	}
}

// sendAcks sends the queued acknowledgements until the connection ends.
func (c *Conn) sendAcks() {
	for {
		select {
		case <-c.closed:
			return
		case <-c.ackSignal:
		}
		c.mu.Lock()
		acks := c.acks
		c.acks = map[string]int64{}
		c.mu.Unlock()
		for id, off := range acks {
			if c.send(Frame{Op: "ack", ID: id, Off: off}) != nil {
				return
			}
		}
	}
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
		switch f.Op {
		case "hello":
			if len(f.Execs) > maxHello {
				return
			}
			c.h.Hello(f.Execs)
			for _, e := range f.Execs {
				if off, ok := c.h.Resume(e.ID); ok {
					c.send(Frame{Op: "resume", ID: e.ID, Off: off})
				} else {
					c.send(Frame{Op: "kill", ID: e.ID})
					c.send(Frame{Op: "forget", ID: e.ID})
				}
			}
		case "out":
			if f.FD != 1 && f.FD != 2 || f.Off < 0 {
				return
			}
			if has := c.h.Output(f.ID, f.FD, f.Off, f.Data); has > 0 {
				c.ackLater(f.ID, has)
			}
		case "exit":
			c.h.Exit(f.ID, f.Code, clip.String(strings.ToValidUTF8(f.Error, "\uFFFD"), maxError), f.Off)
			c.send(Frame{Op: "forget", ID: f.ID})
		}
	}
}

func (c *Conn) send(f Frame) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.enc.Encode(f); err != nil {
		return fmt.Errorf("the session's exec agent: %v: %w", err, errdefs.ErrUnavailable)
	}
	return nil
}

// Start starts command id (an id of the server's, unique in the session):
// argv in dir with env added, fed stdin. Its output and exit go to the
// Handler.
func (c *Conn) Start(id string, argv []string, dir string, env []string, stdin []byte) error {
	return c.send(Frame{Op: "start", ID: id, Argv: argv, Dir: dir, Env: env, Stdin: stdin})
}

// Kill ends command id and what it started.
func (c *Conn) Kill(id string) error { return c.send(Frame{Op: "kill", ID: id}) }

// Park has the agent close its connection, and waits until it has: its
// sandbox can then be checkpointed. The agent dials again on SIGCONT.
func (c *Conn) Park(ctx context.Context) error {
	if err := c.send(Frame{Op: "park"}); err != nil {
		return err
	}
	select {
	case <-c.closed:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("the session's exec agent did not close its connection when parked: %w", context.Cause(ctx))
	}
}
