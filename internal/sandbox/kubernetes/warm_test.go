package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/warmpool"
	"github.com/corral-dev/corral/internal/workerproto"
)

// The pools shrink when any node reports MemoryPressure, and only then.
func TestMemoryPressure(t *testing.T) {
	node := func(conds ...corev1.NodeCondition) corev1.Node {
		return corev1.Node{Status: corev1.NodeStatus{Conditions: conds}}
	}
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue}
	calm := corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse}
	pressed := corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionTrue}
	disk := corev1.NodeCondition{Type: corev1.NodeDiskPressure, Status: corev1.ConditionTrue}
	for _, tt := range []struct {
		name  string
		nodes []corev1.Node
		want  bool
	}{
		{"no nodes", nil, false},
		{"calm", []corev1.Node{node(ready, calm), node(ready, calm, disk)}, false},
		{"one pressed", []corev1.Node{node(ready, calm), node(ready, pressed)}, true},
	} {
		if got := memoryPressure(tt.nodes); got != tt.want {
			t.Errorf("%s: memoryPressure = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// A warm pod's token answers its start, and nothing else: a wrong token,
// a poll after the start of a claim with no record, and a pod destroyed
// get ErrNotFound, on which the pod's worker exits without a task.
func TestWarmStartOnce(t *testing.T) {
	r := &Runtime{waiters: map[string]*waiter{}, log: slog.New(slog.DiscardHandler)}
	pod := func(id, token string) *waiter {
		w := &waiter{token: sha256.Sum256([]byte(token)), polled: make(chan struct{}), start: make(chan []byte, 1), gone: make(chan struct{})}
		r.waiters[id] = w
		return w
	}
	ctx := context.Background()
	w := pod("warm-a", "secret-a")
	pod("warm-b", "secret-b")
	if _, err := r.WarmStart(ctx, "warm-a", "secret-b"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another pod's token: %v, want ErrNotFound", err)
	}
	w.start <- []byte(`{"argv":["true"]}`)
	got, err := r.WarmStart(ctx, "warm-a", "secret-a")
	if err != nil || string(got) != `{"argv":["true"]}` {
		t.Fatalf("the start: %q, %v", got, err)
	}
	select {
	case <-w.polled:
	default:
		t.Error("the poll did not mark the pod as waiting")
	}
	if _, err := r.WarmStart(ctx, "warm-a", "secret-a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a second poll after the start: %v, want ErrNotFound", err)
	}
	close(r.waiters["warm-b"].gone)
	if _, err := r.WarmStart(ctx, "warm-b", "secret-b"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a destroyed pod's poll: %v, want ErrNotFound", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	pod("warm-c", "secret-c")
	if got, err := r.WarmStart(cctx, "warm-c", "secret-c"); got != nil || err != nil {
		t.Fatalf("a poll whose request ended: %q, %v, want nothing (poll again)", got, err)
	}
}

// A claimed warm pod whose worker had no task (ExitNoTask) ended without
// running its task's command, and says so; any other end, and the same
// code from a cold Job's pod, is the command's own.
func TestNoTask(t *testing.T) {
	warm := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: warmpool.Prefix + "abcdefghij-0123456789abcdef"}}
	cold := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "task-1"}}
	for _, tt := range []struct {
		job  *batchv1.Job
		es   sandbox.ExitStatus
		want bool
	}{
		{warm, sandbox.ExitStatus{Code: workerproto.ExitNoTask}, true},
		{warm, sandbox.ExitStatus{Code: 0}, false},
		{warm, sandbox.ExitStatus{Code: 1}, false},
		{warm, sandbox.ExitStatus{Code: workerproto.ExitNoTask, OOMKilled: true}, false},
		{cold, sandbox.ExitStatus{Code: workerproto.ExitNoTask}, false},
	} {
		got := noTask(tt.job, tt.es)
		if got.NotStarted != tt.want || (tt.want && got.Message == "") || got.Code != tt.es.Code {
			t.Errorf("noTask(%s, %+v) = %+v, want NotStarted %v with a message", tt.job.Name, tt.es, got, tt.want)
		}
	}
}

// A claimed pod that asks again (its answer was cut short, by the
// server's death or its connection's) gets the same start from the
// claim's record, from this server or the next, once the record says it
// may have left, until the sandbox's destruction removes it; a wrong
// token, a record whose start never left and an id out of the warm dir
// get nothing.
func TestWarmStartResent(t *testing.T) {
	state := t.TempDir()
	r := &Runtime{opts: Options{StateDir: state}, waiters: map[string]*waiter{}, log: slog.New(slog.DiscardHandler)}
	id := warmpool.Prefix + "abcdefghij-0123456789abcdef"
	root := filepath.Join(r.warmDir(), id)
	if err := os.MkdirAll(root, 0o700); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("secret"))
	start := `{"argv":["true"],"env":["KEY=1"],"dir":"/w"}`
	rec, _ := json.Marshal(bindRecord{Token: hex.EncodeToString(sum[:]), Start: json.RawMessage(start)})
	if err := os.WriteFile(filepath.Join(root, bindFile), rec, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := r.WarmStart(ctx, id, "secret"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a poll before the start may have left: %v, want ErrNotFound", err)
	}
	if err := os.WriteFile(filepath.Join(root, sentFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if got, err := r.WarmStart(ctx, id, "secret"); err != nil || string(got) != start {
			t.Fatalf("a poll after the start left: %q, %v, want the same start", got, err)
		}
	}
	for _, bad := range []struct{ id, token string }{{id, "other"}, {"../" + id, "secret"}, {"warm-..", "secret"}} {
		if _, err := r.WarmStart(ctx, bad.id, bad.token); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("a poll of %q with token %q: %v, want ErrNotFound", bad.id, bad.token, err)
		}
	}
	os.RemoveAll(root)
	if _, err := r.WarmStart(ctx, id, "secret"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a poll after the sandbox's destruction: %v, want ErrNotFound", err)
	}
}

// A warm pod's start waits for its first poll, which a stopping server
// will not answer: when the pools stop, the wait ends at once (the pools
// start a sandbox to its end for up to 30 s after they stop, and every
// stop of a server with a pod starting waited them out).
func TestAwaitPollEndsWhenThePoolsStop(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	r := &Runtime{
		log:     slog.New(slog.DiscardHandler),
		jobs:    batchlisters.NewJobLister(idx).Jobs("ns"),
		pods:    corelisters.NewPodLister(idx).Pods("ns"),
		changed: make(chan struct{}),
		waiters: map[string]*waiter{},
	}
	b := &warmPod{id: "warm-a", w: &waiter{polled: make(chan struct{}), start: make(chan []byte, 1), gone: make(chan struct{})}}
	done := make(chan struct{})
	close(done)
	err := r.awaitPoll(context.Background(), done, b)
	if err == nil || !strings.Contains(err.Error(), "the server is stopping") {
		t.Fatalf("awaitPoll after the pools stopped = %v, want the server's stop", err)
	}
	// A poll that came is a poll, stop or not.
	close(b.w.polled)
	if err := r.awaitPoll(context.Background(), make(chan struct{}), b); err != nil {
		t.Fatalf("awaitPoll of a pod that polled = %v", err)
	}
}
