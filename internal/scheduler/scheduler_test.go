package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/sqlite"
	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/task"
)

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// MustNewFake returns a Fake whose sandboxes are all destroyed when the
// test ends (after the scheduler stopped), so no Run goroutine leaks.
func MustNewFake(tb testing.TB, run func(ctx context.Context, spec sandbox.Spec) sandbox.ExitStatus) *sandboxtest.Fake {
	tb.Helper()
	f := sandboxtest.NewFake()
	f.Run = run
	tb.Cleanup(func() {
		hs, _ := f.List(context.Background(), nil)
		for _, h := range hs {
			f.Destroy(context.Background(), h.ID)
		}
	})
	return f
}

// blockUntilStopped is a main process that runs until Stop.
func blockUntilStopped(ctx context.Context, _ sandbox.Spec) sandbox.ExitStatus {
	<-ctx.Done()
	return sandbox.ExitStatus{Code: 143}
}

// exitsAtOnce is a main process that exits with code 0 at once.
func exitsAtOnce(context.Context, sandbox.Spec) sandbox.ExitStatus {
	return sandbox.ExitStatus{Code: 0}
}

// runUntilFinished is a main process that exits with code 0 once finish
// is closed, or like blockUntilStopped if stopped first.
func runUntilFinished(finish <-chan struct{}) func(context.Context, sandbox.Spec) sandbox.ExitStatus {
	return func(ctx context.Context, _ sandbox.Spec) sandbox.ExitStatus {
		select {
		case <-finish:
			return sandbox.ExitStatus{Code: 0}
		case <-ctx.Done():
			return sandbox.ExitStatus{Code: 143}
		}
	}
}

// recordStop is a main process that runs until Stop and records when it
// was stopped in stoppedAt (Unix nanoseconds).
func recordStop(stoppedAt *atomic.Int64) func(context.Context, sandbox.Spec) sandbox.ExitStatus {
	return func(ctx context.Context, _ sandbox.Spec) sandbox.ExitStatus {
		<-ctx.Done()
		stoppedAt.Store(time.Now().UnixNano())
		return sandbox.ExitStatus{Code: 143}
	}
}

// mustCreateManaged creates, as a server before a restart did, a sandbox
// id on fake labelled as Corral's for the task taskID.
func mustCreateManaged(tb testing.TB, fake *sandboxtest.Fake, id, taskID string) {
	tb.Helper()
	if _, err := fake.Create(context.Background(), sandbox.Spec{ID: id, Labels: map[string]string{sandbox.LabelManaged: "true", sandbox.LabelTaskID: taskID}}); err != nil {
		tb.Fatal(err)
	}
}

type collectCall struct {
	id   string
	exit *sandbox.ExitStatus
}

// harness is one server's scheduler over a store shared across restarts.
type harness struct {
	store eventstore.Store
	tasks *projection.Tasks
	sched *Scheduler

	mu       sync.Mutex
	collects []collectCall
	stop     func()
}

// testRunner is the scheduler's Runner for these tests: a spec that runs
// true, a Collect that records its calls on the harness and ends the task
// by the exit code, and Reported when a test sets it.
type testRunner struct {
	h        *harness
	reported func(ctx context.Context, t task.Task) (task.Completed, bool)
}

func (r *testRunner) Reconcile(ctx context.Context) error    { return nil }
func (r *testRunner) Adopt(ctx context.Context, t task.Task) {}

func (r *testRunner) Prepare(ctx context.Context, t task.Task) (sandbox.Spec, error) {
	return sandbox.Spec{ID: t.ID, Command: []string{"true"}, Labels: map[string]string{sandbox.LabelManaged: "true", sandbox.LabelTaskID: t.ID}}, nil
}

func (r *testRunner) Collect(ctx context.Context, t task.Task, exit *sandbox.ExitStatus) task.Completed {
	r.h.mu.Lock()
	r.h.collects = append(r.h.collects, collectCall{t.ID, exit})
	r.h.mu.Unlock()
	if exit == nil {
		return task.Completed{Status: task.Failed, ErrorMessage: "lost", Reason: "lost"}
	}
	code := exit.Code
	if code == 0 {
		return task.Completed{Status: task.Success, ExitCode: &code, Summary: "collected"}
	}
	return task.Completed{Status: task.Failed, ExitCode: &code, ErrorMessage: fmt.Sprintf("exit %d", code)}
}

func (r *testRunner) Released(ctx context.Context, t task.Task) {}

func (r *testRunner) Reported(ctx context.Context, t task.Task) (task.Completed, bool) {
	if r.reported == nil {
		return task.Completed{}, false
	}
	return r.reported(ctx, t)
}

// MustStart rebuilds a projection over store and runs it and a scheduler
// with opts (Runtimes and Runner filled in when empty; a *testRunner given
// is bound to the harness) until the test ends or h.stop is called. A
// scheduler alone on its store (no opts.Members) leads; a replica's test
// has the one it chooses lead.
func MustStart(tb testing.TB, store eventstore.Store, opts Options, rt sandbox.Runtime) *harness {
	tb.Helper()
	h := &harness{store: store, tasks: projection.New(store, discard())}
	if err := h.tasks.Rebuild(context.Background()); err != nil {
		tb.Fatal(err)
	}
	if opts.Runtimes == nil {
		opts.Runtimes = map[string]sandbox.Runtime{"fake": rt}
	}
	if opts.Runner == nil {
		opts.Runner = &testRunner{}
	}
	if tr, ok := opts.Runner.(*testRunner); ok {
		tr.h = h
	}
	h.sched = New(opts, h.tasks, store, discard())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := h.tasks.Run(ctx); err != nil {
			tb.Errorf("projection Run: %v", err)
		}
	}()
	if opts.Members == nil {
		wg.Go(func() { h.sched.Lead(ctx) }) // alone on its store, it leads
	}
	go func() {
		defer wg.Done()
		if err := h.sched.Run(ctx); err != nil {
			tb.Errorf("scheduler Run: %v", err)
		}
	}()
	var once sync.Once
	h.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	tb.Cleanup(h.stop)
	return h
}

func (h *harness) collected() []collectCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.collects)
}

// MustEnqueue records a queued task for the fake runtime.
func MustEnqueue(tb testing.TB, tasks *projection.Tasks, spec task.Spec) string {
	tb.Helper()
	if spec.Runtime == "" {
		spec.Runtime = "fake"
	}
	if spec.TimeoutMinutes == 0 {
		spec.TimeoutMinutes = 10
	}
	id := task.NewID()
	if _, err := tasks.Create(context.Background(), id,
		projection.NewEvent(task.EventCreated, task.Created{Spec: spec}, "test"),
		projection.NewEvent(task.EventQueued, nil, "test")); err != nil {
		tb.Fatal(err)
	}
	return id
}

// MustAppend appends one event to a task's stream at its current version.
func MustAppend(tb testing.TB, tasks *projection.Tasks, id string, e eventstore.Proposed) {
	tb.Helper()
	if _, err := tasks.Update(context.Background(), id, func(task.Task) ([]eventstore.Proposed, error) {
		return []eventstore.Proposed{e}, nil
	}); err != nil {
		tb.Fatal(err)
	}
}

// waitFor polls cond until it holds or 15 seconds pass.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitStatus(tb testing.TB, tasks *projection.Tasks, id string, want task.Status) task.Task {
	tb.Helper()
	var t task.Task
	waitFor(tb, fmt.Sprintf("task %s to be %s", id, want), func() bool {
		t, _ = tasks.Get(id)
		return t.Status == want || (t.Status.Terminal() && t.Status != want)
	})
	if t.Status != want {
		tb.Fatalf("task %s ended %s (%q), want %s", id, t.Status, t.ErrorMessage, want)
	}
	return t
}

// readStream returns the events of one stream of store.
func readStream(tb testing.TB, store eventstore.Store, stream string) []eventstore.Event {
	tb.Helper()
	evs, err := store.ReadStream(context.Background(), stream, 0)
	if err != nil {
		tb.Fatal(err)
	}
	return evs
}

// streamTypes returns the types of one stream's events, in order.
// countType is how many events of type typ stream holds.
func countType(tb testing.TB, store eventstore.Store, stream, typ string) int {
	tb.Helper()
	n := 0
	for _, t := range streamTypes(tb, store, stream) {
		if t == typ {
			n++
		}
	}
	return n
}

func streamTypes(tb testing.TB, store eventstore.Store, stream string) []string {
	tb.Helper()
	var out []string
	for _, e := range readStream(tb, store, stream) {
		out = append(out, e.Type)
	}
	return out
}

func TestFIFOWithOneSlot(t *testing.T) {
	store := sqlitetest.Open(t)
	tasks := projection.New(store, discard())
	ctx := context.Background()
	var made []string
	for i := 0; i < 4; i++ {
		id := task.NewID()
		if _, err := tasks.Create(ctx, id, projection.NewEvent(task.EventCreated, task.Created{Spec: task.Spec{Runtime: "fake", TimeoutMinutes: 5}}, "test")); err != nil {
			t.Fatal(err)
		}
		made = append(made, id)
	}
	// Queue in the order 3, 1, 0, 2: the start order must follow the queue.
	want := []string{made[3], made[1], made[0], made[2]}
	for _, id := range want {
		MustAppend(t, tasks, id, projection.NewEvent(task.EventQueued, nil, "test"))
	}
	var running, maxRunning atomic.Int32
	fake := MustNewFake(t, func(ctx context.Context, spec sandbox.Spec) sandbox.ExitStatus {
		n := running.Add(1)
		defer running.Add(-1)
		if n > maxRunning.Load() {
			maxRunning.Store(n)
		}
		time.Sleep(20 * time.Millisecond)
		return sandbox.ExitStatus{Code: 0}
	})
	h := MustStart(t, store, Options{MaxConcurrent: 1}, fake)
	for _, id := range made {
		waitStatus(t, h.tasks, id, task.Success)
	}
	var started []string
	for _, s := range fake.Created() {
		started = append(started, s.ID)
	}
	if diff := cmp.Diff(want, started); diff != "" {
		t.Errorf("start order (-queue order +started):\n%s", diff)
	}
	if maxRunning.Load() != 1 {
		t.Errorf("at most %d sandboxes ran at once, want 1", maxRunning.Load())
	}
	if got := len(h.collected()); got != 4 {
		t.Errorf("Collect called %d times, want 4", got)
	}
	// The last sandbox is destroyed just after its task's end is recorded.
	waitFor(t, "every sandbox to be destroyed", func() bool { return len(fake.Destroyed()) == 4 })
}

func TestNeverMoreThanMaxConcurrent(t *testing.T) {
	store := sqlitetest.Open(t)
	var running, maxRunning atomic.Int32
	var mu sync.Mutex
	fake := MustNewFake(t, func(ctx context.Context, spec sandbox.Spec) sandbox.ExitStatus {
		n := running.Add(1)
		defer running.Add(-1)
		mu.Lock()
		if n > maxRunning.Load() {
			maxRunning.Store(n)
		}
		mu.Unlock()
		select {
		case <-time.After(30 * time.Millisecond):
		case <-ctx.Done():
		}
		return sandbox.ExitStatus{Code: 0}
	})
	h := MustStart(t, store, Options{MaxConcurrent: 2}, fake)
	var ids []string
	for i := 0; i < 8; i++ {
		ids = append(ids, MustEnqueue(t, h.tasks, task.Spec{}))
	}
	for _, id := range ids {
		waitStatus(t, h.tasks, id, task.Success)
	}
	if got := maxRunning.Load(); got != 2 {
		t.Errorf("at most %d sandboxes ran at once, want 2 (the limit, reached)", got)
	}
	waitFor(t, "every slot to be released", func() bool { return h.sched.Running() == 0 })
}

func TestCreateFailsNonRetryable(t *testing.T) {
	store := sqlitetest.Open(t)
	fake := MustNewFake(t, blockUntilStopped)
	var calls atomic.Int32
	fake.CreateErr = func(sandbox.Spec) error {
		calls.Add(1)
		return fmt.Errorf("pull image: no such image: %w", errdefs.ErrInvalidArgument)
	}
	h := MustStart(t, store, Options{}, fake)
	id := MustEnqueue(t, h.tasks, task.Spec{})
	got := waitStatus(t, h.tasks, id, task.Failed)
	if !strings.Contains(got.ErrorMessage, "no such image") || !strings.HasPrefix(got.ErrorMessage, "start sandbox: ") {
		t.Errorf("error message %q, want the create error", got.ErrorMessage)
	}
	if calls.Load() != 1 {
		t.Errorf("Create called %d times, want 1 (not retried)", calls.Load())
	}
	if len(h.collected()) != 0 {
		t.Errorf("Collect called for a task that never started")
	}
}

func TestCreateRetriesUnavailable(t *testing.T) {
	store := sqlitetest.Open(t)
	fake := MustNewFake(t, exitsAtOnce)
	var calls atomic.Int32
	fake.CreateErr = func(sandbox.Spec) error {
		if calls.Add(1) <= 2 {
			return fmt.Errorf("docker daemon: %w", errdefs.ErrUnavailable)
		}
		return nil
	}
	h := MustStart(t, store, Options{}, fake)
	id := MustEnqueue(t, h.tasks, task.Spec{})
	waitStatus(t, h.tasks, id, task.Success)
	if calls.Load() != 3 {
		t.Errorf("Create called %d times, want 3 (two retries)", calls.Load())
	}
}

func TestUnknownRuntimeFails(t *testing.T) {
	store := sqlitetest.Open(t)
	fake := MustNewFake(t, blockUntilStopped)
	h := MustStart(t, store, Options{}, fake)
	id := MustEnqueue(t, h.tasks, task.Spec{Runtime: "docker"})
	got := waitStatus(t, h.tasks, id, task.Failed)
	if !strings.Contains(got.ErrorMessage, `"docker" is not available`) {
		t.Errorf("error message %q", got.ErrorMessage)
	}
	if len(fake.Created()) != 0 {
		t.Errorf("a sandbox was created on the wrong runtime")
	}
}

func TestCancelRunning(t *testing.T) {
	store := sqlitetest.Open(t)
	fake := MustNewFake(t, blockUntilStopped)
	h := MustStart(t, store, Options{StopGrace: time.Second}, fake)
	id := MustEnqueue(t, h.tasks, task.Spec{})
	waitStatus(t, h.tasks, id, task.Running)
	MustAppend(t, h.tasks, id, projection.NewEvent(task.EventCancelRequested, task.CancelRequested{Reason: "test"}, "test"))
	got := waitStatus(t, h.tasks, id, task.Cancelled)
	if got.ErrorMessage != "cancelled" {
		t.Errorf("error message %q", got.ErrorMessage)
	}
	waitFor(t, "the sandbox to be destroyed", func() bool { return slices.Contains(fake.Destroyed(), id) })
	if !slices.Contains(fake.Stopped(), id) {
		t.Errorf("Stopped() = %v, want %s stopped", fake.Stopped(), id)
	}
	if c := h.collected(); len(c) != 0 {
		t.Errorf("Collect called for a cancelled task: %v", c)
	}
}

// The timeout is tested with an injected clock, not testing/synctest: the
// projection follows the SQLite store, whose WaitFor blocks on a channel
// made outside any bubble, so a bubble's clock would never advance. Now
// runs 59.8 s ahead, so a 1-minute task times out 200 ms after it starts.
func TestTimeout(t *testing.T) {
	store := sqlitetest.Open(t)
	var stoppedAt atomic.Int64
	fake := MustNewFake(t, recordStop(&stoppedAt))
	ahead := time.Minute - 200*time.Millisecond
	h := MustStart(t, store, Options{Now: func() time.Time { return time.Now().Add(ahead) }}, fake)
	id := MustEnqueue(t, h.tasks, task.Spec{TimeoutMinutes: 1})
	running := waitStatus(t, h.tasks, id, task.Running)
	got := waitStatus(t, h.tasks, id, task.Timeout)
	if got.ErrorMessage != "timed out after 1m0s" {
		t.Errorf("error message %q", got.ErrorMessage)
	}
	waitFor(t, "the sandbox to be stopped", func() bool { return stoppedAt.Load() != 0 })
	if !slices.Contains(fake.Stopped(), id) {
		t.Errorf("Stopped() = %v, want %s", fake.Stopped(), id)
	}
	if d := time.Unix(0, stoppedAt.Load()).Sub(*running.StartedAt); d < 150*time.Millisecond {
		t.Errorf("stopped %s after start, want about 200ms", d)
	}
}

func TestCompletedElsewhereStopsAfterExitGrace(t *testing.T) {
	store := sqlitetest.Open(t)
	var stoppedAt atomic.Int64
	fake := MustNewFake(t, recordStop(&stoppedAt))
	const grace = 150 * time.Millisecond
	h := MustStart(t, store, Options{ExitGrace: grace}, fake)
	id := MustEnqueue(t, h.tasks, task.Spec{})
	waitStatus(t, h.tasks, id, task.Running)
	completedAt := time.Now()
	completeByWebhook(t, h.tasks, id)
	waitFor(t, "the sandbox to be stopped", func() bool { return stoppedAt.Load() != 0 })
	if d := time.Unix(0, stoppedAt.Load()).Sub(completedAt); d < grace {
		t.Errorf("sandbox stopped %s after the task ended, want at least the exit grace %s", d, grace)
	}
	waitFor(t, "the sandbox to be destroyed", func() bool { return slices.Contains(fake.Destroyed(), id) })
	checkWebhookEndKept(t, h.tasks, id)
	if c := h.collected(); len(c) != 0 {
		t.Errorf("Collect called for a task that had ended: %v", c)
	}
}

// completeByWebhook records a task's successful end as the worker's webhook
// does, while its sandbox still runs.
func completeByWebhook(tb testing.TB, tasks *projection.Tasks, id string) {
	tb.Helper()
	MustAppend(tb, tasks, id, projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Success, Summary: "by webhook", Reason: "webhook"}, "worker"))
}

// checkWebhookEndKept checks that a task ended by completeByWebhook kept
// that end, whatever became of its sandbox.
func checkWebhookEndKept(tb testing.TB, tasks *projection.Tasks, id string) {
	tb.Helper()
	if got, _ := tasks.Get(id); got.Status != task.Success || got.Summary != "by webhook" {
		tb.Errorf("task = %s %q, want the webhook's success kept", got.Status, got.Summary)
	}
}

// mustRunUntilRunning starts a task on a first server and stops that server
// while the sandbox keeps running.
func mustRunUntilRunning(t *testing.T, store *sqlite.Store, fake *sandboxtest.Fake) string {
	t.Helper()
	first := MustStart(t, store, Options{}, fake)
	id := MustEnqueue(t, first.tasks, task.Spec{})
	waitStatus(t, first.tasks, id, task.Running)
	first.stop()
	if st, err := fake.Status(context.Background(), id); err != nil || st.State != sandbox.StateRunning {
		t.Fatalf("sandbox after the server stopped: %v, %v; want it still running", st.State, err)
	}
	if len(first.collected()) != 0 {
		t.Fatalf("the first server collected the task")
	}
	return id
}

func TestReconcileReattaches(t *testing.T) {
	store := sqlitetest.Open(t)
	finish := make(chan struct{})
	fake := MustNewFake(t, runUntilFinished(finish))
	id := mustRunUntilRunning(t, store, fake)

	second := MustStart(t, store, Options{}, fake.Restart())
	waitFor(t, "task_reattached", func() bool {
		return slices.Contains(streamTypes(t, store, task.StreamID(id)), task.EventReattached)
	})
	if got, _ := second.tasks.Get(id); got.Status != task.Running {
		t.Fatalf("after reattach the task is %s, want running", got.Status)
	}
	close(finish)
	got := waitStatus(t, second.tasks, id, task.Success)
	if got.Summary != "collected" {
		t.Errorf("summary %q, want Collect's", got.Summary)
	}
	c := second.collected()
	if len(c) != 1 || c[0].id != id || c[0].exit == nil || c[0].exit.Code != 0 {
		t.Errorf("Collect calls %+v, want one for %s with exit code 0", c, id)
	}
	if s := fake.Stopped(); len(s) != 0 {
		t.Errorf("Stopped() = %v: the reattached sandbox was stopped", s)
	}
}

func TestReconcileSandboxGone(t *testing.T) {
	store := sqlitetest.Open(t)
	fake := MustNewFake(t, blockUntilStopped)
	id := mustRunUntilRunning(t, store, fake)
	// The host rebooted: the sandbox is gone.
	if err := fake.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}

	second := MustStart(t, store, Options{}, fake.Restart())
	got := waitStatus(t, second.tasks, id, task.Failed)
	if got.ErrorMessage != "lost" {
		t.Errorf("error message %q, want Collect's result recorded", got.ErrorMessage)
	}
	c := second.collected()
	if len(c) != 1 || c[0].id != id || c[0].exit != nil {
		t.Errorf("Collect calls %+v, want one for %s with a nil exit", c, id)
	}
	if slices.Contains(streamTypes(t, store, task.StreamID(id)), task.EventReattached) {
		t.Errorf("task_reattached recorded for a sandbox that is gone")
	}
}

func TestReconcileStopsOrphans(t *testing.T) {
	store := sqlitetest.Open(t)
	fake := MustNewFake(t, blockUntilStopped)
	ctx := context.Background()
	mustCreateManaged(t, fake, "orphan-1", "task-gone")
	if _, err := fake.Create(ctx, sandbox.Spec{ID: "not-ours"}); err != nil {
		t.Fatal(err)
	}
	MustStart(t, store, Options{}, fake)
	waitFor(t, "sandbox_orphan_stopped", func() bool {
		return slices.Contains(streamTypes(t, store, task.SystemStream), task.EventOrphanStopped)
	})
	if !slices.Contains(fake.Stopped(), "orphan-1") || !slices.Contains(fake.Destroyed(), "orphan-1") {
		t.Errorf("Stopped() = %v, Destroyed() = %v; want orphan-1 in both", fake.Stopped(), fake.Destroyed())
	}
	if slices.Contains(fake.Stopped(), "not-ours") {
		t.Errorf("a sandbox without the managed label was stopped")
	}
	evs := readStream(t, store, task.SystemStream)
	i := slices.IndexFunc(evs, func(e eventstore.Event) bool { return e.Type == task.EventOrphanStopped })
	var data map[string]string
	if err := json.Unmarshal(evs[i].Data, &data); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"sandbox_name": "orphan-1", "runtime": "fake", "task_id": "task-gone"}, data); diff != "" {
		t.Errorf("orphan event data (-want +got):\n%s", diff)
	}
}

// TestReconcileStopsOrphansTogether: orphan sandboxes are stopped at
// once, not one after the other (each Stop waits for its sandbox's end, a
// pod's on a cluster, and holds a slot meanwhile): here each Stop goes on
// only once all three have begun.
func TestReconcileStopsOrphansTogether(t *testing.T) {
	store := sqlitetest.Open(t)
	fake := MustNewFake(t, blockUntilStopped)
	for i := range 3 {
		mustCreateManaged(t, fake, fmt.Sprintf("orphan-%d", i), fmt.Sprintf("task-gone-%d", i))
	}
	rt := &stopsTogether{Fake: fake, n: 3, all: make(chan struct{})}
	MustStart(t, store, Options{}, rt)
	waitFor(t, "three sandbox_orphan_stopped", func() bool {
		return countType(t, store, task.SystemStream, task.EventOrphanStopped) == 3
	})
	if rt.alone.Load() {
		t.Errorf("a Stop waited alone for the others: the orphans were stopped one after the other")
	}
}

// TestReconcileServesWhileOrphansStop: the stop of an orphan sandbox that
// does not end (a pod on a node that is down) keeps neither the server's
// start nor other tasks waiting. Until it is gone the orphan holds a slot
// and the workspace of its task, which may still be writing there: a task
// on that workspace starts only then.
func TestReconcileServesWhileOrphansStop(t *testing.T) {
	store := sqlitetest.Open(t)
	finish := make(chan struct{})
	fake := MustNewFake(t, runUntilFinished(finish))
	before := projection.New(store, discard())
	if err := before.Rebuild(context.Background()); err != nil {
		t.Fatal(err)
	}
	orphan := MustEnqueue(t, before, task.Spec{Workspace: "ws"})
	MustAppend(t, before, orphan, projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Cancelled, Reason: "cancel"}, "test"))
	mustCreateManaged(t, fake, orphan, orphan)
	rt := &stopGate{Fake: fake, id: orphan, open: make(chan struct{})}

	h := MustStart(t, store, Options{MaxConcurrent: 2}, rt)
	select {
	case <-h.sched.Reconciled():
	case <-time.After(15 * time.Second):
		t.Fatal("not reconciled while an orphan's stop hangs")
	}
	var sum Reconciled
	evs := readStream(t, store, task.SystemStream)
	if i := slices.IndexFunc(evs, func(e eventstore.Event) bool { return e.Type == task.EventReconciled }); i < 0 || json.Unmarshal(evs[i].Data, &sum) != nil || sum.Orphans != 1 {
		t.Errorf("reconciled %+v, want 1 orphan", sum)
	}
	// Two slots: the orphan's, and one for a.
	onWorkspace := MustEnqueue(t, h.tasks, task.Spec{Workspace: "ws"})
	a := MustEnqueue(t, h.tasks, task.Spec{})
	b := MustEnqueue(t, h.tasks, task.Spec{})
	waitStatus(t, h.tasks, a, task.Running)
	for _, id := range []string{onWorkspace, b} {
		if tk, _ := h.tasks.Get(id); tk.Status != task.Queued {
			t.Errorf("task %s is %s while the orphan stops, want queued", id, tk.Status)
		}
	}
	if n := h.sched.Running(); n != 1 {
		t.Errorf("Running() = %d, want 1: the orphan runs no task", n)
	}
	if n := countType(t, store, task.SystemStream, task.EventOrphanStopped); n != 0 {
		t.Errorf("%d sandbox_orphan_stopped recorded while its stop hangs", n)
	}

	// The orphan gone, its slot and workspace go to the task next in line.
	close(rt.open)
	waitStatus(t, h.tasks, onWorkspace, task.Running)
	if n := countType(t, store, task.SystemStream, task.EventOrphanStopped); n != 1 || !slices.Contains(fake.Destroyed(), orphan) {
		t.Errorf("%d sandbox_orphan_stopped, destroyed %v; want the orphan's, before the task on its workspace started", n, fake.Destroyed())
	}
	if tk, _ := h.tasks.Get(b); tk.Status != task.Queued {
		t.Errorf("the last task is %s with both slots held, want queued", tk.Status)
	}
	close(finish)
	for _, id := range []string{a, onWorkspace, b} {
		waitStatus(t, h.tasks, id, task.Success)
	}
}

// An orphan's stop cut short by the server's end (here a stop; a SIGKILL
// leaves the same: the orphan listed, its stop unrecorded) is done by the
// next start.
func TestReconcileOrphanStopCutShort(t *testing.T) {
	store := sqlitetest.Open(t)
	fake := MustNewFake(t, blockUntilStopped)
	mustCreateManaged(t, fake, "orphan-1", "task-gone")
	first := MustStart(t, store, Options{}, &stopGate{Fake: fake, id: "orphan-1", open: make(chan struct{})})
	<-first.sched.Reconciled()
	first.stop()
	if slices.Contains(fake.Destroyed(), "orphan-1") || countType(t, store, task.SystemStream, task.EventOrphanStopped) != 0 {
		t.Fatalf("the orphan destroyed (%v) or its stop recorded with its stop cut short", fake.Destroyed())
	}
	MustStart(t, store, Options{}, fake)
	waitFor(t, "sandbox_orphan_stopped", func() bool {
		return countType(t, store, task.SystemStream, task.EventOrphanStopped) == 1
	})
	if !slices.Contains(fake.Destroyed(), "orphan-1") {
		t.Errorf("Destroyed() = %v, want orphan-1", fake.Destroyed())
	}
}

// stopGate is a Fake whose Stop of sandbox id waits until open is closed.
type stopGate struct {
	*sandboxtest.Fake
	id   string
	open chan struct{}
}

func (g *stopGate) Stop(ctx context.Context, id string, grace time.Duration) error {
	if id == g.id {
		select {
		case <-g.open:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.Fake.Stop(ctx, id, grace)
}

// stopsTogether is a Fake whose Stop goes on once n Stops have begun, or
// after 3 s alone (recorded).
type stopsTogether struct {
	*sandboxtest.Fake
	n     int
	mu    sync.Mutex
	begun int
	all   chan struct{}
	alone atomic.Bool
}

func (s *stopsTogether) Stop(ctx context.Context, id string, grace time.Duration) error {
	s.mu.Lock()
	if s.begun++; s.begun == s.n {
		close(s.all)
	}
	s.mu.Unlock()
	select {
	case <-s.all:
	case <-time.After(3 * time.Second):
		s.alone.Store(true)
	}
	return s.Fake.Stop(ctx, id, grace)
}

// A task cancelled while it waits in the queue is never started.
func TestCancelledWhileQueuedNeverStarts(t *testing.T) {
	store := sqlitetest.Open(t)
	finish := make(chan struct{})
	fake := MustNewFake(t, func(ctx context.Context, spec sandbox.Spec) sandbox.ExitStatus {
		select {
		case <-finish:
		case <-ctx.Done():
		}
		return sandbox.ExitStatus{Code: 0}
	})
	h := MustStart(t, store, Options{MaxConcurrent: 1}, fake)
	first := MustEnqueue(t, h.tasks, task.Spec{})
	waitStatus(t, h.tasks, first, task.Running)
	second := MustEnqueue(t, h.tasks, task.Spec{})
	MustAppend(t, h.tasks, second, projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Cancelled, Reason: "cancel"}, "test"))
	third := MustEnqueue(t, h.tasks, task.Spec{})
	close(finish)
	waitStatus(t, h.tasks, first, task.Success)
	waitStatus(t, h.tasks, third, task.Success)
	var started []string
	for _, s := range fake.Created() {
		started = append(started, s.ID)
	}
	if diff := cmp.Diff([]string{first, third}, started); diff != "" {
		t.Errorf("started (-want +got):\n%s", diff)
	}
	if got, _ := h.tasks.Get(second); got.Status != task.Cancelled {
		t.Errorf("cancelled task became %s", got.Status)
	}
}

// Shutting down while Reconcile records what it did is not an error, and Run
// returns only after the goroutines it started.
func TestRunStoppedDuringReconcile(t *testing.T) {
	store := sqlitetest.Open(t)
	fake := MustNewFake(t, blockUntilStopped)
	mustCreateManaged(t, fake, "orphan-2", "task-gone")
	tasks := projection.New(store, discard())
	s := New(Options{Runtimes: map[string]sandbox.Runtime{"fake": fake}, Runner: &testRunner{}}, tasks, store, discard())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Run(ctx); err != nil {
		t.Errorf("Run with a cancelled context = %v, want nil", err)
	}
}

// completedReason returns the reason of a task's terminal event.
func completedReason(tb testing.TB, store eventstore.Store, id string) string {
	tb.Helper()
	for _, e := range readStream(tb, store, task.StreamID(id)) {
		if e.Type == task.EventCompleted {
			var c task.Completed
			if err := json.Unmarshal(e.Data, &c); err != nil {
				tb.Fatal(err)
			}
			return c.Reason
		}
	}
	return ""
}

// fakeQuota is a Quota whose Check is a function; it records the calls.
type fakeQuota struct {
	check func(t task.Task) error
	fake  *sandboxtest.Fake

	mu    sync.Mutex
	calls []string // "limit", "release"; "check" only before the first limit
	// createdAtLimit is how many sandboxes existed when Limit was called.
	createdAtLimit int
}

func (q *fakeQuota) Limit(ctx context.Context, t task.Task) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.calls = append(q.calls, "limit")
	q.createdAtLimit = len(q.fake.Created())
	return nil
}

func (q *fakeQuota) Check(ctx context.Context, t task.Task) (time.Duration, error) {
	return 10 * time.Millisecond, q.check(t)
}

func (q *fakeQuota) Release(ctx context.Context, t task.Task) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.calls = append(q.calls, "release")
}

func (q *fakeQuota) called() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.calls)
}

// overOnceSet is a quota check that passes until over is set, then fails
// with msg.
func overOnceSet(over *atomic.Bool, msg string) func(task.Task) error {
	return func(task.Task) error {
		if over.Load() {
			return errors.New(msg)
		}
		return nil
	}
}

// exitsOnClose is a main process that ignores Stop and exits with code once
// exit is closed.
func exitsOnClose(exit <-chan struct{}, code int) func(context.Context, sandbox.Spec) sandbox.ExitStatus {
	return func(context.Context, sandbox.Spec) sandbox.ExitStatus {
		<-exit
		return sandbox.ExitStatus{Code: code}
	}
}

func TestQuotaStopsTask(t *testing.T) {
	store := sqlitetest.Open(t)
	fake := MustNewFake(t, blockUntilStopped)
	var checks atomic.Int32
	q := &fakeQuota{fake: fake, check: func(task.Task) error {
		if checks.Add(1) < 3 {
			return nil // under quota for the first checks
		}
		return errors.New("output quota exceeded: 2MiB of 1MiB")
	}}
	h := MustStart(t, store, Options{Quota: q}, fake)
	id := MustEnqueue(t, h.tasks, task.Spec{TimeoutMinutes: 1})
	got := waitStatus(t, h.tasks, id, task.Failed)
	if r := completedReason(t, store, id); got.ErrorMessage != "output quota exceeded: 2MiB of 1MiB" || r != "quota" {
		t.Errorf("error message %q, reason %q", got.ErrorMessage, r)
	}
	if n := checks.Load(); n < 3 {
		t.Errorf("quota checked %d times, want at least 3", n)
	}
	waitFor(t, "the quota to be released", func() bool { return len(q.called()) == 2 })
	if c := q.called(); !slices.Equal(c, []string{"limit", "release"}) || q.createdAtLimit != 0 {
		t.Errorf("quota calls %v with %d sandboxes created at Limit; want limit before the sandbox, release after", c, q.createdAtLimit)
	}
	if !slices.Contains(fake.Destroyed(), id) {
		t.Errorf("quota released before the sandbox was destroyed")
	}
}

// A worker may report its end and write on while its sandbox lives: the
// quota is watched until the sandbox is gone, and a sandbox over it is
// killed without waiting for the exit grace or the stop grace.
func TestQuotaWatchedAfterTaskEnds(t *testing.T) {
	store := sqlitetest.Open(t)
	release := make(chan struct{})
	defer close(release)
	// A main process that ignores SIGTERM: only a kill ends it.
	fake := MustNewFake(t, exitsOnClose(release, 0))
	var over atomic.Bool
	q := &fakeQuota{fake: fake, check: overOnceSet(&over, "output quota exceeded: written after the end")}
	h := MustStart(t, store, Options{Quota: q, ExitGrace: 100 * time.Millisecond, StopGrace: time.Hour}, fake)
	id := MustEnqueue(t, h.tasks, task.Spec{})
	waitStatus(t, h.tasks, id, task.Running)
	completeByWebhook(t, h.tasks, id)
	// The exit grace passes: a graceful stop begins, which the process ignores.
	waitFor(t, "the graceful stop", func() bool { return slices.Contains(fake.Stopped(), id) })
	time.Sleep(50 * time.Millisecond)
	over.Store(true)
	// Only a kill ends it: the stop grace is an hour.
	waitFor(t, "the sandbox to be killed and destroyed", func() bool { return slices.Contains(fake.Destroyed(), id) })
	checkWebhookEndKept(t, h.tasks, id)
}

// A worker that stopped at a write the kernel refused ends with the
// quota's error, not its own exit status.
func TestQuotaLastLookAtExit(t *testing.T) {
	store := sqlitetest.Open(t)
	exit := make(chan struct{})
	fake := MustNewFake(t, exitsOnClose(exit, 1))
	var exited atomic.Bool
	q := &fakeQuota{fake: fake, check: overOnceSet(&exited, "output quota exceeded: at the limit")}
	h := MustStart(t, store, Options{Quota: q}, fake)
	id := MustEnqueue(t, h.tasks, task.Spec{})
	waitStatus(t, h.tasks, id, task.Running)
	time.Sleep(30 * time.Millisecond) // a few checks under the quota
	exited.Store(true)
	close(exit)
	got := waitStatus(t, h.tasks, id, task.Failed)
	if r := completedReason(t, store, id); got.ErrorMessage != "output quota exceeded: at the limit" || r != "quota" {
		t.Errorf("task = %q (%s), want the quota error", got.ErrorMessage, r)
	}
	if c := h.collected(); len(c) != 0 {
		t.Errorf("collected %v, want no collection of a task over its quota", c)
	}
}

// A server that crashed after creating a task's sandbox but before
// recording it started: the next one finds the sandbox by its labels and
// records the start it missed, then the reattach, so the task's log has
// every step and the task runs on to its end.
func TestReconcileStartingTaskIsRecordedStarted(t *testing.T) {
	store := sqlitetest.Open(t)
	finish := make(chan struct{})
	fake := MustNewFake(t, runUntilFinished(finish))
	id := mustStartingTask(t, store)
	mustCreateManaged(t, fake, id, id)

	h := MustStart(t, store, Options{}, fake.Restart())
	got := waitStatus(t, h.tasks, id, task.Running)
	if got.SandboxName != id || len(got.Handle) == 0 {
		t.Errorf("started task has sandbox %q and handle %s, want both", got.SandboxName, got.Handle)
	}
	close(finish)
	waitStatus(t, h.tasks, id, task.Success)
	want := []string{task.EventCreated, task.EventQueued, task.EventStarting, task.EventAdopted, task.EventStarted, task.EventReattached, task.EventCompleted}
	if diff := cmp.Diff(want, streamTypes(t, store, task.StreamID(id))); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// A task whose worker finished while the server was down (its status.json
// written, its report still being retried) is recorded ended during
// reconciliation, not when the worker's next retry comes, and its sandbox
// is stopped. Its report is read before the reattach is recorded: a client
// that lets the worker finish once it sees the reattach knows that the
// worker's webhook, not this read, ends the task.
func TestReconcileRecordsReportedTaskAtOnce(t *testing.T) {
	store := sqlitetest.Open(t)
	fake := MustNewFake(t, blockUntilStopped)
	id := mustRunUntilRunning(t, store, fake)

	var readAfter atomic.Int32 // reattaches recorded when the report was read
	reported := func(ctx context.Context, tk task.Task) (task.Completed, bool) {
		readAfter.Add(int32(countType(t, store, task.StreamID(tk.ID), task.EventReattached)))
		code := 0
		return task.Completed{Status: task.Success, ExitCode: &code, Summary: "from status.json", Reason: "recovered"}, true
	}
	h := MustStart(t, store, Options{Runner: &testRunner{reported: reported}, ExitGrace: 10 * time.Millisecond}, fake.Restart())
	got := waitStatus(t, h.tasks, id, task.Success)
	if got.Summary != "from status.json" {
		t.Errorf("summary %q, want the reported one", got.Summary)
	}
	waitFor(t, "the second reconciliation", func() bool {
		return countType(t, store, task.SystemStream, task.EventReconciled) == 2
	})
	evs, err := store.ReadAll(context.Background(), 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	done, reconciled := -1, -1 // the second server's reconciliation is the last
	for i, e := range evs {
		switch e.Type {
		case task.EventCompleted:
			done = i
		case task.EventReconciled:
			reconciled = i
		}
	}
	if done < 0 || done > reconciled {
		t.Errorf("task_completed at %d, reconciled at %d: want the task recorded ended during reconciliation", done, reconciled)
	}
	if n := readAfter.Load(); n != 0 {
		t.Errorf("the report was read with %d task_reattached recorded, want it read before the reattach's commit", n)
	}
	if got := streamTypes(t, store, task.StreamID(id)); !slices.Equal(got[len(got)-3:], []string{task.EventAdopted, task.EventReattached, task.EventCompleted}) {
		t.Errorf("events %v, want them to end adopted, reattached, completed", got)
	}
	waitFor(t, "the sandbox to be destroyed", func() bool { return slices.Contains(fake.Destroyed(), id) })
}

// fullStore refuses every task_completed (or every event of refused's
// types) while full is set, as a store on a full disk does.
type fullStore struct {
	eventstore.Store
	full    atomic.Bool
	refused []string
	// unreachable: the refusal is a store out of reach (a database
	// restarting), not a full disk.
	unreachable bool
}

func (s *fullStore) Append(ctx context.Context, stream string, expected int64, evs ...eventstore.Proposed) ([]eventstore.Event, error) {
	refused := s.refused
	if refused == nil {
		refused = []string{task.EventCompleted}
	}
	if s.full.Load() && slices.ContainsFunc(evs, func(e eventstore.Proposed) bool { return slices.Contains(refused, e.Type) }) {
		if s.unreachable {
			return nil, fmt.Errorf("connection cut: %w", errdefs.ErrUnavailable)
		}
		return nil, errors.New("database or disk is full")
	}
	return s.Store.Append(ctx, stream, expected, evs...)
}

// A task whose start is recorded while the store is out of reach waits for
// it: its sandbox runs on, and the start is recorded once the store is
// back.
func TestStartRecordedWhenTheStoreIsBack(t *testing.T) {
	store := &fullStore{Store: sqlitetest.Open(t), refused: []string{task.EventStarted}, unreachable: true}
	store.full.Store(true)
	fake := MustNewFake(t, blockUntilStopped)
	h := MustStart(t, store, Options{RecordRetry: 5 * time.Millisecond}, fake)
	id := MustEnqueue(t, h.tasks, task.Spec{})
	waitFor(t, "the sandbox to start", func() bool { return len(fake.Created()) > 0 })
	time.Sleep(50 * time.Millisecond) // several refused tries
	if got, _ := h.tasks.Get(id); got.Status != task.Starting || slices.Contains(fake.Stopped(), id) {
		t.Fatalf("task %s, stopped %v while the store is out of reach; want it starting, its sandbox running", got.Status, fake.Stopped())
	}
	store.full.Store(false)
	waitStatus(t, h.tasks, id, task.Running)
}

// A task whose start the store refuses (its sandbox filled the disk at
// once) does not stay starting with no one watching its sandbox: the
// sandbox is stopped and destroyed, and the task ends failed, saying why.
func TestStartNotRecordedEndsTheTask(t *testing.T) {
	store := &fullStore{Store: sqlitetest.Open(t), refused: []string{task.EventStarted}}
	store.full.Store(true)
	fake := MustNewFake(t, blockUntilStopped)
	h := MustStart(t, store, Options{RecordRetry: 5 * time.Millisecond}, fake)
	id := MustEnqueue(t, h.tasks, task.Spec{})
	got := waitStatus(t, h.tasks, id, task.Failed)
	if !strings.Contains(got.ErrorMessage, "record the sandbox's start") || got.StartedAt != nil {
		t.Errorf("ended with %q, started at %v; want the unrecorded start named, and no start", got.ErrorMessage, got.StartedAt)
	}
	if !slices.Contains(fake.Stopped(), id) || !slices.Contains(fake.Destroyed(), id) {
		t.Errorf("stopped %v, destroyed %v: want the task's sandbox stopped and destroyed", fake.Stopped(), fake.Destroyed())
	}
}

// A task whose end the store refuses keeps its sandbox (and so its exit
// status) and is recorded once the store takes events again, with the
// result it had, not as lost.
func TestEndRecordedWhenTheStoreRecovers(t *testing.T) {
	store := &fullStore{Store: sqlitetest.Open(t)}
	store.full.Store(true)
	fake := MustNewFake(t, exitsAtOnce)
	h := MustStart(t, store, Options{RecordRetry: 5 * time.Millisecond}, fake)
	id := MustEnqueue(t, h.tasks, task.Spec{})
	waitFor(t, "the sandbox to exit and Collect to run", func() bool { return len(h.collected()) > 0 })
	time.Sleep(50 * time.Millisecond) // several refused tries
	if got, _ := h.tasks.Get(id); got.Status != task.Running {
		t.Fatalf("task is %s while the store refuses its end, want running", got.Status)
	}
	if slices.Contains(fake.Destroyed(), id) {
		t.Fatal("the sandbox was destroyed before the task's end was recorded")
	}
	store.full.Store(false)
	got := waitStatus(t, h.tasks, id, task.Success)
	if got.Summary != "collected" {
		t.Errorf("summary %q, want Collect's", got.Summary)
	}
	waitFor(t, "the sandbox to be destroyed", func() bool { return slices.Contains(fake.Destroyed(), id) })
	if n := len(h.collected()); n != 1 {
		t.Errorf("Collect ran %d times, want once: the result is kept, not collected again", n)
	}
}

// A cancel whose end the store refuses still stops the sandbox, does not
// spin, and is recorded as cancelled once the store recovers.
func TestCancelRecordedWhenTheStoreRecovers(t *testing.T) {
	store := &fullStore{Store: sqlitetest.Open(t)}
	fake := MustNewFake(t, blockUntilStopped)
	h := MustStart(t, store, Options{RecordRetry: 5 * time.Millisecond, StopGrace: time.Millisecond}, fake)
	id := MustEnqueue(t, h.tasks, task.Spec{})
	waitStatus(t, h.tasks, id, task.Running)
	store.full.Store(true)
	MustAppend(t, h.tasks, id, projection.NewEvent(task.EventCancelRequested, task.CancelRequested{Reason: "test"}, "test"))
	waitFor(t, "the sandbox to be stopped", func() bool { return slices.Contains(fake.Stopped(), id) })
	store.full.Store(false)
	got := waitStatus(t, h.tasks, id, task.Cancelled)
	if got.ErrorMessage != "cancelled" || len(h.collected()) != 0 {
		t.Errorf("ended with %q after %d Collect calls, want the cancel's end and none", got.ErrorMessage, len(h.collected()))
	}
}

// mustStartingTask records a task as a server that died right after
// task_starting leaves it: queued, then starting, nothing of a sandbox
// recorded.
func mustStartingTask(t *testing.T, store eventstore.Store) string {
	t.Helper()
	tasks := projection.New(store, discard())
	if err := tasks.Rebuild(context.Background()); err != nil {
		t.Fatal(err)
	}
	id := MustEnqueue(t, tasks, task.Spec{})
	MustAppend(t, tasks, id, projection.NewEvent(task.EventStarting, nil, ActorScheduler))
	return id
}

// reconciledSummary returns the last reconciliation's summary.
func reconciledSummary(t *testing.T, store eventstore.Store) Reconciled {
	t.Helper()
	var r Reconciled
	for _, e := range readStream(t, store, task.SystemStream) {
		if e.Type == task.EventReconciled {
			r = Reconciled{}
			if err := json.Unmarshal(e.Data, &r); err != nil {
				t.Fatal(err)
			}
		}
	}
	return r
}

// A server that died after recording a task starting but before its
// sandbox existed (a claim cut short, a launcher never let go): nothing of
// the task ran, so the next server starts it again, once, in the slot it
// held, and records why; it is never ended lost.
func TestReconcileStartingWithoutSandboxStartsAgain(t *testing.T) {
	store := sqlitetest.Open(t)
	fake := MustNewFake(t, exitsAtOnce)
	id := mustStartingTask(t, store)

	h := MustStart(t, store, Options{}, fake)
	waitStatus(t, h.tasks, id, task.Success)
	want := []string{task.EventCreated, task.EventQueued, task.EventStarting, task.EventAdopted, task.EventStartRetried, task.EventStarted, task.EventCompleted}
	if diff := cmp.Diff(want, streamTypes(t, store, task.StreamID(id))); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if n := len(fake.Created()); n != 1 {
		t.Errorf("%d sandboxes created, want 1", n)
	}
	if c := h.collected(); len(c) != 1 || c[0].exit == nil || c[0].exit.Code != 0 {
		t.Errorf("Collect calls %+v, want one with the real exit", c)
	}
	waitFor(t, "the reconciliation", func() bool { return reconciledSummary(t, store).Restarted == 1 })
	if r := reconciledSummary(t, store); r.Ended != 0 || r.Reattached != 0 {
		t.Errorf("reconciled %+v, want the one task started again", r)
	}
}

// A server that died after handing a task's sandbox over but before its
// worker had the start: the sandbox ends without running the task's
// command (ExitStatus.NotStarted). Its exit is not the task's: the next
// server destroys it and starts the task again, once.
func TestReconcileNotStartedSandboxStartsAgain(t *testing.T) {
	store := sqlitetest.Open(t)
	var runs atomic.Int32
	fake := MustNewFake(t, func(ctx context.Context, spec sandbox.Spec) sandbox.ExitStatus {
		if runs.Add(1) == 1 {
			return sandbox.ExitStatus{Code: 0, NotStarted: true, Message: "its worker never had its start"}
		}
		return sandbox.ExitStatus{Code: 3}
	})
	id := mustStartingTask(t, store)
	mustCreateManaged(t, fake, id, id)
	waitFor(t, "the handed-over sandbox's end", func() bool {
		st, err := fake.Status(context.Background(), id)
		return err == nil && st.State == sandbox.StateExited
	})

	h := MustStart(t, store, Options{}, fake.Restart())
	got := waitStatus(t, h.tasks, id, task.Failed)
	if got.ExitCode == nil || *got.ExitCode != 3 {
		t.Errorf("exit code %v, want 3, the command's", got.ExitCode)
	}
	if !slices.Contains(fake.Destroyed(), id) || len(fake.Created()) != 2 {
		t.Errorf("destroyed %v, %d created: want the sandbox that never started destroyed, and one more", fake.Destroyed(), len(fake.Created()))
	}
	if c := h.collected(); len(c) != 1 || c[0].exit == nil || c[0].exit.NotStarted {
		t.Errorf("Collect calls %+v, want one, of the run that started", c)
	}
	evs := readStream(t, store, task.StreamID(id))
	i := slices.IndexFunc(evs, func(e eventstore.Event) bool { return e.Type == task.EventStartRetried })
	if i < 0 {
		t.Fatalf("no %s in %v", task.EventStartRetried, streamTypes(t, store, task.StreamID(id)))
	}
	var p task.StartRetried
	if err := json.Unmarshal(evs[i].Data, &p); err != nil || p.SandboxName != id || p.Reason == "" {
		t.Errorf("%s payload %s: want the sandbox and why", task.EventStartRetried, evs[i].Data)
	}
}

// A task that had ended while its sandbox wound down (reported by webhook,
// inside the exit grace) has its sandbox destroyed when the server stops,
// not left to the next server's start; a running task's is left running.
func TestShutdownDestroysEndedTasksSandbox(t *testing.T) {
	store := sqlitetest.Open(t)
	fake := MustNewFake(t, blockUntilStopped)
	h := MustStart(t, store, Options{ExitGrace: time.Hour, MaxConcurrent: 2}, fake)
	ended := MustEnqueue(t, h.tasks, task.Spec{})
	running := MustEnqueue(t, h.tasks, task.Spec{})
	waitStatus(t, h.tasks, ended, task.Running)
	waitStatus(t, h.tasks, running, task.Running)
	MustAppend(t, h.tasks, ended, projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Success, Reason: "webhook"}, "worker"))
	h.stop()
	if !slices.Contains(fake.Destroyed(), ended) {
		t.Errorf("destroyed %v after the stop: want the ended task's sandbox", fake.Destroyed())
	}
	if st, err := fake.Status(context.Background(), running); err != nil || st.State != sandbox.StateRunning {
		t.Errorf("the running task's sandbox after the stop: %v %v, want it running", st.State, err)
	}
}

// StopAll, after Run, ends the tasks that run as cancelled by the
// shutdown, stops their sandboxes with the grace and destroys them, and
// leaves queued tasks queued.
func TestStopAllEndsRunningTasks(t *testing.T) {
	store := sqlitetest.Open(t)
	fake := MustNewFake(t, blockUntilStopped)
	h := MustStart(t, store, Options{StopGrace: time.Second, MaxConcurrent: 2}, fake)
	running := []string{MustEnqueue(t, h.tasks, task.Spec{}), MustEnqueue(t, h.tasks, task.Spec{})}
	for _, id := range running {
		waitStatus(t, h.tasks, id, task.Running)
	}
	queued := MustEnqueue(t, h.tasks, task.Spec{})
	h.stop()
	h.sched.StopAll(context.Background())
	for _, id := range running {
		var end task.Completed
		for _, e := range readStream(t, store, task.StreamID(id)) {
			if e.Type == task.EventCompleted {
				json.Unmarshal(e.Data, &end)
			}
		}
		if end.Status != task.Cancelled || end.Reason != "shutdown" || !strings.Contains(end.ErrorMessage, "the server shut down") {
			t.Errorf("task %s's end after StopAll: %+v; want cancelled by the shutdown", id, end)
		}
		if !slices.Contains(fake.Stopped(), id) || !slices.Contains(fake.Destroyed(), id) {
			t.Errorf("task %s's sandbox: stopped %v, destroyed %v; want both", id, fake.Stopped(), fake.Destroyed())
		}
	}
	if got, _ := h.tasks.Get(queued); got.Status != task.Queued {
		t.Errorf("the queued task after StopAll: %s, want queued", got.Status)
	}
	if c := h.collected(); len(c) != 0 {
		t.Errorf("Collect called for tasks the shutdown ended: %v", c)
	}
}

// listing is a runtime whose List fails while err is set.
type listing struct {
	sandbox.Runtime
	err error
}

func (l *listing) List(context.Context, map[string]string) ([]sandbox.Handle, error) {
	return nil, l.err
}

// A runtime out of reach is logged once while it stays so (adoption lists
// the sandboxes every second), again once it is back, and again when it
// fails anew.
func TestListFailureLoggedOnce(t *testing.T) {
	var logs bytes.Buffer
	rt := &listing{err: errors.New("cannot reach the engine")}
	s := New(Options{Runtimes: map[string]sandbox.Runtime{"docker": rt}}, nil, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	count := func(msg string) int { return strings.Count(logs.String(), `msg="`+msg+`"`) }
	for range 3 {
		s.listSandboxes(context.Background())
	}
	rt.err = nil
	s.listSandboxes(context.Background())
	rt.err = errors.New("cannot reach the engine")
	s.listSandboxes(context.Background())
	if w, i := count("cannot list sandboxes"), count("sandboxes listed again"); w != 2 || i != 1 {
		t.Errorf("logged %d failures and %d recoveries, want 2 and 1:\n%s", w, i, logs.String())
	}
}

// spawn records a task for the fake runtime as the orchestrator's spawn
// does: created and queued, and task_starting in the same append when
// Admit gives it a slot. It returns the task's id and whether it was
// admitted.
func spawn(tb testing.TB, h *harness, spec task.Spec) (string, bool) {
	tb.Helper()
	spec.Runtime, spec.TimeoutMinutes = "fake", 10
	evs := []eventstore.Proposed{
		projection.NewEvent(task.EventCreated, task.Created{Spec: spec}, "test"),
		projection.NewEvent(task.EventQueued, nil, "test"),
	}
	starting, done, ok := h.sched.Admit(spec)
	if ok {
		evs = append(evs, starting)
	}
	id := task.NewID()
	_, err := h.tasks.Create(context.Background(), id, evs...)
	if ok {
		done()
	}
	if err != nil {
		tb.Fatal(err)
	}
	return id, ok
}

// waitAssigning waits until h's scheduler has reconciled and leads: until
// then it admits no spawn.
func waitAssigning(tb testing.TB, h *harness) {
	tb.Helper()
	waitFor(tb, "the scheduler to reconcile and lead", func() bool {
		select {
		case <-h.sched.Reconciled():
			return h.sched.leading.Load()
		default:
			return false
		}
	})
}

// TestAdmitStartsFromTheSpawnCommit: a task spawned while a slot is free
// is given its replica in the spawn's own commit and started from it,
// with no commit of task_starting of its own; while the one slot is held,
// the next spawn is queued and starts when the slot frees, as before; a
// task on a named workspace is always left to the queue.
func TestAdmitStartsFromTheSpawnCommit(t *testing.T) {
	store := sqlitetest.Open(t)
	finish := make(chan struct{})
	fake := MustNewFake(t, runUntilFinished(finish))
	h := MustStart(t, store, Options{MaxConcurrent: 1}, fake)
	waitAssigning(t, h)
	first, ok := spawn(t, h, task.Spec{})
	if !ok {
		t.Fatal("the spawn of a task with a free slot was not admitted")
	}
	waitStatus(t, h.tasks, first, task.Running)
	second, ok := spawn(t, h, task.Spec{})
	if ok {
		t.Fatal("a spawn was admitted while the only slot is held")
	}
	if _, _, ok := h.sched.Admit(task.Spec{Runtime: "fake", Workspace: "w"}); ok {
		t.Error("a workspace task was admitted: it must hold its workspace first (fill)")
	}
	close(finish)
	waitStatus(t, h.tasks, first, task.Success)
	waitStatus(t, h.tasks, second, task.Success)
	evs := readStream(t, store, task.StreamID(first))
	want := []string{task.EventCreated, task.EventQueued, task.EventStarting, task.EventStarted, task.EventCompleted}
	var got []string
	for _, e := range evs {
		got = append(got, e.Type)
	}
	if diff := cmp.Diff(want, got[:min(len(got), len(want))]); diff != "" {
		t.Errorf("the admitted task's events (-want +got):\n%s", diff)
	}
	// One append, one commit: the spawn's three events share a time,
	// taken when their commit began, and the start's is later.
	if !evs[2].RecordedAt.Equal(evs[0].RecordedAt) || evs[3].RecordedAt.Equal(evs[0].RecordedAt) {
		t.Errorf("recorded at %v: want created, queued and starting in one commit, started in another", []time.Time{evs[0].RecordedAt, evs[1].RecordedAt, evs[2].RecordedAt, evs[3].RecordedAt})
	}
	if got := streamTypes(t, store, task.StreamID(second)); slices.Index(got, task.EventStarting) != 2 || slices.Index(got[3:], task.EventStarting) >= 0 {
		t.Errorf("the queued task's events %v: want one task_starting, after task_queued", got)
	}
}

// TestAdmitNeverPassesMaxConcurrent: spawns admitted at once from many
// callers, while fill starts the queued ones, never run more sandboxes
// than the limit, and every task ends.
func TestAdmitNeverPassesMaxConcurrent(t *testing.T) {
	store := sqlitetest.Open(t)
	var running, maxRunning atomic.Int32
	fake := MustNewFake(t, func(ctx context.Context, spec sandbox.Spec) sandbox.ExitStatus {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			m := maxRunning.Load()
			if n <= m || maxRunning.CompareAndSwap(m, n) {
				break
			}
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
		}
		return sandbox.ExitStatus{Code: 0}
	})
	h := MustStart(t, store, Options{MaxConcurrent: 2}, fake)
	waitAssigning(t, h)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ids []string
	var admitted atomic.Int32
	for range 8 {
		wg.Go(func() {
			for range 4 {
				id, ok := spawn(t, h, task.Spec{})
				if ok {
					admitted.Add(1)
				}
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		waitStatus(t, h.tasks, id, task.Success)
	}
	if got := maxRunning.Load(); got > 2 {
		t.Errorf("%d sandboxes ran at once, over the limit of 2", got)
	}
	if admitted.Load() == 0 {
		t.Error("no spawn was admitted")
	}
	waitFor(t, "every slot to be released", func() bool { return h.sched.Running() == 0 })
}

// TestIdleFillLeavesAdmitFree: fill, which Run calls at every event of
// every task, does not take the assignment lock while no task waits: a
// spawn's Admit, which only tries the lock, would find it held and queue
// its task (in a burst, the rest after it), which then waits for fill and
// a commit of its own.
func TestIdleFillLeavesAdmitFree(t *testing.T) {
	store := sqlitetest.Open(t)
	finish := make(chan struct{})
	defer close(finish)
	h := MustStart(t, store, Options{MaxConcurrent: 4}, MustNewFake(t, runUntilFinished(finish)))
	waitAssigning(t, h)
	if _, ok := spawn(t, h, task.Spec{}); !ok {
		t.Fatal("the spawn of a task with a free slot was not admitted")
	}
	h.sched.assigning.Lock()
	filled := make(chan struct{})
	go func() {
		defer close(filled)
		h.sched.fill(context.Background())
	}()
	select {
	case <-filled:
	case <-time.After(time.Minute):
		t.Error("fill with no task waiting waited for the assignment lock")
	}
	h.sched.assigning.Unlock()
	<-filled
}

// A sandbox whose destroy fails after its task's end is destroyed again
// while the server runs, each wait twice the last, and its end recorded
// beside the failure; one quarantined is left to an operator.
func TestFailedDestroyTriedAgain(t *testing.T) {
	for _, c := range []struct {
		name        string
		err         error
		fails       int // destroys that fail before one succeeds
		wantDestroy bool
	}{
		{"held for a while", errors.New("cgroup busy"), 3, true},
		{"quarantined", fmt.Errorf("give back: %w", sandbox.ErrQuarantined), 1 << 30, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := sqlitetest.Open(t)
			fake := MustNewFake(t, exitsAtOnce)
			var mu sync.Mutex
			var at []time.Time
			fake.DestroyErr = func(id string) error {
				mu.Lock()
				defer mu.Unlock()
				at = append(at, time.Now())
				if len(at) <= c.fails {
					return c.err
				}
				return nil
			}
			h := MustStart(t, store, Options{DestroyRetry: 20 * time.Millisecond}, fake)
			id := MustEnqueue(t, h.tasks, task.Spec{})
			waitStatus(t, h.tasks, id, task.Success)
			stream := task.StreamID(id)
			if !c.wantDestroy {
				waitFor(t, "the failed destroy's record", func() bool { return countType(t, store, stream, task.EventSandboxDestroyFailed) == 1 })
				time.Sleep(300 * time.Millisecond) // 15 first waits
				mu.Lock()
				n := len(at)
				mu.Unlock()
				if n != 1 || countType(t, store, stream, task.EventSandboxDestroyed) != 0 {
					t.Errorf("a quarantined sandbox was destroyed %d times, %v", n, streamTypes(t, store, stream))
				}
				return
			}
			waitFor(t, "the sandbox destroyed", func() bool { return slices.Contains(fake.Destroyed(), id) })
			waitFor(t, "its record", func() bool { return countType(t, store, stream, task.EventSandboxDestroyed) == 1 })
			if n := countType(t, store, stream, task.EventSandboxDestroyFailed); n != 1 {
				t.Errorf("%d failures recorded, want the first only: %v", n, streamTypes(t, store, stream))
			}
			evs := readStream(t, store, stream)
			var got task.SandboxDestroyed
			if err := json.Unmarshal(evs[len(evs)-1].Data, &got); err != nil || got != (task.SandboxDestroyed{SandboxName: id, Attempts: 4}) {
				t.Errorf("last event %s %s (%v), want the destroy after 4 attempts", evs[len(evs)-1].Type, evs[len(evs)-1].Data, err)
			}
			mu.Lock()
			defer mu.Unlock()
			for i := 1; i < len(at); i++ {
				if wait, least := at[i].Sub(at[i-1]), 20*time.Millisecond<<(i-1); wait < least {
					t.Errorf("attempt %d came %v after the one before, want at least %v", i+1, wait, least)
				}
			}
		})
	}
}

// A destroy tried again in the background ends with the server: the
// next start's reconciliation finds the sandbox of an ended task.
func TestFailedDestroyEndsWithTheServer(t *testing.T) {
	store := sqlitetest.Open(t)
	fake := MustNewFake(t, exitsAtOnce)
	var tries atomic.Int32
	fake.DestroyErr = func(string) error { tries.Add(1); return errors.New("still busy") }
	h := MustStart(t, store, Options{DestroyRetry: 10 * time.Millisecond}, fake)
	id := MustEnqueue(t, h.tasks, task.Spec{})
	waitStatus(t, h.tasks, id, task.Success)
	waitFor(t, "a second attempt", func() bool { return tries.Load() >= 2 })
	stopped := make(chan struct{})
	go func() { h.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the server's stop waited for the destroy tried again")
	}
	n := tries.Load()
	time.Sleep(100 * time.Millisecond)
	if tries.Load() != n {
		t.Errorf("destroys went on after the stop: %d, then %d", n, tries.Load())
	}
	fake.DestroyErr = nil
	h2 := MustStart(t, store, Options{}, fake)
	waitFor(t, "the next start to destroy it", func() bool { return slices.Contains(fake.Destroyed(), id) })
	h2.stop()
}
