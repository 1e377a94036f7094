package kubernetes

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/sandbox/warmpool"
	"github.com/corral-dev/corral/internal/sandbox/warmstart"
	"github.com/corral-dev/corral/internal/workerproto"
)

// Warm pods (sandbox.Warmer).
//
// A warm pod is the Job of a shape's Template made ahead of need, under a
// name of its own (warmpool.Prefix, this server's tag, a random part) and
// labelled labelWarm. Its worker (`corral worker warm`) waits on the
// server, not on a pipe: it long-polls GET /api/warm/{id}/start at
// workerproto.EnvServerURL with a token of the pod's own (a random secret
// in the pod's environment Secret; the server keeps its hash). The pod is
// ready, and joins its pool, once its first poll has come in. Each
// per-task mount of the Template is the subPath of an empty slot
// directory of the pod's own on the claim, Options.StateDir/warm/<warm
// id>/<mount index>, which the server owns: the pod holds nothing of any
// task, not even a directory it may write to.
//
// A task whose spec fits the shape claims one (Create): its directories
// become the slots by rename on the claim's file system (warmpool.HandOver,
// as local does it: the pod's bind mount follows the slot's inode) and are
// given to the pod's identity; the Job is relabelled as the task's
// sandbox (LabelSandbox, the task's labels; labelWarm goes), which is how
// Wait, Status, Stop, Destroy and a restarted server find it and its pod
// (by the Job's name: the pod keeps the warm pod's labels); the
// Job's activeDeadlineSeconds, which counts from the Job's start, is
// patched to the time the pod has been up plus the task's wall-clock
// limit, so that the Job controller ends the task as it ends a cold one;
// and only then does the waiting poll get the task's argv, environment
// (its key, its egress credentials) and working directory. From there the
// pod is the task's: its end is the task's, Destroy deletes its Job, and
// its TTL applies as to a cold Job. A warm pod's token answers one start
// only: the pod never gets a second task.
//
// NetworkPolicies select worker pods by labelApp, which warm pods have
// from their creation; their security context is jobFor's, the same as a
// cold Job's.
//
// A server that restarts does not reattach warm pods: the new server does
// not know their tokens, so their polls are refused and their workers
// exit; KeepWarm destroys the warm Jobs a server gone left (putting a
// half-claimed task's entries back), and fills its pools anew.

// labelWarm marks a warm pod's Job and pod until a task claims it.
const labelWarm = "corral.dev/warm"

// warmPollWait is how long one poll of a warm pod waits for its task
// before the server answers "not yet" and the pod polls again.
const warmPollWait = 25 * time.Second

// warmReadyWait bounds how long a warm pod may take to start and poll.
const warmReadyWait = 3 * time.Minute

// warmPod is a warm pod in a pool.
type warmPod struct {
	id      string
	created time.Time                // its Job's creation, from which the Job's deadline counts
	slots   []string                 // the slot dirs, by mount index; "" for the others
	pool    *warmpool.Pool[*warmPod] // set when it is taken
	w       *waiter
}

// waiter is the server's side of a warm pod's polls.
type waiter struct {
	token  [32]byte      // the hash of the pod's token
	polled chan struct{} // closed at its first poll
	once   sync.Once
	start  chan []byte   // its task's warmstart.Start, once claimed
	gone   chan struct{} // closed when it is destroyed
}

// warmDir holds the warm pods' slots.
func (r *Runtime) warmDir() string { return filepath.Join(r.opts.StateDir, "warm") }

// KeepWarm implements sandbox.Warmer: one pool per shape, each filled to
// p.Size and refilled after every claim, within p's budget.
func (r *Runtime) KeepWarm(ctx context.Context, p sandbox.WarmPolicy) error {
	if p.Size <= 0 || len(p.Shapes) == 0 {
		return nil
	}
	if caps, _ := r.Capabilities(ctx); !caps.Available {
		return fmt.Errorf("keep pods warm: %s", caps.Reason)
	}
	if r.opts.ServerURL == "" || r.opts.StateDir == "" {
		return errors.New("keep pods warm: the runtime has no server URL or state dir")
	}
	// A claim patches the warm pod's Job: a Role from before warm pods
	// may not allow it.
	if ok, err := r.api.allowed(ctx, "patch", "batch", "jobs"); err == nil && !ok {
		return fmt.Errorf("keep pods warm: this server may not patch jobs in namespace %s, which a claim does (RBAC: corral k8s render has the Role it needs)", r.opts.Namespace)
	}
	if rel, err := filepath.Rel(r.opts.DataRoot, r.warmDir()); err != nil || !filepath.IsLocal(rel) {
		return fmt.Errorf("keep pods warm: the state dir %s is not in the data root %s, which pods mount", r.opts.StateDir, r.opts.DataRoot)
	}
	if err := os.MkdirAll(r.warmDir(), 0o711); err != nil {
		return fmt.Errorf("keep pods warm: %w", err)
	}
	for _, sh := range p.Shapes {
		if err := warmpool.CheckShape(sh, r.opts.DataRoot, r.warmDir()); err != nil {
			return err
		}
	}
	tag, lock, err := warmpool.Own(r.warmDir())
	if err != nil {
		return fmt.Errorf("keep pods warm: %w", err)
	}
	defer func() {
		lock.Release()
		os.Remove(warmpool.LockPath(r.warmDir(), tag))
	}()
	r.warmMu.Lock()
	r.warmTag = tag
	r.warmMu.Unlock()
	r.destroyLeftoverWarm(ctx, tag)
	if p.Pressure == nil {
		p.Pressure = r.nodePressure(ctx)
	}
	return r.warm.Keep(ctx, p)
}

// pressureEvery is how often nodePressure asks the API server.
const pressureEvery = 5 * time.Second

// nodePressure returns the pools' Pressure: whether a node of the
// cluster reports MemoryPressure, asked at most every pressureEvery. The
// kubelet of a node short of memory evicts pods by how far their use
// exceeds their requests, which spares idle warm pods and takes tasks':
// the pools empty themselves first instead, and stop filling until the
// pressure is gone. A server that may not list nodes (the rendered Role
// is namespaced) says so once, and its pools then follow their budget
// alone.
func (r *Runtime) nodePressure(ctx context.Context) func() bool {
	var mu sync.Mutex
	var asked time.Time
	var pressed, warned bool
	return func() bool {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(asked) < pressureEvery {
			return pressed
		}
		asked = time.Now()
		actx, cancel := context.WithTimeout(ctx, pressureEvery)
		defer cancel()
		nodes, err := r.api.nodes(actx)
		if err != nil {
			if !warned {
				warned = true
				r.log.Warn("warm pods do not follow the nodes' memory pressure: cannot list nodes (a ClusterRole with list on nodes allows it)", logkey.Error, err)
			}
			pressed = false
			return false
		}
		pressed = memoryPressure(nodes.Items)
		return pressed
	}
}

// memoryPressure reports whether any of nodes reports MemoryPressure.
func memoryPressure(nodes []corev1.Node) bool {
	for _, n := range nodes {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeMemoryPressure && c.Status == corev1.ConditionTrue {
				return true
			}
		}
	}
	return false
}

// WarmStats implements sandbox.Warmer.
func (r *Runtime) WarmStats() []sandbox.WarmStats { return r.warm.Stats() }

// warmOps starts and destroys the runtime's warm pods for its pools.
type warmOps struct{ r *Runtime }

// StartWarm makes a warm pod of shape and returns once it polls.
func (o warmOps) StartWarm(ctx context.Context, shape sandbox.WarmShape) (*warmPod, error) {
	r := o.r
	r.warmMu.Lock()
	tag := r.warmTag
	r.warmMu.Unlock()
	id := warmpool.Prefix + tag + "-" + strings.ToLower(rand.Text()[:16])
	token := rand.Text()
	b := &warmPod{id: id, w: &waiter{token: sha256.Sum256([]byte(token)), polled: make(chan struct{}), start: make(chan []byte, 1), gone: make(chan struct{})}}
	spec := shape.Template
	spec.ID = id
	spec.Image = ""
	spec.Labels = map[string]string{sandbox.LabelManaged: "true", labelWarm: "true"}
	spec.Mounts = slices.Clone(spec.Mounts)
	spec.Env = append(slices.Clone(spec.Env), workerproto.EnvServerURL+"="+r.opts.ServerURL, workerproto.EnvWarmID+"="+id, workerproto.EnvWarmToken+"="+token)
	root := filepath.Join(r.warmDir(), id)
	slots, err := warmpool.Slots(root, spec.Mounts)
	if err != nil {
		return nil, err
	}
	b.slots = slots
	for i, slot := range slots {
		if slot != "" {
			rel, _ := filepath.Rel(r.opts.DataRoot, slot)
			spec.Mounts[i].Source = filepath.ToSlash(rel)
		}
	}
	r.warmMu.Lock()
	r.waiters[id] = b.w
	r.warmMu.Unlock()
	job, err := r.create(ctx, spec, "[]")
	if err == nil {
		b.created = job.CreationTimestamp.Time
		err = r.awaitPoll(ctx, b)
	}
	if err != nil {
		o.DestroyWarm(context.WithoutCancel(ctx), b)
		return nil, err
	}
	return b, nil
}

// awaitPoll waits for warm pod b's first poll, or its pod's end.
func (r *Runtime) awaitPoll(ctx context.Context, b *warmPod) error {
	timeout := time.After(warmReadyWait)
	for {
		changed := r.changes()
		if job, pod := r.observed(b.id); job != nil && pod != nil {
			if es, ok := podExit(pod); ok {
				return fmt.Errorf("warm pod %s ended before it polled for its task: %s", b.id, es.Message)
			}
			// A warm pod the node has no room for must not hold the
			// pool's fill, nor take the room a task's pod needs.
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
					return fmt.Errorf("warm pod %s cannot be scheduled: %s", b.id, c.Message)
				}
			}
		}
		select {
		case <-b.w.polled:
			return nil
		case <-changed:
		case <-timeout:
			return fmt.Errorf("warm pod %s did not poll for its task within %s (does the pod reach kubernetes.server_url %s?)", b.id, warmReadyWait, r.opts.ServerURL)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// DestroyWarm destroys an unclaimed warm pod and its slots.
func (o warmOps) DestroyWarm(ctx context.Context, b *warmPod) error {
	r := o.r
	r.warmMu.Lock()
	if r.waiters[b.id] == b.w {
		delete(r.waiters, b.id)
		close(b.w.gone)
	}
	r.warmMu.Unlock()
	// By its name: a claim that failed half way may have relabelled it.
	job := &batchv1.Job{}
	err := r.api.get(ctx, "jobs", b.id, job)
	if err == nil {
		err = r.destroy(ctx, b.id, job)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("destroy warm pod %s: %w", b.id, err)
	}
	os.RemoveAll(filepath.Join(r.warmDir(), b.id))
	return nil
}

// WarmStart is a warm pod's poll for its task: the pod's id and token
// (its bearer token). It returns the task's warmstart.Start once the pod
// is claimed (once only), nil after warmPollWait or when ctx ends (the
// pod polls again), and an error wrapping errdefs.ErrNotFound for a pod
// this server does not keep warm, a wrong token, or one destroyed: that
// pod will get no task.
func (r *Runtime) WarmStart(ctx context.Context, id, token string) ([]byte, error) {
	r.warmMu.Lock()
	w := r.waiters[id]
	r.warmMu.Unlock()
	sum := sha256.Sum256([]byte(token))
	if w == nil || subtle.ConstantTimeCompare(sum[:], w.token[:]) != 1 {
		return nil, fmt.Errorf("no warm pod %q waits for a task here: %w", id, errdefs.ErrNotFound)
	}
	w.once.Do(func() { close(w.polled) })
	t := time.NewTimer(warmPollWait)
	defer t.Stop()
	select {
	case st := <-w.start:
		// Handed out: the pod's token answers nothing any more.
		r.warmMu.Lock()
		if r.waiters[id] == w {
			delete(r.waiters, id)
		}
		r.warmMu.Unlock()
		return st, nil
	case <-w.gone:
		return nil, fmt.Errorf("warm pod %s was destroyed: %w", id, errdefs.ErrNotFound)
	case <-t.C:
		return nil, nil
	case <-ctx.Done():
		return nil, nil
	}
}

// claimWarm takes a warm pod for spec out of its pool, or returns nil:
// for a spec no pool's shape fits or of another image than the pools',
// or when the pool has none ready (a miss, which has the pool fill).
func (r *Runtime) claimWarm(spec sandbox.Spec) *warmPod {
	if spec.Image != "" && spec.Image != r.opts.DefaultImage {
		return nil
	}
	pl, b, ok := r.warm.Take(spec)
	if !ok {
		return nil
	}
	b.pool = pl
	return b
}

// adopt hands spec's task to the warm pod b (see the comment at the top).
// On error b is destroyed; the task's directories are where they were,
// their entries in them, and the task can start cold.
func (r *Runtime) adopt(ctx context.Context, spec sandbox.Spec, b *warmPod) (_ *sandbox.Handle, err error) {
	defer b.pool.Wake()
	began := time.Now()
	resolved := spec.Resolve(r.opts.DataRoot)
	root := filepath.Join(r.warmDir(), b.id)
	fail := func(what string, err error) (*sandbox.Handle, error) {
		b.pool.Destroy(context.WithoutCancel(ctx), b)
		return nil, fmt.Errorf("hand warm pod %s to sandbox %s: %s: %w", b.id, spec.ID, what, err)
	}
	// A pod evicted or failed while it waited would take the task and
	// end without running it.
	if _, pod := r.observed(b.id); pod == nil || pod.DeletionTimestamp != nil {
		return fail("its pod", errors.New("is gone"))
	} else if es, ended := podExit(pod); ended {
		return fail("its pod", fmt.Errorf("has ended: %s", es.Message))
	}
	var start bytes.Buffer
	if err := warmstart.Send(&start, warmstart.Start{Argv: spec.Command, Env: sandbox.DefaultEnv(spec.Env), Dir: spec.Dir}); err != nil {
		return fail("its start", err)
	}
	if err := warmpool.HandOver(root, b.slots, resolved); err != nil {
		return fail("its directories", err)
	}
	trees, err := hostuser.Give(hostuser.WritableDirs(resolved.Mounts), r.opts.User)
	if err != nil {
		hostuser.Reclaim(trees)
		return fail("give its directories to the pod", err)
	}
	owned, _ := json.Marshal(trees)
	job, err := r.relabel(ctx, spec, b, string(owned))
	if err != nil {
		hostuser.Reclaim(trees)
		return fail("relabel its Job and pod", err)
	}
	os.RemoveAll(root)
	b.w.start <- start.Bytes()
	r.log.Info("sandbox started", logkey.SandboxID, spec.ID, "job", r.opts.Namespace+"/"+job.Name, "warm_id", b.id, "claim", time.Since(began))
	return handle(spec.ID, job), nil
}

// relabel makes warm pod b's Job spec's sandbox: its labels, its owned
// directories, and the deadline of its wall-clock limit from now. The pod
// keeps the labels it was made with (the runtime finds a Job's pods by
// the Job's name): one call to the API server per claim, not two.
func (r *Runtime) relabel(ctx context.Context, spec sandbox.Spec, b *warmPod, owned string) (*batchv1.Job, error) {
	l := map[string]any{labelWarm: nil}
	for k, v := range r.labelsFor(spec) {
		l[k] = v
	}
	jobPatch := map[string]any{"metadata": map[string]any{"labels": l, "annotations": map[string]string{annotationOwned: owned}}}
	if d := spec.Limits.WallClock; d > 0 {
		// The Job controller counts it from the Job's start, which is no
		// earlier than its creation: the task gets its whole limit.
		up := time.Since(b.created) + d
		jobPatch["spec"] = map[string]any{"activeDeadlineSeconds": int64((up + time.Second - 1) / time.Second)}
	}
	body, _ := json.Marshal(jobPatch)
	var job batchv1.Job
	if err := r.api.patch(ctx, "jobs", b.id, body, &job); err != nil {
		return nil, classify("relabel", err)
	}
	return &job, nil
}

// destroyLeftoverWarm destroys the warm pods a server gone left (their
// tag's lock free), after putting back a half-claimed task's entries, and
// their slots. A claimed one is a task's sandbox, and stays. A warm Job
// is found by its slots, which come before it and go after it; one
// without them (its slots removed by hand) ends by itself: its worker,
// refused by this server, exits, and the Job's TTL removes it.
func (r *Runtime) destroyLeftoverWarm(ctx context.Context, own string) {
	ids, done := warmpool.Leftovers(r.warmDir(), own, r.warmDir())
	defer done()
	for _, id := range ids {
		job := &batchv1.Job{}
		if err := r.api.get(ctx, "jobs", id, job); err == nil && job.Labels[labelWarm] == "true" {
			if err := r.Destroy(ctx, id); err != nil {
				r.log.Warn("cannot destroy a warm pod left by an earlier server", logkey.SandboxID, id, logkey.Error, err)
				continue
			}
		}
		root := filepath.Join(r.warmDir(), id)
		if task, err := warmpool.RestoreLeftover(root); err != nil {
			r.log.Warn("cannot put a task's entries back from a warm pod's slot", "task_id", task, "slot", root, logkey.Error, err)
			continue
		}
		os.RemoveAll(root)
	}
}
