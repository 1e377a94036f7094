package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
	"github.com/corral-dev/corral/internal/execagent/execagenttest"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/workspace"
)

// A token granted to a task reaches its session while the task runs and
// dies with the task: one the task left in a file (an output saved to
// shared/, say) reaches nothing afterwards, here and after a restart that
// folds the session's stream again. The session's own token lives on.
func TestGrantedTokenDiesWithItsTask(t *testing.T) {
	ctx := context.Background()
	store := sqlitetest.Open(t)
	var mu sync.Mutex
	ended := map[string]bool{}
	opts := Options{Store: store, TaskEnded: func(id string) bool {
		mu.Lock()
		defer mu.Unlock()
		e, known := ended[id]
		return !known || e
	}}
	m := New(opts, slog.New(slog.DiscardHandler))
	own := newToken()
	const id = "sess-01m8jbh60d7qh1g11cxcbgpmzh"
	if err := m.append(ctx, id, EventCreated, created{Session: Session{ID: id, Status: StatusRunning}, TokenHash: hashToken(own), AgentTokenHash: hashToken(newToken())}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	ended["task-a"], ended["task-b"] = false, false
	mu.Unlock()
	a, err := m.Grant(ctx, id, "task-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Grant(ctx, id, "task-b")
	if err != nil {
		t.Fatal(err)
	}
	if !m.Authorize(id, a) || !m.Authorize(id, b) || !m.Authorize(id, own) {
		t.Fatalf("tokens of running tasks and the session's own refused")
	}
	mu.Lock()
	ended["task-a"] = true
	mu.Unlock()
	if m.Authorize(id, a) {
		t.Errorf("the token of an ended task reaches its session")
	}
	if !m.Authorize(id, b) || !m.Authorize(id, own) {
		t.Errorf("another task's token, or the session's own, refused after one task ended")
	}
	// A restart folds the stream again: the same answers.
	again := New(opts, slog.New(slog.DiscardHandler))
	evs, err := store.ReadStream(ctx, StreamID(id), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		again.apply(e)
	}
	if again.Authorize(id, a) || !again.Authorize(id, b) || !again.Authorize(id, own) {
		t.Errorf("after a restart: ended task's token %v, running task's %v, session's own %v; want false, true, true",
			again.Authorize(id, a), again.Authorize(id, b), again.Authorize(id, own))
	}
	// A task the server does not know (its events gone) grants nothing.
	mu.Lock()
	delete(ended, "task-b")
	mu.Unlock()
	if m.Authorize(id, b) {
		t.Errorf("the token of an unknown task reaches its session")
	}
}

// failStarts is a store whose disk fills just as an exec starts: it
// cannot append exec_started.
type failStarts struct{ eventstore.Store }

func (s failStarts) Append(ctx context.Context, stream string, expected int64, evs ...eventstore.Proposed) ([]eventstore.Event, error) {
	if len(evs) > 0 && evs[0].Type == EventExecStart {
		return nil, fmt.Errorf("append: %w", syscall.ENOSPC)
	}
	return s.Store.Append(ctx, stream, expected, evs...)
}

// An exec whose start cannot be recorded (the disk is full) answers an
// error saying so, and its command does not run: no command runs that the
// log does not know of. With a timeout too.
func TestExecStartNotRecorded(t *testing.T) {
	ctx := context.Background()
	store := sqlitetest.Open(t)
	m, id := agentSession(t, failStarts{store})
	for _, timeout := range []time.Duration{0, time.Minute} {
		pidFile := filepath.Join(t.TempDir(), "pid")
		start := time.Now()
		_, err := m.Exec(ctx, id, ExecRequest{Shell: "echo $$ > " + pidFile + "; exec sleep 30", Dir: filepath.Dir(pidFile), Timeout: timeout}, io.Discard, io.Discard)
		if err == nil || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "could not be recorded") {
			t.Fatalf("timeout %v: Exec: %v, want the start's failure", timeout, err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("timeout %v: Exec answered after %v: the command ran on", timeout, d)
		}
		// The command may have started before the append failed; then
		// it is gone now.
		if b, err := os.ReadFile(pidFile); err == nil {
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			for deadline := time.Now().Add(5 * time.Second); pid > 0 && syscall.Kill(pid, 0) == nil; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Errorf("timeout %v: the command (pid %d) still runs 5 s after its start failed to be recorded", timeout, pid)
					syscall.Kill(pid, syscall.SIGKILL)
					break
				}
			}
		}
	}
	evs, err := store.ReadStream(ctx, StreamID(id), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Type == EventExecEnd {
			t.Errorf("an exec_ended without its start: %s", e.Data)
		}
	}
}

// agentSession records a running session on store and attaches the exec
// agent, run on this host, to it: a Manager whose Exec runs commands here.
func agentSession(t *testing.T, store eventstore.Store) (*Manager, string) {
	t.Helper()
	data, err := workspace.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m := New(Options{Store: store, Data: data}, slog.New(slog.DiscardHandler))
	const id = "sess-01m8jbh60d7qh1g11cxcbgpmzh"
	recordSession(t, m, Session{ID: id, Status: StatusRunning})
	conn, br := execagenttest.Dial(t, []string{"PATH=/usr/bin:/bin"})
	if err := m.AttachAgent(context.Background(), id, true, upgraded(conn, br)); err != nil {
		t.Fatal(err)
	}
	return m, id
}

// upgraded is AttachAgent's upgrade of an agent's connection conn, which
// execagenttest.Dial upgraded already.
func upgraded(conn net.Conn, r io.Reader) func() (net.Conn, io.Reader, error) {
	return func() (net.Conn, io.Reader, error) { return conn, r, nil }
}

// slowStarts is a store whose exec_started takes a while to commit; it
// says when it has.
type slowStarts struct {
	eventstore.Store
	committed chan time.Time
}

func (s slowStarts) Append(ctx context.Context, stream string, expected int64, evs ...eventstore.Proposed) ([]eventstore.Event, error) {
	if len(evs) == 0 || evs[0].Type != EventExecStart {
		return s.Store.Append(ctx, stream, expected, evs...)
	}
	time.Sleep(300 * time.Millisecond)
	out, err := s.Store.Append(ctx, stream, expected, evs...)
	s.committed <- time.Now()
	return out, err
}

// firstWrite notes when its first byte came.
type firstWrite struct {
	mu sync.Mutex
	at time.Time
}

func (w *firstWrite) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.at.IsZero() {
		w.at = time.Now()
	}
	return len(p), nil
}

// An exec's output goes out only once its start is in the log: a client
// that saw a byte finds the exec there after any crash (then with the
// end "lost"). Output came first, and a server killed in between left a
// command the client had seen run and the log never named.
func TestExecOutputAfterItsStart(t *testing.T) {
	ctx := context.Background()
	slow := slowStarts{Store: sqlitetest.Open(t), committed: make(chan time.Time, 1)}
	m, id := agentSession(t, slow)
	out := &firstWrite{}
	end, err := m.Exec(ctx, id, ExecRequest{Shell: "echo at once", Dir: t.TempDir()}, out, io.Discard)
	if err != nil || end.ExitCode != 0 || end.StdoutBytes != 8 {
		t.Fatalf("Exec: %+v, %v", end, err)
	}
	committed := <-slow.committed
	if out.at.IsZero() || out.at.Before(committed) {
		t.Errorf("the first byte went out at %v, the start was committed at %v: output before the log names the exec", out.at, committed)
	}
}

// twoReplicas is a cluster of this replica and another, both alive.
type twoReplicas struct {
	*cluster.Solo
	other string
}

func (c twoReplicas) Alive(id string) (cluster.Replica, bool) {
	return cluster.Replica{ID: id}, id == c.Self() || id == c.other
}

// lapsing is a cluster of this replica and others, alive while view's
// last renewal lists them.
type lapsing struct {
	*cluster.Solo
	view *cluster.View
}

func (c lapsing) Alive(id string) (cluster.Replica, bool) {
	if id == c.Self() {
		return cluster.Replica{ID: id}, true
	}
	r, ok := c.view.Live()[id]
	return r, ok
}

func (c lapsing) Changed() <-chan struct{} { return c.view.Changed() }

// The exec agent of a session whose replica another counts alive is
// refused before its upgrade: at once over TCP (a load balancer may have
// sent it to the wrong replica), and over a host's unix socket (where it
// dials another replica only once its own is gone) once it waited for
// that replica's lease to lapse, or for its own request to end. Once the
// lease lapses, the held dial is upgraded and the session adopted.
func TestAgentOfAReplicaGoneHeldUntilItsLeaseLapses(t *testing.T) {
	view := &cluster.View{}
	view.Renewed(time.Now(), map[string]cluster.Replica{"r-self": {ID: "r-self"}, "r-other": {ID: "r-other"}})
	m := stopAllManager(t, sandboxtest.NewFake(), lapsing{Solo: cluster.NewSolo(cluster.Replica{ID: "r-self"}), view: view})
	const id = "sess-01m8jbh60d7qh1g11cxcbgpmzh"
	recordRunning(t, m, id, "r-other")
	upgrades := 0
	refused := func() (net.Conn, io.Reader, error) {
		upgrades++
		return nil, nil, errors.New("upgraded")
	}

	start := time.Now()
	if err := m.AttachAgent(context.Background(), id, false, refused); !errors.Is(err, errdefs.ErrFailedPrecondition) || upgrades != 0 {
		t.Errorf("over TCP: %v, %d upgrades; want refused as the other replica's, not upgraded", err, upgrades)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := m.AttachAgent(ctx, id, true, refused); !errors.Is(err, errdefs.ErrFailedPrecondition) || upgrades != 0 {
		t.Errorf("on the host's socket, its request gone: %v, %d upgrades; want refused, not upgraded", err, upgrades)
	}
	if took := time.Since(start); took < 300*time.Millisecond || took > 3*time.Second {
		t.Errorf("the refusals took %v; want the held one to end with its request (300 ms)", took)
	}

	conn, br := execagenttest.Dial(t, []string{"PATH=/usr/bin:/bin"})
	answer := make(chan error, 1)
	go func() {
		answer <- m.AttachAgent(context.Background(), id, true, func() (net.Conn, io.Reader, error) {
			upgrades++
			return conn, br, nil
		})
	}()
	select {
	case err := <-answer:
		t.Fatalf("the agent was answered while the session's replica was alive: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	view.Renewed(time.Now(), map[string]cluster.Replica{"r-self": {ID: "r-self"}})
	select {
	case err := <-answer:
		if err != nil || upgrades != 1 {
			t.Fatalf("the held agent, its session's replica gone: %v, %d upgrades; want attached", err, upgrades)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the held agent was not answered once the session's replica was gone")
	}
	if m.agent(id) == nil {
		t.Error("the agent is not attached")
	}
	evs, err := m.opts.Store.ReadStream(context.Background(), StreamID(id), 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs, func(e eventstore.Event) bool { return e.Type == EventAdopted }) {
		t.Error("the session was not adopted")
	}
}

// StopAll destroys the sandboxes of the running sessions this replica
// keeps (its own, and those of a replica gone) and ends them with reason
// shutdown; a suspended session, and one another live replica runs, are
// left as they are.
func TestStopAllEndsSessionsKeptHere(t *testing.T) {
	ctx := context.Background()
	fake := sandboxtest.NewFake()
	fake.Run = func(ctx context.Context, _ sandbox.Spec) sandbox.ExitStatus {
		<-ctx.Done()
		return sandbox.ExitStatus{Code: 143}
	}
	m := stopAllManager(t, fake, twoReplicas{Solo: cluster.NewSolo(cluster.Replica{ID: "r-self"}), other: "r-other"})
	sessions := map[string]string{ // id -> the replica that runs it
		"sess-01m8jbh60d7qh1g11cxcbgpmz0": "r-self",
		"sess-01m8jbh60d7qh1g11cxcbgpmz1": "r-gone",
		"sess-01m8jbh60d7qh1g11cxcbgpmz2": "r-other",
		"sess-01m8jbh60d7qh1g11cxcbgpmz3": "r-self", // suspended below
	}
	for id, replica := range sessions {
		if _, err := fake.Create(ctx, sandbox.Spec{ID: id}); err != nil {
			t.Fatal(err)
		}
		recordRunning(t, m, id, replica)
	}
	susp := "sess-01m8jbh60d7qh1g11cxcbgpmz3"
	if err := m.append(ctx, susp, EventSuspended, suspended{}); err != nil {
		t.Fatal(err)
	}
	m.StopAll(ctx)
	want := map[string]string{
		"sess-01m8jbh60d7qh1g11cxcbgpmz0": StatusEnded,
		"sess-01m8jbh60d7qh1g11cxcbgpmz1": StatusEnded,
		"sess-01m8jbh60d7qh1g11cxcbgpmz2": StatusRunning,
		susp:                              StatusSuspended,
	}
	for id, status := range want {
		s, err := m.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if s.Status != status {
			t.Errorf("session %s (replica %s): %s, want %s", id, sessions[id], s.Status, status)
		}
		if destroyed := slices.Contains(fake.Destroyed(), id); destroyed != (status == StatusEnded) {
			t.Errorf("session %s (replica %s): sandbox destroyed %v, want %v", id, sessions[id], destroyed, status == StatusEnded)
		}
		if status == StatusEnded && (s.EndReason != "shutdown" || !strings.Contains(s.EndError, "the server shut down")) {
			t.Errorf("session %s ended %q (%q), want reason shutdown saying the server shut down", id, s.EndReason, s.EndError)
		}
	}
	for _, id := range []string{"sess-01m8jbh60d7qh1g11cxcbgpmz2", susp} {
		fake.Destroy(ctx, id)
	}
}

// stopAllManager is a session manager on rt (a local placement), as
// replica members.Self() of members.
func stopAllManager(t *testing.T, rt sandbox.Runtime, members cluster.Members) *Manager {
	t.Helper()
	local, _ := rtkind.Of(rtkind.Local)
	data, err := workspace.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return New(Options{
		Store:      sqlitetest.Open(t),
		Data:       data,
		Placements: placement.NewSet(&placement.Runtime{Kind: local, Sandbox: rt}),
		Members:    members,
	}, slog.New(slog.DiscardHandler))
}

// recordRunning records session id created, running on replica.
func recordRunning(t *testing.T, m *Manager, id, replica string) {
	t.Helper()
	c := created{Session: Session{ID: id, Status: StatusRunning, Runtime: rtkind.Local}, TokenHash: hashToken(newToken()), AgentTokenHash: hashToken(newToken()), Replica: replica}
	if err := m.append(context.Background(), id, EventCreated, c); err != nil {
		t.Fatal(err)
	}
}

// gatedCheckpointer is the fake runtime with checkpoints: each waits for
// gate (started closed first), then ends the sandbox as runsc does.
type gatedCheckpointer struct {
	*sandboxtest.Fake
	started, gate chan struct{}
}

func (g gatedCheckpointer) Checkpoint(ctx context.Context, id, dir string) error {
	close(g.started)
	<-g.gate
	return g.Fake.Destroy(ctx, id)
}

func (g gatedCheckpointer) Restore(ctx context.Context, spec sandbox.Spec, dir string) (*sandbox.Handle, error) {
	return g.Fake.Create(ctx, spec)
}

// TestStopAllWaitsForASuspend: a shutdown's StopAll that comes while a
// suspend a client asked for checkpoints the session waits for it, and
// then leaves the session suspended with its checkpoint, as a session
// suspended before: it neither destroys the sandbox under the checkpoint
// nor removes the checkpoint the suspend then records as kept.
func TestStopAllWaitsForASuspend(t *testing.T) {
	ctx := context.Background()
	fake := sandboxtest.NewFake()
	fake.Caps.Checkpoint = true
	fake.Run = func(ctx context.Context, _ sandbox.Spec) sandbox.ExitStatus {
		<-ctx.Done()
		return sandbox.ExitStatus{Code: 143}
	}
	rt := gatedCheckpointer{Fake: fake, started: make(chan struct{}), gate: make(chan struct{})}
	m := stopAllManager(t, rt, cluster.NewSolo(cluster.Replica{ID: "r-self"}))
	id := "sess-01m8jbh60d7qh1g11cxcbgpmz0"
	if _, err := fake.Create(ctx, sandbox.Spec{ID: id}); err != nil {
		t.Fatal(err)
	}
	recordRunning(t, m, id, "r-self")
	suspended := make(chan error, 1)
	go func() {
		_, err := m.Suspend(ctx, id)
		suspended <- err
	}()
	<-rt.started
	stopped := make(chan struct{})
	go func() { m.StopAll(ctx); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("StopAll returned while the suspend checkpointed the session")
	case <-time.After(200 * time.Millisecond):
	}
	if slices.Contains(fake.Destroyed(), id) {
		t.Fatal("StopAll destroyed the sandbox under its checkpoint")
	}
	close(rt.gate)
	if err := <-suspended; err != nil {
		t.Fatal(err)
	}
	<-stopped
	s, err := m.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if s.Status != StatusSuspended || !s.MemoryKept {
		t.Errorf("after the suspend and StopAll: %s (memory kept %v), want suspended with its memory", s.Status, s.MemoryKept)
	}
	if _, err := os.Stat(filepath.Join(m.checkpointDir(id), checkpointDone)); err != nil {
		t.Errorf("the suspended session's checkpoint: %v", err)
	}
}

// TestStopAllGivesUpOnAnOperation: an operation that outlasts StopAll's
// context is left to finish; StopAll returns within it.
func TestStopAllGivesUpOnAnOperation(t *testing.T) {
	m := stopAllManager(t, sandboxtest.NewFake(), cluster.NewSolo(cluster.Replica{ID: "r-self"}))
	id := "sess-01m8jbh60d7qh1g11cxcbgpmz0"
	recordRunning(t, m, id, "r-self")
	unlock := m.lockOps(id)
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	m.StopAll(ctx)
	if s, err := m.Get(context.Background(), id); err != nil || s.Status != StatusRunning {
		t.Errorf("a session whose operation outlasted StopAll: %+v, %v; want it running, left to the operation", s, err)
	}
}
