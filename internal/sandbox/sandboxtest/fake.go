package sandboxtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
)

var _ sandbox.Runtime = (*Fake)(nil)

// Fake is an in-memory sandbox.Runtime for unit tests. It isolates nothing.
//
// Each sandbox's main process is Run, called in a goroutine with a ctx that
// Stop cancels; after the grace period a Run that has not returned counts as
// killed (exit 137) and its result is dropped. When Run is nil the Fake runs
// spec.Command as a plain host process (own process group, SIGTERM on Stop,
// SIGKILL after grace), in the Source of the mount whose Target is spec.Dir.
//
// Instances made with Restart share their sandboxes, as a restarted server
// shares the host's. Fake is safe for concurrent use; set its fields before
// the first call.
type Fake struct {
	// Run is every sandbox's main process; nil runs spec.Command on the host.
	Run func(ctx context.Context, spec sandbox.Spec) sandbox.ExitStatus
	// ExecFunc serves Exec; nil runs req.Command on the host.
	ExecFunc func(ctx context.Context, spec sandbox.Spec, req sandbox.ExecRequest) sandbox.ExitStatus
	// CreateErr, if set, is called before Create starts a sandbox; a
	// non-nil result is returned from Create (to simulate failures).
	CreateErr func(spec sandbox.Spec) error
	// DestroyErr, if set, is asked before each Destroy of a sandbox
	// there; an error it returns is Destroy's, the sandbox left as it is.
	DestroyErr func(id string) error
	// Caps is what Capabilities returns. NewFake sets it to available with
	// Exec and without Limits.
	Caps sandbox.Capabilities

	st *fakeState
}

type fakeState struct {
	mu        sync.Mutex
	sandboxes map[string]*fakeSandbox
	created   []sandbox.Spec
	stopped   []string
	destroyed []string
}

type fakeSandbox struct {
	spec    sandbox.Spec
	started time.Time
	cancel  context.CancelFunc // Stop: SIGTERM
	kill    chan struct{}      // after grace: SIGKILL
	once    sync.Once
	done    chan struct{}
	exit    sandbox.ExitStatus
	output  bytes.Buffer // combined output of a host process
}

func (sb *fakeSandbox) finish(es sandbox.ExitStatus) {
	sb.once.Do(func() {
		if es.ExitedAt.IsZero() {
			es.ExitedAt = time.Now().UTC()
		}
		sb.exit = es
		close(sb.done)
	})
}

func (sb *fakeSandbox) exited() bool {
	select {
	case <-sb.done:
		return true
	default:
		return false
	}
}

// NewFake returns an empty Fake.
func NewFake() *Fake {
	return &Fake{
		Caps: sandbox.Capabilities{Available: true, Exec: true, Version: "fake"},
		st:   &fakeState{sandboxes: map[string]*fakeSandbox{}},
	}
}

// Restart returns a new instance over the same sandboxes, with the same
// fields, as a server restarted on the same host would see them.
func (f *Fake) Restart() *Fake {
	g := *f
	return &g
}

// Created returns the spec of every sandbox created, in order, including
// destroyed ones.
func (f *Fake) Created() []sandbox.Spec {
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	return append([]sandbox.Spec(nil), f.st.created...)
}

// Stopped returns the ids passed to Stop (and Destroy) for running
// sandboxes, in order.
func (f *Fake) Stopped() []string {
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	return append([]string(nil), f.st.stopped...)
}

// Destroyed returns the ids of destroyed sandboxes, in order.
func (f *Fake) Destroyed() []string {
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	return append([]string(nil), f.st.destroyed...)
}

// Output returns what a host-process sandbox wrote to stdout and stderr.
func (f *Fake) Output(id string) string {
	sb, err := f.get(id)
	if err != nil {
		return ""
	}
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	return sb.output.String()
}

func (f *Fake) get(id string) (*fakeSandbox, error) {
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	sb, ok := f.st.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

func handleOf(spec sandbox.Spec) *sandbox.Handle {
	state, _ := json.Marshal(map[string]string{"id": spec.ID})
	return &sandbox.Handle{ID: spec.ID, Runtime: "fake", Labels: maps.Clone(spec.Labels), Version: 1, State: state}
}

// Capabilities returns f.Caps.
func (f *Fake) Capabilities(ctx context.Context) (sandbox.Capabilities, error) { return f.Caps, nil }

func validate(spec sandbox.Spec, hostProcess bool) error {
	var errs []error
	if spec.ID == "" || len(spec.ID) > 63 || strings.Trim(spec.ID, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
		errs = append(errs, errdefs.Field("id", "must be 1 to 63 lowercase letters, digits and hyphens"))
	}
	if hostProcess && len(spec.Command) == 0 {
		errs = append(errs, errdefs.Field("command", "must not be empty"))
	}
	for i, m := range spec.Mounts {
		if !filepath.IsAbs(m.Target) || filepath.Clean(m.Target) != m.Target {
			errs = append(errs, errdefs.Field(fmt.Sprintf("mounts[%d].target", i), "must be an absolute, clean path"))
		}
	}
	if hostProcess && spec.Dir != "" && hostDir(spec.Mounts, spec.Dir) == "" {
		errs = append(errs, errdefs.Field("dir", "fake runs host processes only in a mount's target"))
	}
	return errors.Join(errs...)
}

// hostDir maps dir inside the sandbox to a host path through mounts.
func hostDir(mounts []sandbox.Mount, dir string) string {
	for _, m := range mounts {
		if rel, err := filepath.Rel(m.Target, dir); err == nil && filepath.IsLocal(rel) {
			return filepath.Join(m.Source, rel)
		}
		if dir == m.Target {
			return m.Source
		}
	}
	return ""
}

// Create starts spec's main process; idempotent on spec.ID.
// Its data root is "/": a mount's Source is a host path without its
// leading slash (MountSource).
func (f *Fake) Create(ctx context.Context, spec sandbox.Spec) (*sandbox.Handle, error) {
	for i, m := range spec.Mounts {
		if m.HostDir && !sandbox.CleanAbs(m.Source) || !m.HostDir && !filepath.IsLocal(m.Source) {
			return nil, fmt.Errorf("validate sandbox spec: %w", errdefs.Field(fmt.Sprintf("mounts[%d].source", i), "must be a path within the data root, or an absolute host directory"))
		}
	}
	spec = spec.Resolve("/")
	if err := validate(spec, f.Run == nil); err != nil {
		return nil, fmt.Errorf("validate sandbox spec: %w", err)
	}
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	if sb, ok := f.st.sandboxes[spec.ID]; ok {
		return handleOf(sb.spec), nil
	}
	if f.CreateErr != nil {
		if err := f.CreateErr(spec); err != nil {
			return nil, err
		}
	}
	runCtx, cancel := context.WithCancel(context.Background())
	sb := &fakeSandbox{spec: spec, started: time.Now().UTC(), cancel: cancel, kill: make(chan struct{}), done: make(chan struct{})}
	f.st.sandboxes[spec.ID] = sb
	f.st.created = append(f.st.created, spec)
	run := f.Run
	go func() {
		var es sandbox.ExitStatus
		if run != nil {
			es = run(runCtx, spec)
		} else {
			es = f.runHost(runCtx, sb)
		}
		cancel()
		sb.finish(es)
	}()
	return handleOf(spec), nil
}

// runHost runs the sandbox's command as a host process group.
func (f *Fake) runHost(ctx context.Context, sb *fakeSandbox) sandbox.ExitStatus {
	spec := sb.spec
	cmd := exec.Command(spec.Command[0], spec.Command[1:]...)
	cmd.Dir = os.TempDir()
	if spec.Dir != "" {
		cmd.Dir = hostDir(spec.Mounts, spec.Dir)
	}
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, spec.Env...)
	out := &lockedWriter{mu: &f.st.mu, buf: &sb.output}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return sandbox.ExitStatus{Code: 127, Message: err.Error()}
	}
	pgid := cmd.Process.Pid
	stop := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			syscall.Kill(-pgid, syscall.SIGTERM)
		case <-stop:
			return
		}
		select {
		case <-sb.kill:
			syscall.Kill(-pgid, syscall.SIGKILL)
		case <-stop:
		}
	}()
	err := cmd.Wait()
	close(stop)
	// Like a pid namespace: when the main process ends, so does the rest.
	// Kill the group until it is empty (or only zombies are left), so no
	// straggler is still running when Wait returns.
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if syscall.Kill(-pgid, syscall.SIGKILL) != nil || !groupAlive(pgid) {
			break
		}
	}
	var xe *exec.ExitError
	if err != nil && !errors.As(err, &xe) {
		return sandbox.ExitStatus{Code: -1, Message: err.Error()}
	}
	es := sandbox.ExitStatus{Code: cmd.ProcessState.ExitCode()}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		es.Code = 128 + int(ws.Signal())
	}
	es.Message = sandbox.ExitMessage(es.Code, func() []byte {
		f.st.mu.Lock()
		defer f.st.mu.Unlock()
		return bytes.Clone(sb.output.Bytes())
	})
	return es
}

type lockedWriter struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// Recover checks that h's sandbox exists.
func (f *Fake) Recover(ctx context.Context, h *sandbox.Handle) error {
	if h == nil || h.Runtime != "fake" {
		return fmt.Errorf("recover sandbox: not a fake handle: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := f.get(h.ID); err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	return nil
}

// Exec runs req with ExecFunc, or on the host in req.Dir mapped through the
// sandbox's mounts.
func (f *Fake) Exec(ctx context.Context, id string, req sandbox.ExecRequest) (sandbox.ExitStatus, error) {
	sb, err := f.get(id)
	if err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("exec: %w", err)
	}
	if err := req.Validate(); err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: %w", id, err)
	}
	if sb.exited() {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	if f.ExecFunc != nil {
		return f.ExecFunc(ctx, sb.spec, req), nil
	}
	cmd := exec.CommandContext(ctx, req.Command[0], req.Command[1:]...)
	cmd.Dir = os.TempDir()
	if req.Dir != "" {
		if cmd.Dir = hostDir(sb.spec.Mounts, req.Dir); cmd.Dir == "" {
			return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: %w", id, errdefs.Field("dir", "fake runs host processes only in a mount's target"))
		}
	}
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, req.Env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = req.Stdin, req.Stdout, req.Stderr
	cmd.WaitDelay = time.Second
	err = cmd.Run()
	if ctx.Err() != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: %w", id, ctx.Err())
	}
	var xe *exec.ExitError
	switch {
	case cmd.ProcessState == nil && (errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist)):
		// It never started: as a shell says it (ExecTable).
		return sandbox.ExitStatus{Code: 127, ExitedAt: time.Now().UTC()}, nil
	case cmd.ProcessState == nil && errors.Is(err, fs.ErrPermission):
		return sandbox.ExitStatus{Code: 126, ExitedAt: time.Now().UTC()}, nil
	case err != nil && !errors.As(err, &xe):
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: %w", id, err)
	}
	return sandbox.ExitStatus{Code: cmd.ProcessState.ExitCode(), ExitedAt: time.Now().UTC()}, nil
}

// Wait blocks until the sandbox's main process exits or ctx is done.
func (f *Fake) Wait(ctx context.Context, id string) (sandbox.ExitStatus, error) {
	sb, err := f.get(id)
	if err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("wait: %w", err)
	}
	select {
	case <-sb.done:
		return sb.exit, nil
	case <-ctx.Done():
		return sandbox.ExitStatus{}, fmt.Errorf("wait for sandbox %s: %w", id, ctx.Err())
	}
}

// Stop cancels the main process's ctx, waits up to grace, then kills it.
func (f *Fake) Stop(ctx context.Context, id string, grace time.Duration) error {
	sb, err := f.get(id)
	if err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	if sb.exited() {
		return nil
	}
	f.st.mu.Lock()
	f.st.stopped = append(f.st.stopped, id)
	f.st.mu.Unlock()
	sb.cancel()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-sb.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop sandbox %s: %w", id, ctx.Err())
	case <-t.C:
	}
	f.st.mu.Lock()
	select {
	case <-sb.kill:
	default:
		close(sb.kill)
	}
	f.st.mu.Unlock()
	sb.finish(sandbox.ExitStatus{Code: 137, Message: "killed by signal killed"})
	return nil
}

// Status returns the sandbox's state.
func (f *Fake) Status(ctx context.Context, id string) (sandbox.Status, error) {
	sb, err := f.get(id)
	if err != nil {
		return sandbox.Status{}, fmt.Errorf("status: %w", err)
	}
	s := sandbox.Status{State: sandbox.StateRunning, StartedAt: sb.started}
	if sb.exited() {
		es := sb.exit
		s.State, s.Exit, s.Message = sandbox.StateExited, &es, es.Message
	}
	return s, nil
}

// List returns the sandboxes whose labels include selector.
func (f *Fake) List(ctx context.Context, selector map[string]string) ([]sandbox.Handle, error) {
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	var out []sandbox.Handle
	for _, sb := range f.st.sandboxes {
		match := true
		for k, v := range selector {
			if got, ok := sb.spec.Labels[k]; !ok || got != v {
				match = false
			}
		}
		if match {
			out = append(out, *handleOf(sb.spec))
		}
	}
	return out, nil
}

// Destroy stops the sandbox without grace and forgets it.
func (f *Fake) Destroy(ctx context.Context, id string) error {
	if _, err := f.get(id); errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if f.DestroyErr != nil {
		if err := f.DestroyErr(id); err != nil {
			return fmt.Errorf("destroy %s: %w", id, err)
		}
	}
	if err := f.Stop(ctx, id, 0); err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	if _, ok := f.st.sandboxes[id]; ok {
		delete(f.st.sandboxes, id)
		f.st.destroyed = append(f.st.destroyed, id)
	}
	return nil
}

// groupAlive reports whether a process of group pgid is alive and not a
// zombie.
func groupAlive(pgid int) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 3 && f[0] != "Z" && f[3] == strconv.Itoa(pgid) {
			return true
		}
	}
	return false
}
