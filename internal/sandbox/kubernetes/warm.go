package kubernetes

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

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
// sandbox (LabelSandbox, the task's labels; labelWarm goes; it gets
// finalizerReclaim, as a cold Job that was given directories has), which
// is how a restarted server finds it and its pod (by the Job's name: the
// pod keeps the warm pod's labels), and the Job's activeDeadlineSeconds,
// which counts from the Job's start, is patched to the time the pod has
// been up plus the task's wall-clock limit, so that the Job controller
// ends the task as it ends a cold one. That patch is an etcd write, the
// longest step of a claim: the waiting poll gets the task's argv,
// environment (its key, its egress credentials) and working directory
// first, and the Job is patched meanwhile. Until the patch has landed,
// the binding this server keeps in memory (bound) is how Wait, Status,
// Stop and Destroy find the Job; a server that dies before finds the
// binding's record beside the slots (bindFile, sentFile: written before
// the start leaves) and patches the Job itself (settleClaims) before it
// reconciles its tasks. From there the pod is the task's: its end is the
// task's, Destroy deletes its Job and the record, and its TTL applies as
// to a cold Job. A warm pod's token answers its one start only: the pod
// never gets a second task. The answer, of a said length, may be cut
// short all the same (the server dies as it goes out, the connection
// breaks): the worker acts on no part of it and asks again, and this
// server or the next answers the same start from the record (resent).
//
// NetworkPolicies select worker pods by labelApp, which warm pods have
// from their creation; their security context is jobFor's, the same as a
// cold Job's.
//
// A server that restarts does not reattach warm pods: the new server does
// not know the tokens of unclaimed ones, so their polls are refused and
// their workers exit (workerproto.ExitNoTask); the probe, and KeepWarm
// again, destroy the unclaimed warm Jobs and slots a server gone left
// (destroyLeftoverWarm), and KeepWarm fills the pools anew. Of a claim a server gone
// left half done, the next one, at its first Capabilities and so before
// it reconciles, keeps what may hold the task and undoes the rest
// (settleClaims): a pod whose start may have left is the task's (its Job
// patched from the record, the record kept for its worker to ask again),
// and ends with the task's own end, or, if its worker never had the start
// (it found no server for a minute and exited ExitNoTask), as not
// started (ExitStatus.NotStarted), which the scheduler starts again or
// fails saying so; a pod whose start never left
// is destroyed, the task's entries put back and its directories taken
// back, and the task, which then has no sandbox, starts again.

// labelWarm marks a warm pod's Job and pod until a task claims it.
const labelWarm = "corral.dev/warm"

// warmPollWait is how long one poll of a warm pod waits for its task
// before the server answers "not yet" and the pod polls again.
const warmPollWait = 25 * time.Second

// warmReadyWait bounds how long a warm pod may take to start and poll.
const warmReadyWait = 3 * time.Minute

// The records of a claim beside a warm pod's slots, after
// warmpool.ClaimFile: bindFile once the task's directories are given to
// the pod (bindRecord), sentFile just before the start may leave for the
// pod.
const (
	bindFile = "bind"
	sentFile = "sent"
)

// bindRecord is what a claim records before it sends the start: the patch
// that makes the warm pod's Job the task's, the directories given, and
// the start with the hash of the pod's token, which any later poll of the
// pod is answered from (its answer may have been cut short, by this
// server's death or the connection's). The start holds the task's
// secrets (its environment): the record is the server's alone (0600, in
// the state dir, which no pod mounts) and goes with the task's sandbox.
type bindRecord struct {
	Patch json.RawMessage `json:"patch"`
	Trees []hostuser.Tree `json:"trees"`
	Token string          `json:"token"` // hex, the hash of the pod's token
	Start json.RawMessage `json:"start"` // the task's warmstart.Start
}

// binding is a warm pod claimed by a task on this server: its Job, by
// name, is the task's sandbox whether or not its patch has landed.
type binding struct {
	job   string
	uid   types.UID
	spec  sandbox.Spec
	r     *Runtime
	trees []hostuser.Tree // given to the pod's identity
	root  string          // the claim's record, beside the slots
}

// handle is the sandbox's Handle, as the patched Job gives it.
func (bd *binding) handle() *sandbox.Handle {
	return handle(bd.spec.ID, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: bd.job, UID: bd.uid, Labels: bd.r.labelsFor(bd.spec)}})
}

// boundTo is the binding of sandbox id, nil if it has none here.
func (r *Runtime) boundTo(id string) *binding {
	r.warmMu.Lock()
	defer r.warmMu.Unlock()
	return r.bound[id]
}

// crash calls Options.Crash at point, if set.
func (r *Runtime) crash(point string) {
	if r.opts.Crash != nil {
		r.opts.Crash(point)
	}
}

// noTask is es, the end of job's pod, marked as never started when job is
// a warm pod's whose worker had no task (workerproto.ExitNoTask): a claim
// whose server died before the poll's answer. The code is the worker's;
// a task's command that exits with it after it ran leaves its status.json,
// whose report comes first.
func noTask(job *batchv1.Job, es sandbox.ExitStatus) sandbox.ExitStatus {
	if strings.HasPrefix(job.Name, warmpool.Prefix) && es.Code == workerproto.ExitNoTask && !es.OOMKilled {
		es.NotStarted = true
		es.Message = "its warm pod's worker never had its task's start: the server died between the claim and the poll's answer, and the worker found no server to ask again"
	}
	return es
}

// warmPod is a warm pod in a pool.
type warmPod struct {
	id      string
	uid     types.UID                // its Job's
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
	r.warmTag, r.warmDone = tag, ctx.Done()
	r.warmMu.Unlock()
	// The pods of a server gone end in the background, their slots
	// going after them (clearLeftoverWarm), while the pools fill.
	cctx, cancel := context.WithCancel(ctx)
	cleared := make(chan struct{})
	go func() {
		defer close(cleared)
		r.clearLeftoverWarm(cctx, tag)
	}()
	defer func() {
		cancel()
		<-cleared
	}()
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
	tag, done := r.warmTag, r.warmDone
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
	job, err := r.create(ctx, spec, nil)
	if err == nil {
		b.created, b.uid = job.CreationTimestamp.Time, job.UID
		err = r.awaitPoll(ctx, done, b)
	}
	if err != nil {
		o.DestroyWarm(context.WithoutCancel(ctx), b)
		return nil, err
	}
	return b, nil
}

// awaitPoll waits for warm pod b's first poll, or its pod's end, or
// until done closes. The pools start a warm sandbox to its end when they
// stop (warmpool's startLimit), but this one's end is the pod's poll,
// which the stopping server will not answer: the wait would last the
// limit, 30 s of every stop while a pod starts.
func (r *Runtime) awaitPoll(ctx context.Context, done <-chan struct{}, b *warmPod) error {
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
		case <-done:
			return fmt.Errorf("warm pod %s: the server is stopping", b.id)
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
	// A claim that failed took back what it gave.
	job := &batchv1.Job{}
	err := r.api.get(ctx, "jobs", b.id, job)
	if err == nil {
		err = r.destroy(ctx, b.id, job, nil)
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
	if w == nil {
		if st := r.resent(id, sum); st != nil {
			return st, nil
		}
	}
	if w == nil || subtle.ConstantTimeCompare(sum[:], w.token[:]) != 1 {
		return nil, fmt.Errorf("no warm pod %q waits for a task here: %w", id, errdefs.ErrNotFound)
	}
	w.once.Do(func() { close(w.polled) })
	t := time.NewTimer(warmPollWait)
	defer t.Stop()
	select {
	case st := <-w.start:
		// Handed out: the pod's token answers from the claim's record
		// from now on (resent).
		r.warmMu.Lock()
		if r.waiters[id] == w {
			delete(r.waiters, id)
		}
		r.warmMu.Unlock()
		r.crash(sandbox.CrashSent)
		return st, nil
	case <-w.gone:
		return nil, fmt.Errorf("warm pod %s was destroyed: %w", id, errdefs.ErrNotFound)
	case <-t.C:
		return nil, nil
	case <-ctx.Done():
		return nil, nil
	}
}

// resent is the start of warm pod id, whose token hashes to sum, from its
// claim's record (bindRecord) once the start may have left (sentFile):
// the same start, to a pod that asks again because it did not get the
// whole of it, from this server or a server gone. Nil if the pod has no
// such record (unclaimed, its start never sent, its sandbox destroyed)
// or sum is not its token's.
func (r *Runtime) resent(id string, sum [32]byte) []byte {
	if r.opts.StateDir == "" || !strings.HasPrefix(id, warmpool.Prefix) || sandbox.ValidateID(id) != nil {
		return nil
	}
	root := filepath.Join(r.warmDir(), id)
	if _, err := os.Stat(filepath.Join(root, sentFile)); err != nil {
		return nil
	}
	var rec bindRecord
	b, err := os.ReadFile(filepath.Join(root, bindFile))
	if err != nil || json.Unmarshal(b, &rec) != nil || len(rec.Start) == 0 {
		return nil
	}
	want, err := hex.DecodeString(rec.Token)
	if err != nil || subtle.ConstantTimeCompare(sum[:], want) != 1 {
		return nil
	}
	r.log.Info("a claimed warm pod asked for its start again; answered from its claim's record", "warm_id", id)
	return rec.Start
}

// WarmAnswered implements httpapi.WarmGate: warm pod id's poll was
// answered with its start.
func (r *Runtime) WarmAnswered(id string) { r.crash(sandbox.CrashAnswered) }

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
// their entries in them, and the task can start cold. Once the start may
// have left, adopt does not fail: the pod is the task's.
func (r *Runtime) adopt(ctx context.Context, spec sandbox.Spec, b *warmPod) (_ *sandbox.Handle, err error) {
	defer b.pool.Wake()
	began := time.Now()
	r.crash(sandbox.CrashClaimed)
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
	r.crash(sandbox.CrashMoved)
	moved := time.Now()
	trees, err := hostuser.Give(hostuser.WritableDirs(resolved.Mounts), r.opts.User)
	if err != nil {
		hostuser.Reclaim(trees)
		return fail("give its directories to the pod", err)
	}
	rec, _ := json.Marshal(bindRecord{Patch: r.relabelPatch(spec, b, trees), Trees: trees, Token: hex.EncodeToString(b.w.token[:]), Start: start.Bytes()})
	if err := os.WriteFile(filepath.Join(root, bindFile), rec, 0o600); err != nil {
		hostuser.Reclaim(trees)
		return fail("record its binding", err)
	}
	r.crash(sandbox.CrashHandedOver)
	given := time.Now()
	bd := &binding{job: b.id, uid: b.uid, spec: spec, r: r, trees: trees, root: root}
	r.warmMu.Lock()
	r.bound[spec.ID] = bd
	r.warmMu.Unlock()
	// From here the start may reach the pod: recorded first, so that the
	// next server, if this one dies, takes the pod for the task's.
	if err := os.WriteFile(filepath.Join(root, sentFile), nil, 0o600); err != nil {
		r.warmMu.Lock()
		delete(r.bound, spec.ID)
		r.warmMu.Unlock()
		hostuser.Reclaim(trees)
		return fail("record its start", err)
	}
	b.w.start <- start.Bytes()
	// The Job's patch, an etcd write, runs while the pod starts the task.
	go r.bind(bd, rec)
	r.log.Info("sandbox started", logkey.SandboxID, spec.ID, "job", r.opts.Namespace+"/"+b.id, "warm_id", b.id,
		"claim", time.Since(began), "hand_over", moved.Sub(began), "give", given.Sub(moved))
	return bd.handle(), nil
}

// relabelPatch is the merge patch that makes warm pod b's Job spec's
// sandbox: its labels, its owned directories (trees) and, with them,
// finalizerReclaim, and the deadline of its wall-clock limit from now. The
// pod keeps the labels it was made with (the runtime finds a Job's pods by
// the Job's name): one call to the API server per claim, not two.
func (r *Runtime) relabelPatch(spec sandbox.Spec, b *warmPod, trees []hostuser.Tree) json.RawMessage {
	owned, _ := json.Marshal(trees)
	l := map[string]any{labelWarm: nil}
	for k, v := range r.labelsFor(spec) {
		l[k] = v
	}
	meta := map[string]any{"labels": l, "annotations": map[string]string{annotationOwned: string(owned)}}
	if len(trees) > 0 {
		meta["finalizers"] = []string{finalizerReclaim} // a warm pod's Job has none
	}
	jobPatch := map[string]any{"metadata": meta}
	if d := spec.Limits.WallClock; d > 0 {
		// The Job controller counts it from the Job's start, which is no
		// earlier than its creation: the task gets its whole limit.
		up := time.Since(b.created) + d
		jobPatch["spec"] = map[string]any{"activeDeadlineSeconds": int64((up + time.Second - 1) / time.Second)}
	}
	body, _ := json.Marshal(jobPatch)
	return body
}

// bindRetry bounds the wait between two tries of a claimed Job's patch.
const bindRetry = 10 * time.Second

// bind patches the claimed warm pod's Job as its task's sandbox (the
// patch of rec, its bindRecord), trying again while the API server is out
// of reach. The claim's record stays until the sandbox is destroyed: the
// pod's start is answered from it. A patch refused for good is
// logged: the task runs, this server finds its Job by the binding, and
// the next server tries the record's patch again.
func (r *Runtime) bind(bd *binding, rec []byte) {
	var br bindRecord
	json.Unmarshal(rec, &br)
	began := time.Now()
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, bindRetry) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := r.api.patch(ctx, "jobs", bd.job, br.Patch, &batchv1.Job{})
		cancel()
		switch {
		case err == nil:
			r.crash(sandbox.CrashRelabelled)
			r.log.Debug("claimed warm pod's Job patched", logkey.SandboxID, bd.spec.ID, "job", bd.job, "patch", time.Since(began))
			return
		case apierrors.IsNotFound(err):
			return // destroyed meanwhile, which took back what it gave
		case !errdefs.Retryable(classify("patch", err)):
			r.log.Error("cannot patch a claimed warm pod's Job as its task's; the task runs, and the next server tries again", logkey.SandboxID, bd.spec.ID, "job", bd.job, logkey.Error, err)
			return
		}
		r.log.Warn("cannot patch a claimed warm pod's Job yet; trying again", logkey.SandboxID, bd.spec.ID, "job", bd.job, logkey.Error, err)
		time.Sleep(wait)
		if r.boundTo(bd.spec.ID) != bd {
			return // destroyed meanwhile
		}
	}
}

// settleClaims decides, for each claim of a warm pod that a server gone
// left half done (warmpool.ClaimFile in the pod's slot directory), what
// its task has, before the scheduler reconciles (see the comment at the
// top); the unclaimed warm pods it left are KeepWarm's to destroy. A
// claim it cannot settle (the API server out of reach) is logged and
// left for the next start.
func (r *Runtime) settleClaims(ctx context.Context) {
	if r.opts.StateDir == "" {
		return
	}
	ids, _ := warmpool.Leftovers(r.warmDir(), "", r.warmDir())
	for _, id := range ids {
		root := filepath.Join(r.warmDir(), id)
		if _, err := os.Stat(filepath.Join(root, warmpool.ClaimFile)); err != nil {
			continue
		}
		// A pod the node does not remove must not hold the server's start.
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		task, keep, err := r.settleClaim(sctx, id, root)
		cancel()
		if err != nil {
			r.log.Warn("cannot settle the claim of a warm pod by a server gone", logkey.SandboxID, id, "task_id", task, logkey.Error, err)
			continue
		}
		if !keep {
			os.RemoveAll(root)
		}
	}
}

// settleClaim settles the claim of warm pod id recorded in root, and
// returns the claim's task, and whether the record stays: that of a pod
// that is the task's sandbox, which answers the pod's start (resent)
// until Destroy removes it.
func (r *Runtime) settleClaim(ctx context.Context, id, root string) (task string, keep bool, err error) {
	var c warmpool.Claim
	if b, err := os.ReadFile(filepath.Join(root, warmpool.ClaimFile)); err == nil {
		json.Unmarshal(b, &c)
	}
	var rec bindRecord
	b, err := os.ReadFile(filepath.Join(root, bindFile))
	bound := err == nil && json.Unmarshal(b, &rec) == nil
	_, err = os.Stat(filepath.Join(root, sentFile))
	sent := bound && err == nil
	job := &batchv1.Job{}
	err = r.api.get(ctx, "jobs", id, job)
	if err != nil && !apierrors.IsNotFound(err) {
		return c.Task, false, err
	}
	gone := err != nil
	if sent {
		// The pod may have the task's start: it is the task's sandbox.
		switch {
		case gone:
			return c.Task, false, hostuser.Reclaim(rec.Trees)
		case job.Labels[labelWarm] == "true":
			if err := r.api.patch(ctx, "jobs", id, rec.Patch, job); err != nil {
				return c.Task, false, err
			}
			r.log.Info("a warm pod claimed by a server gone is its task's sandbox", "task_id", c.Task, "job", id)
		}
		return c.Task, true, nil
	}
	// Its start never left: no task ran there. The task's entries go
	// back (from slots not yet renamed), and what the pod was given.
	if !gone {
		if err := r.destroy(ctx, id, job, nil); err != nil {
			return c.Task, false, err
		}
	}
	trees := rec.Trees
	if !bound {
		// Given, maybe, and not recorded: every entry the pod's
		// identity owns in the task's directories goes back.
		for _, dir := range c.Moves {
			trees = append(trees, hostuser.Tree{Dir: dir, Owner: hostuser.Identity{UID: os.Geteuid(), GID: os.Getegid()}, To: r.opts.User})
		}
	}
	if err := hostuser.Reclaim(trees); err != nil {
		return c.Task, false, err
	}
	if _, err := warmpool.RestoreLeftover(root); err != nil {
		return c.Task, false, err
	}
	r.log.Info("a warm pod claimed by a server gone never had its task's start; destroyed", "task_id", c.Task, "job", id)
	return c.Task, false, nil
}

// leftoverWait bounds how long KeepWarm waits for the pods of a server
// gone to end, to remove their slots; the next start takes what is left.
const leftoverWait = 2 * time.Minute

// clearLeftoverWarm repeats destroyLeftoverWarm until no slot of a server
// gone is left, ctx ends, or leftoverWait has passed.
func (r *Runtime) clearLeftoverWarm(ctx context.Context, own string) {
	deadline := time.Now().Add(leftoverWait)
	for r.destroyLeftoverWarm(ctx, own) > 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// destroyLeftoverWarm destroys the unclaimed warm pods a server gone left
// (their tag's lock free; own is this server's tag, "" before it has
// one), and their slots: at the probe, before the scheduler reconciles
// (a server that keeps no pod warm has them go too), and again at
// KeepWarm (clearLeftoverWarm). A claimed one is settleClaims'. A warm Job
// is found by its slots, which come before it and go after its pods: a
// pod the kubelet is still starting makes its slot again (it creates a
// subPath that is missing), so a slot stays while a pod of its Job is
// there; it returns how many stay. One without slots (removed by hand)
// ends by itself: its worker, refused by this server, exits, and the
// Job's TTL removes it.
func (r *Runtime) destroyLeftoverWarm(ctx context.Context, own string) (waiting int) {
	if r.opts.StateDir == "" {
		return 0
	}
	ids, done := warmpool.Leftovers(r.warmDir(), own, r.warmDir())
	defer done()
	for _, id := range ids {
		root := filepath.Join(r.warmDir(), id)
		if _, err := os.Stat(filepath.Join(root, warmpool.ClaimFile)); err == nil {
			// A claimed pod, the task's (Destroy removes its record),
			// or a claim settleClaims could not settle (the next start
			// tries again).
			continue
		}
		// Unclaimed, it was given nothing: no need to wait for its
		// pod's end, which under gVisor and load takes seconds the
		// server's start would wait for. The garbage collector takes
		// the pod and its Secret after the Job; its slots go after the
		// pod.
		job := &batchv1.Job{}
		if err := r.api.get(ctx, "jobs", id, job); err == nil && job.Labels[labelWarm] == "true" {
			background := metav1.DeletePropagationBackground
			err := r.api.delete(ctx, "jobs", id, metav1.DeleteOptions{PropagationPolicy: &background, Preconditions: &metav1.Preconditions{UID: &job.UID}})
			if err != nil && !apierrors.IsNotFound(err) {
				r.log.Warn("cannot destroy a warm pod left by an earlier server", logkey.SandboxID, id, logkey.Error, err)
				continue
			}
		}
		pods, err := r.api.listPods(ctx, labels.SelectorFromSet(labels.Set{batchv1.JobNameLabel: id}).String())
		if err != nil || len(pods.Items) > 0 {
			waiting++
			continue
		}
		os.RemoveAll(root)
	}
	return waiting
}
