// Package kubernetes runs sandboxes as Kubernetes Jobs, through client-go:
// one batch/v1 Job per sandbox, for when one machine is not enough (seed
// 000).
//
// Shape (seed 000's manifest): backoffLimit 0, activeDeadlineSeconds from
// the wall-clock limit, ttlSecondsAfterFinished, restartPolicy Never, the
// RuntimeClass (gvisor by default), a non-root pod (uid and gid 1000,
// fsGroup) whose container drops every capability, cannot gain privileges,
// runs under Corral's seccomp profile (Options.SeccompProfile, installed on
// the nodes) or the runtime's default, with a read-only root
// file system and a size-limited /tmp, requests and limits for memory and
// CPU, and no service account token. The Spec's mounts are subPaths of the
// one volume that holds the data root (a ReadWriteMany claim), so a mount
// names the same path on every node. The environment is never a literal in
// the Job: it goes into a Secret of the sandbox's own, owned by the Job,
// beside the operator's Secret of API keys (both by reference).
//
// State: the API server is the source of truth. Jobs and pods carry
// Corral's labels (runtime, instance, sandbox id); informers watch them,
// filtered to this server's instance, so Wait, Status and List answer from
// a cache kept current by watches, never by polling, and a restarted
// server finds its Jobs by label. A Job's deadline ends Wait as soon as
// the Job controller marks it (the FailureTarget condition), not after the
// pod's grace period.
//
// Identity: read-write mounts are handed to uid/gid 1000 on the volume for
// the sandbox's life and taken back by Destroy (package sandbox/hostuser),
// which needs the server to see the volume at its data root (the server's
// pod mounts the same claim). Mounts of host directories outside the data
// root (HostDir) are refused: they do not exist on other nodes.
//
// The pod's pid 1 is its pause process (the pod shares one process
// namespace), which runs as PauseUser, not as the worker: the worker and
// its agent cannot open its memory, ptrace or signal it.
//
// Under runc, a pod reads three /proc files that every other runtime
// masks: /proc/kallsyms (symbol names; the kernel zeroes every address
// for a process without CAP_SYSLOG), /proc/config.gz (the node kernel's
// build configuration) and /proc/key-users (how many keys each uid of the
// node holds). Containerd's default masked paths leave them out, a pod
// spec cannot add masked paths, and runc refuses mounts over /proc files.
// They tell an attacker about the node's kernel; the gvisor RuntimeClass,
// whose /proc is its own, shows none of them, and is the one to use for
// untrusted work.
//
// A session's sandbox is a Job too (one pod, no deadline: the session
// manager ends it), whose main process is the session's exec agent: it
// dials the server's URL, as a task's worker posts its report there, and
// runs the session's commands; Exec is not how they run.
//
// Warm pods (warm.go, sandbox.Warmer): worker pods made ahead of need
// that long-poll the server for their task, which a claim binds to them
// (its directory by rename into the pod's own subPath, its Job's labels
// and deadline by one patch, its argv and environment in the poll's
// answer).
//
// Not supported: Exec (a command in a running pod would need the API
// server's exec), Checkpointer (a suspended session keeps its files
// alone), a pids limit per pod (the node's podPidsLimit applies), network
// isolation without a NetworkPolicy and a CNI that enforces it.
package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/sandbox/warmpool"
)

var _ sandbox.Runtime = (*Runtime)(nil)

// Name is the runtime's name in Handles and configuration.
const Name = "kubernetes"

// stateVersion is the schema version of state, stored in Handle.Version.
const stateVersion = 1

// Labels and annotations Corral puts on its Jobs and pods besides the
// Spec's labels and sandbox.LabelRuntime, LabelInstance and LabelSandbox;
// app and task-id are seed 000's.
const (
	labelApp  = "app"
	labelTask = "task-id"
	// annotationOwned holds the read-write directories given to the pod's
	// identity and their owners before (JSON), for Destroy to give back.
	annotationOwned = "corral.dev/owned"
	// finalizerReclaim keeps a Job that was given directories in the
	// API until Destroy has taken them back: a Destroy cut short after
	// the Job's deletion, or a deletion by anyone else (its TTL, an
	// operator), leaves the Job for the next Destroy to find and finish
	// (List shows it).
	finalizerReclaim = "corral.dev/reclaim"
	// AppWorker is the app label of every worker pod (the NetworkPolicy
	// selects it).
	AppWorker = "corral-worker"
	// container is the worker container's name.
	container = "worker"
	// dataVolume is the volume holding the data root.
	dataVolume = "data"
)

// PauseUser is the identity of a pod's pause process, its pid 1: the
// pause image's own user (registry.k8s.io/pause runs as 65535), set in the
// pod spec so that it holds whatever the image says. It must not be the
// worker's (Options.User): see jobFor.
var PauseUser = hostuser.Identity{UID: 65535, GID: 65535}

// Options configure a Runtime. Zero fields take the documented defaults.
type Options struct {
	// Config reaches the API server (in the cluster: rest.InClusterConfig;
	// else a kubeconfig). Required.
	Config *rest.Config
	// Namespace the Jobs run in; default "default".
	Namespace string
	// DataRoot is the data root's path as this server sees it: the mount
	// point of Claim. Required, absolute.
	DataRoot string
	// Claim is the PersistentVolumeClaim holding the data root; mounts are
	// its subPaths. Required.
	Claim string
	// RuntimeClass is the pods' runtimeClassName; "" runs them under the
	// node's default runtime.
	RuntimeClass string
	// ServiceAccount the pods run as; "" is the namespace's default. Its
	// token is never mounted.
	ServiceAccount string
	// DefaultImage is the image of a Spec without one.
	DefaultImage string
	// PullPolicy is the containers' imagePullPolicy (IfNotPresent, Always,
	// Never); default IfNotPresent.
	PullPolicy string
	// User is the pods' uid and gid (and fsGroup); default 1000:1000.
	// Never root.
	User hostuser.Identity
	// MemoryRequest and CPURequestMillis are the containers' requests,
	// each at most the Spec's limit; zero requests nothing.
	MemoryRequest    int64
	CPURequestMillis int64
	// TmpSize bounds the pod's /tmp (an emptyDir); default 256 MiB.
	TmpSize int64
	// JobTTL is ttlSecondsAfterFinished: how long a finished Job the
	// server did not destroy (it was down) stays; 0 removes it at once.
	JobTTL time.Duration
	// SeccompProfile is a Localhost seccomp profile every pod runs under,
	// relative to the kubelet's seccomp directory on each node (corral k8s
	// seccomp prints Corral's: the container runtime's default without the
	// calls Corral refuses everywhere, ptrace and io_uring among them);
	// "" is the runtime's default (RuntimeDefault), which allows those.
	SeccompProfile string
	// SecretName is the operator's Secret of API keys, passed to every
	// worker as environment variables by reference (optional: a missing
	// Secret passes none); "" for none.
	SecretName string
	// Instance tells this server's Jobs from those of other servers in the
	// namespace; default a hash of the namespace and DataRoot.
	Instance string
	// SyncTimeout bounds the first listing of Jobs and pods; default 15s.
	SyncTimeout time.Duration
	// ServerURL is where pods reach the server (kubernetes.server_url):
	// warm pods poll it for their task. Required by KeepWarm.
	ServerURL string
	// StateDir is the runtime's directory in the data root, on the claim:
	// warm pods' slots are there. Required by KeepWarm.
	StateDir string
	// Crash, when set, is called at each crash point a claim of a warm
	// pod passes (sandbox.CrashClaimed, CrashMoved, CrashHandedOver,
	// CrashSent, CrashAnswered, CrashRelabelled) and a Destroy passes
	// (CrashJobDeleted, CrashPodGone, CrashReclaimed); the fault tests
	// have the server die there. Nil in production.
	Crash func(point string)
}

func (o *Options) setDefaults() {
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.PullPolicy == "" {
		o.PullPolicy = string(corev1.PullIfNotPresent)
	}
	if o.User == (hostuser.Identity{}) {
		o.User = hostuser.Identity{UID: 1000, GID: 1000}
	}
	if o.TmpSize == 0 {
		o.TmpSize = 256 << 20
	}
	if o.Instance == "" {
		sum := sha256.Sum256([]byte(o.Namespace + "\x00" + o.DataRoot))
		o.Instance = hex.EncodeToString(sum[:6])
	}
	if o.SyncTimeout == 0 {
		o.SyncTimeout = 15 * time.Second
	}
}

// Runtime is the Kubernetes runtime. Create it with New.
type Runtime struct {
	opts Options
	api  *client
	log  *slog.Logger

	startMu sync.Mutex
	started bool
	stop    chan struct{}
	jobs    batchlisters.JobNamespaceLister
	pods    corelisters.PodNamespaceLister
	// podsByAddr indexes the watched pods by address (PodAddr), once the
	// informers run; read without startMu, which ready holds while they
	// sync.
	podsByAddr atomic.Pointer[cache.Indexer]

	mu      sync.Mutex
	changed chan struct{}                 // closed and replaced on every watched change
	exits   map[string]sandbox.ExitStatus // the last exit seen of each Job's pod, by the Job's name
	made    map[string]bool               // the sandboxes whose Job this process tried to make, until destroyed

	caps sandbox.Probed

	warm    *warmpool.Pools[*warmPod]
	warmMu  sync.Mutex
	warmTag string // this runtime's, in its warm pods' names (warmpool.Own)
	// warmDone is closed when KeepWarm's context ends: the server is
	// stopping, and no warm pod's first poll will be answered.
	warmDone <-chan struct{}
	waiters  map[string]*waiter  // the warm pods not handed a task yet, by id
	bound    map[string]*binding // the claimed warm pods, by their sandbox's id
}

// state is Handle.State, version 1.
type state struct {
	Job string `json:"job"`
	UID string `json:"uid,omitempty"`
}

// New returns a Runtime for the cluster opts.Config reaches. It does not
// contact the API server: Capabilities does, and says when it cannot.
func New(opts Options, log *slog.Logger) (*Runtime, error) {
	opts.setDefaults()
	bad := func(format string, args ...any) (*Runtime, error) {
		return nil, fmt.Errorf("kubernetes runtime: "+format+": %w", append(args, errdefs.ErrInvalidArgument)...)
	}
	switch {
	case opts.Config == nil:
		return bad("no cluster configuration (a kubeconfig, or the pod's service account)")
	case !filepath.IsAbs(opts.DataRoot):
		return bad("data root %q must be an absolute path", opts.DataRoot)
	case opts.Claim == "":
		return bad("no workspace claim (ai_worker_config.workspace_pvc)")
	case opts.SeccompProfile != "" && (!filepath.IsLocal(opts.SeccompProfile) || filepath.Clean(opts.SeccompProfile) != opts.SeccompProfile):
		return bad("seccomp profile %q must be a clean path relative to the kubelet's seccomp directory", opts.SeccompProfile)
	case opts.User.UID <= 0 || opts.User.GID <= 0:
		return bad("the pods' identity %s must not be root", opts.User)
	case opts.User.UID == PauseUser.UID || opts.User.GID == PauseUser.GID:
		return bad("the pods' identity %s must not be the pause process's, %s", opts.User, PauseUser)
	}
	if errs := validation.IsDNS1123Label(opts.Namespace); len(errs) > 0 {
		return bad("namespace %q: %s", opts.Namespace, strings.Join(errs, "; "))
	}
	api, err := newClient(opts.Config, opts.Namespace)
	if err != nil {
		return bad("%v", err)
	}
	r := &Runtime{opts: opts, api: api, log: log.With(logkey.Runtime, Name), changed: make(chan struct{}), exits: map[string]sandbox.ExitStatus{}, made: map[string]bool{}, waiters: map[string]*waiter{}, bound: map[string]*binding{}}
	r.warm = warmpool.New(Name, warmOps{r}, r.log)
	return r, nil
}

// Close stops the watches.
func (r *Runtime) Close() error {
	r.startMu.Lock()
	defer r.startMu.Unlock()
	if r.started {
		close(r.stop)
		r.started = false
	}
	return nil
}

// ready starts the informers once and waits for their first listing.
func (r *Runtime) ready(ctx context.Context) error {
	r.startMu.Lock()
	defer r.startMu.Unlock()
	if r.started {
		return nil
	}
	sel := labels.SelectorFromSet(labels.Set{sandbox.LabelRuntime: Name, sandbox.LabelInstance: r.opts.Instance}).String()
	jobs, pods := r.api.informer("jobs", sel, &batchv1.Job{}), r.api.informer("pods", sel, &corev1.Pod{})
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.observe(obj) },
		UpdateFunc: func(_, obj any) { r.observe(obj) },
		DeleteFunc: func(obj any) { r.observe(obj) },
	}
	if _, err := jobs.AddEventHandler(h); err != nil {
		return err
	}
	if _, err := pods.AddEventHandler(h); err != nil {
		return err
	}
	if err := pods.AddIndexers(cache.Indexers{podAddrIndex: podAddrs}); err != nil {
		return err
	}
	stop := make(chan struct{})
	go jobs.Run(stop)
	go pods.Run(stop)
	sctx, cancel := context.WithTimeout(ctx, r.opts.SyncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), jobs.HasSynced, pods.HasSynced) {
		close(stop)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("list Jobs and pods in namespace %s: %w", r.opts.Namespace, err)
		}
		return fmt.Errorf("list Jobs and pods in namespace %s of %s: not done within %s (is the API server reachable, and may this server list and watch jobs and pods there?): %w",
			r.opts.Namespace, r.opts.Config.Host, r.opts.SyncTimeout, errdefs.ErrUnavailable)
	}
	r.stop, r.started = stop, true
	r.jobs = batchlisters.NewJobLister(jobs.GetIndexer()).Jobs(r.opts.Namespace)
	r.pods = corelisters.NewPodLister(pods.GetIndexer()).Pods(r.opts.Namespace)
	idx := pods.GetIndexer()
	r.podsByAddr.Store(&idx)
	return nil
}

// podAddrIndex indexes pods by their addresses (podAddrs).
const podAddrIndex = "addr"

func podAddrs(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	var addrs []string
	for _, ip := range pod.Status.PodIPs {
		addrs = append(addrs, ip.IP)
	}
	if len(addrs) == 0 && pod.Status.PodIP != "" {
		addrs = append(addrs, pod.Status.PodIP)
	}
	return addrs, nil
}

// PodAddr reports whether ip is the address of one of this server's
// worker pods, as its watch has seen them: what runs there is a task's,
// and its connections to the server are bounded (connlimit.Pods).
func (r *Runtime) PodAddr(ip string) bool {
	idx := r.podsByAddr.Load()
	if idx == nil {
		return false // no pod of this server's yet
	}
	pods, err := (*idx).ByIndex(podAddrIndex, ip)
	return err == nil && len(pods) > 0
}

// observe records what a watch saw: a pod's exit, which must outlive the
// pod, and wakes every waiter.
func (r *Runtime) observe(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if pod, ok := obj.(*corev1.Pod); ok {
		if es, ok := podExit(pod); ok {
			r.exits[pod.Labels[batchv1.JobNameLabel]] = es
		}
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

// changes is closed at the next watched change.
func (r *Runtime) changes() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

// Capabilities asks the API server once for its version and lists this
// server's Jobs and pods.
func (r *Runtime) Capabilities(ctx context.Context) (sandbox.Capabilities, error) {
	return r.caps.Get(ctx, r.probe), nil
}

func (r *Runtime) probe(ctx context.Context) sandbox.Capabilities {
	c := sandbox.Capabilities{Limits: true, NoPidsLimit: true}
	v, err := r.api.version(ctx)
	if err != nil {
		c.Reason = fmt.Sprintf("the Kubernetes API server at %s cannot be reached: %v", r.opts.Config.Host, err)
		return c
	}
	if err := r.ready(ctx); err != nil {
		c.Reason = err.Error()
		return c
	}
	if why := r.cluster(ctx); why != "" {
		c.Reason = why
		return c
	}
	// Before the scheduler reconciles: a claim a server gone left half
	// done decides whether its task has a sandbox, and the warm pods it
	// left unclaimed go, whether or not this server keeps pods warm.
	r.settleClaims(ctx)
	r.destroyLeftoverWarm(ctx, "")
	c.Version = fmt.Sprintf("Kubernetes %s, namespace %s, claim %s", v, r.opts.Namespace, r.opts.Claim)
	if r.opts.RuntimeClass != "" {
		c.Version += ", RuntimeClass " + r.opts.RuntimeClass
	}
	c.Warnings = append(c.Warnings,
		"network isolation of worker pods is the NetworkPolicy's, which only a CNI that enforces NetworkPolicies applies",
		"no pids limit per pod: the node's podPidsLimit applies")
	c.Available = true
	return c
}

// cluster says what in the cluster keeps Jobs from running ("" if
// nothing): this server may not create or patch Jobs, delete pods or
// create Secrets there, or the claim, the service account or the
// RuntimeClass is missing.
func (r *Runtime) cluster(ctx context.Context) string {
	ns := r.opts.Namespace
	// Patch: a Destroy lets a Job go (finalizerReclaim), a claim relabels
	// a warm pod's.
	for _, want := range [][3]string{{"create", "batch", "jobs"}, {"patch", "batch", "jobs"}, {"delete", "", "pods"}, {"create", "", "secrets"}} {
		ok, err := r.api.allowed(ctx, want[0], want[1], want[2])
		if err != nil {
			return fmt.Sprintf("ask the API server what this server may do: %v", err)
		}
		if !ok {
			return fmt.Sprintf("this server may not %s %s in namespace %s (RBAC: corral k8s render has the Role it needs)", want[0], want[2], ns)
		}
	}
	// What this server may not read (the rendered Role grants no more
	// than the runtime's calls) is not checked.
	switch phase, err := r.api.claimPhase(ctx, r.opts.Claim); {
	case apierrors.IsForbidden(err):
	case err != nil:
		return fmt.Sprintf("read the claim %s: %v", r.opts.Claim, err)
	case phase == "":
		return fmt.Sprintf("the claim %s (ai_worker_config.workspace_pvc) is not in namespace %s", r.opts.Claim, ns)
	case phase != string(corev1.ClaimBound):
		return fmt.Sprintf("the claim %s is %s, not Bound", r.opts.Claim, phase)
	}
	if sa := r.opts.ServiceAccount; sa != "" {
		if ok, err := r.api.exists(ctx, "/api/v1/namespaces/"+ns+"/serviceaccounts/"+sa); err == nil && !ok {
			return fmt.Sprintf("the service account %s (ai_worker_config.service_account) is not in namespace %s", sa, ns)
		}
	}
	if rc := r.opts.RuntimeClass; rc != "" {
		if ok, err := r.api.exists(ctx, "/apis/node.k8s.io/v1/runtimeclasses/"+rc); err == nil && !ok {
			return fmt.Sprintf("the cluster has no RuntimeClass %s (ai_worker_config.runtime_class; empty runs pods under the node's default runtime)", rc)
		}
	}
	return ""
}

// handle is sandbox id's Handle for job.
func handle(id string, job *batchv1.Job) *sandbox.Handle {
	b, _ := json.Marshal(state{Job: job.Name, UID: string(job.UID)})
	own := maps.Clone(job.Labels)
	for _, k := range []string{labelApp, labelTask, sandbox.LabelRuntime, sandbox.LabelInstance, sandbox.LabelSandbox} {
		delete(own, k)
	}
	return &sandbox.Handle{ID: id, Runtime: Name, Labels: own, Version: stateVersion, State: b}
}

// job returns sandbox id's Job from the API server (not the cache: a Job
// just made may not be there yet). It wraps errdefs.ErrNotFound if there
// is none of this server's.
func (r *Runtime) job(ctx context.Context, id string) (*batchv1.Job, error) {
	if sandbox.ValidateID(id) != nil {
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	if bd := r.boundTo(id); bd != nil {
		// A warm pod this server bound to the task, whose Job's patch
		// may not have landed: by its name.
		job, err := r.jobNamed(ctx, bd.job)
		if err != nil {
			return nil, classify("sandbox "+id, err)
		}
		return job, nil
	}
	job, err := r.jobNamed(ctx, id)
	if apierrors.IsNotFound(err) {
		// A claimed warm pod's Job has a name of its own, and the
		// sandbox's id as its label.
		return r.claimedJob(ctx, id)
	}
	if err != nil {
		return nil, classify("sandbox "+id, err)
	}
	if job.Labels[sandbox.LabelInstance] != r.opts.Instance || job.Labels[sandbox.LabelRuntime] != Name || job.Labels[sandbox.LabelSandbox] != id {
		return nil, fmt.Errorf("sandbox %s: Job %s/%s is not this server's: %w", id, r.opts.Namespace, id, errdefs.ErrNotFound)
	}
	return job, nil
}

// jobNamed is the Job named id, an API error if there is none.
func (r *Runtime) jobNamed(ctx context.Context, id string) (*batchv1.Job, error) {
	job := &batchv1.Job{}
	if err := r.api.get(ctx, "jobs", id, job); err != nil {
		return nil, err
	}
	return job, nil
}

// claimedJob returns the Job of the warm pod that sandbox id claimed.
func (r *Runtime) claimedJob(ctx context.Context, id string) (*batchv1.Job, error) {
	sel := labels.SelectorFromSet(labels.Set{sandbox.LabelRuntime: Name, sandbox.LabelInstance: r.opts.Instance, sandbox.LabelSandbox: id}).String()
	jobs, err := r.api.listJobs(ctx, sel)
	if err != nil {
		return nil, classify("sandbox "+id, err)
	}
	for i := range jobs.Items {
		if j := &jobs.Items[i]; strings.HasPrefix(j.Name, warmpool.Prefix) {
			return j, nil
		}
	}
	return nil, fmt.Errorf("sandbox %s: no Job %s/%s: %w", id, r.opts.Namespace, id, errdefs.ErrNotFound)
}

// classify turns an API error into Corral's classes.
func classify(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s: %v: %w", op, err, errdefs.ErrNotFound)
	case apierrors.IsAlreadyExists(err), apierrors.IsConflict(err):
		return fmt.Errorf("%s: %v: %w", op, err, errdefs.ErrConflict)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s: %v: %w", op, err, errdefs.ErrPermissionDenied)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return fmt.Errorf("%s: %v: %w", op, err, errdefs.ErrInvalidArgument)
	case apierrors.IsServerTimeout(err), apierrors.IsTimeout(err), apierrors.IsServiceUnavailable(err), apierrors.IsTooManyRequests(err), apierrors.IsInternalError(err):
		return fmt.Errorf("%s: %v: %w", op, err, errdefs.ErrUnavailable)
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		// No answer: the network, a restart, or the caller's context,
		// which its error still says.
		return fmt.Errorf("%s: %w: %w", op, err, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// Create makes the sandbox's Secret and Job. It is idempotent on spec.ID:
// a Job that exists is returned.
func (r *Runtime) Create(ctx context.Context, spec sandbox.Spec) (_ *sandbox.Handle, err error) {
	if err := r.validate(spec); err != nil {
		return nil, fmt.Errorf("validate sandbox spec: %w", err)
	}
	if err := r.ready(ctx); err != nil {
		return nil, err
	}
	// The sandbox may be there already: a warm pod this process bound
	// to it, or a Job the watch has seen (its own, or a warm pod's it
	// claimed). The watch's cache, synced with the API server's listing
	// at ready, lacks only a Job this process has just made, of a Create
	// tried again (made): only then is the API server asked, and a claim
	// waits for no round trip.
	if bd := r.boundTo(spec.ID); bd != nil {
		return bd.handle(), nil
	}
	if job, _ := r.observed(spec.ID); job != nil {
		return handle(spec.ID, job), nil
	}
	r.mu.Lock()
	tried := r.made[spec.ID]
	r.mu.Unlock()
	if tried {
		switch job, err := r.jobNamed(ctx, spec.ID); {
		case err == nil:
			if job, err = r.job(ctx, spec.ID); err != nil {
				return nil, err
			}
			return handle(spec.ID, job), nil
		case !apierrors.IsNotFound(err):
			return nil, classify("sandbox "+spec.ID, err)
		}
	}
	if b := r.claimWarm(spec); b != nil {
		h, err := r.adopt(ctx, spec, b)
		if err == nil {
			return h, nil
		}
		r.log.Warn("a warm pod could not take its task, which starts cold", logkey.SandboxID, spec.ID, logkey.Error, err)
	}
	trees, err := hostuser.Give(hostuser.WritableDirs(spec.Resolve(r.opts.DataRoot).Mounts), r.opts.User)
	defer func() {
		if err != nil {
			hostuser.Reclaim(trees)
		}
	}()
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.made[spec.ID] = true
	r.mu.Unlock()
	job, err := r.create(ctx, spec, trees)
	if err != nil {
		return nil, err
	}
	r.log.Info("sandbox started", logkey.SandboxID, spec.ID, "job", r.opts.Namespace+"/"+job.Name, "image", job.Spec.Template.Spec.Containers[0].Image)
	return handle(spec.ID, job), nil
}

// create makes spec's Secret and Job, whose pod is given the directories
// trees.
func (r *Runtime) create(ctx context.Context, spec sandbox.Spec, trees []hostuser.Tree) (_ *batchv1.Job, err error) {
	secret := &corev1.Secret{}
	err = r.api.create(ctx, "secrets", r.secret(spec), secret)
	if apierrors.IsAlreadyExists(err) { // left by a Create cut short: made again from this spec
		r.api.delete(ctx, "secrets", envSecret(spec.ID), metav1.DeleteOptions{})
		err = r.api.create(ctx, "secrets", r.secret(spec), secret)
	}
	if err != nil {
		return nil, classify("create the sandbox's environment secret", err)
	}
	defer func() {
		if err != nil {
			r.api.delete(context.WithoutCancel(ctx), "secrets", secret.Name, metav1.DeleteOptions{})
		}
	}()
	job := &batchv1.Job{}
	if err = r.api.create(ctx, "jobs", r.jobFor(spec, trees), job); err != nil {
		return nil, classify("create Job "+spec.ID, err)
	}
	// The Secret goes when the Job goes (the server's Destroy, or the
	// Job's TTL after a server that died).
	secret.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID}}
	if uerr := r.api.update(ctx, "secrets", secret.Name, secret, &corev1.Secret{}); uerr != nil {
		r.log.Warn("cannot make the Job own its environment secret; Destroy removes it", logkey.SandboxID, spec.ID, logkey.Error, uerr)
	}
	return job, nil
}

// validate refuses what a Job cannot carry.
func (r *Runtime) validate(spec sandbox.Spec) error {
	errs := []error{spec.Validate()}
	if len(spec.ID) > validation.DNS1123LabelMaxLength {
		errs = append(errs, errdefs.Field("id", "must be at most 63 characters on kubernetes (a Job name and label)"))
	}
	if spec.Image == "" && r.opts.DefaultImage == "" {
		errs = append(errs, errdefs.Field("image", "is required: the kubernetes runtime has no default image (ai_worker_config.ai_coder_image)"))
	}
	for i, m := range spec.Mounts {
		if m.HostDir {
			errs = append(errs, errdefs.Field(fmt.Sprintf("mounts[%d].source", i), "is a directory of the server's host outside the data root, which pods on other nodes cannot mount: workspaces under workspaces.roots need a runtime on the server's host (local, gvisor, docker)"))
		}
	}
	for k, v := range spec.Labels {
		if len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
			errs = append(errs, errdefs.Field("labels", fmt.Sprintf("%q=%q is not a Kubernetes label", k, v)))
		}
	}
	return errors.Join(errs...)
}

// envSecret names sandbox id's environment Secret.
func envSecret(id string) string { return id + "-env" }

// labelsFor are the labels of sandbox spec's Job, pod and Secret.
func (r *Runtime) labelsFor(spec sandbox.Spec) map[string]string {
	l := maps.Clone(spec.Labels)
	if l == nil {
		l = map[string]string{}
	}
	l[labelApp] = AppWorker
	l[labelTask] = spec.ID
	l[sandbox.LabelRuntime] = Name
	l[sandbox.LabelInstance] = r.opts.Instance
	l[sandbox.LabelSandbox] = spec.ID
	return l
}

// secret holds spec's environment: the worker's keys are never a literal
// in the Job.
func (r *Runtime) secret(spec sandbox.Spec) *corev1.Secret {
	data := map[string][]byte{}
	for _, kv := range sandbox.DefaultEnv(spec.Env) {
		k, v, _ := strings.Cut(kv, "=")
		data[k] = []byte(v)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: envSecret(spec.ID), Labels: r.labelsFor(spec)},
		Type:       corev1.SecretTypeOpaque,
		Data:       data,
	}
}

// jobFor is spec as a Job: seed 000's manifest.
func (r *Runtime) jobFor(spec sandbox.Spec, trees []hostuser.Tree) *batchv1.Job {
	image := spec.Image
	if image == "" {
		image = r.opts.DefaultImage
	}
	l := r.labelsFor(spec)
	mounts := []corev1.VolumeMount{{Name: "tmp", MountPath: "/tmp"}}
	for _, m := range spec.Mounts {
		mounts = append(mounts, corev1.VolumeMount{Name: dataVolume, MountPath: m.Target, SubPath: path.Clean(m.Source), ReadOnly: m.ReadOnly})
	}
	limits, requests := corev1.ResourceList{}, corev1.ResourceList{}
	if b := spec.Limits.MemoryBytes; b > 0 {
		limits[corev1.ResourceMemory] = *resource.NewQuantity(b, resource.BinarySI)
		if q := min(r.opts.MemoryRequest, b); q > 0 {
			requests[corev1.ResourceMemory] = *resource.NewQuantity(q, resource.BinarySI)
		}
	}
	if m := spec.Limits.CPUMillis; m > 0 {
		limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(m, resource.DecimalSI)
		if q := min(r.opts.CPURequestMillis, m); q > 0 {
			requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(q, resource.DecimalSI)
		}
	}
	env := []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: envSecret(spec.ID)}}}}
	if r.opts.SecretName != "" {
		env = slices.Insert(env, 0, corev1.EnvFromSource{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: r.opts.SecretName}, Optional: new(true)}})
	}
	uid, gid := int64(r.opts.User.UID), int64(r.opts.User.GID)
	pauseUID, pauseGID := int64(PauseUser.UID), int64(PauseUser.GID)
	pod := corev1.PodSpec{
		RestartPolicy:                 corev1.RestartPolicyNever,
		ServiceAccountName:            r.opts.ServiceAccount,
		AutomountServiceAccountToken:  new(false),
		EnableServiceLinks:            new(false),
		TerminationGracePeriodSeconds: new(int64(10)),
		// The pod's pause process is pid 1, not the worker: a signal
		// the worker does not handle ends it, as on the other runtimes,
		// and orphans are reaped.
		ShareProcessNamespace: new(true),
		// The pod's identity is the pause process's (the kubelet gives
		// it the pod's runAsUser): PauseUser, not the worker's. As the
		// worker's uid, pause would be open to the worker and its agent
		// through /proc/1/mem, ptrace and signals (a pod spec cannot
		// mask /proc/1/mem); as another, the kernel refuses them all
		// without CAP_SYS_PTRACE or CAP_KILL, whatever the seccomp
		// profile. fsGroup is the worker's group, for the volumes.
		SecurityContext: &corev1.PodSecurityContext{
			RunAsUser: &pauseUID, RunAsGroup: &pauseGID, FSGroup: &gid, RunAsNonRoot: new(true),
			SeccompProfile: r.seccomp(),
		},
		Containers: []corev1.Container{{
			Name:            container,
			Image:           image,
			ImagePullPolicy: corev1.PullPolicy(r.opts.PullPolicy),
			Command:         literal(spec.Command),
			WorkingDir:      spec.Dir,
			EnvFrom:         env,
			Resources:       corev1.ResourceRequirements{Limits: limits, Requests: requests},
			VolumeMounts:    mounts,
			// The end of the output becomes the message of a failed
			// container that wrote no termination log (podExit).
			TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			SecurityContext: &corev1.SecurityContext{
				RunAsUser:                &uid,
				RunAsGroup:               &gid,
				AllowPrivilegeEscalation: new(false),
				Privileged:               new(false),
				RunAsNonRoot:             new(true),
				ReadOnlyRootFilesystem:   new(true),
				Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			},
		}},
		Volumes: []corev1.Volume{
			{Name: dataVolume, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: r.opts.Claim}}},
			{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: resource.NewQuantity(r.opts.TmpSize, resource.BinarySI)}}},
		},
	}
	if r.opts.RuntimeClass != "" {
		pod.RuntimeClassName = new(r.opts.RuntimeClass)
	}
	js := batchv1.JobSpec{
		BackoffLimit:            new(int32(0)),
		TTLSecondsAfterFinished: new(int32(r.opts.JobTTL / time.Second)),
		Template:                corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: l}, Spec: pod},
	}
	if d := spec.Limits.WallClock; d > 0 {
		js.ActiveDeadlineSeconds = new(int64((d + time.Second - 1) / time.Second))
	}
	owned, _ := json.Marshal(append([]hostuser.Tree{}, trees...))
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: spec.ID, Labels: l, Annotations: map[string]string{annotationOwned: string(owned)}},
		Spec:       js,
	}
	if len(trees) > 0 {
		job.Finalizers = []string{finalizerReclaim}
	}
	return job
}

// seccomp is the pods' seccomp profile.
func (r *Runtime) seccomp() *corev1.SeccompProfile {
	if p := r.opts.SeccompProfile; p != "" {
		return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: &p}
	}
	return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
}

// literal escapes args from the kubelet's expansion of $(VAR) references
// ("$$" is a "$"), so the command runs as given.
func literal(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = strings.ReplaceAll(a, "$", "$$")
	}
	return out
}

// Recover finds the sandbox's Job after a restart.
func (r *Runtime) Recover(ctx context.Context, h *sandbox.Handle) error {
	if h.Runtime != Name {
		return fmt.Errorf("recover: handle is for runtime %q: %w", h.Runtime, errdefs.ErrInvalidArgument)
	}
	if _, err := r.job(ctx, h.ID); err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	return r.ready(ctx)
}

// Exec is not supported: a command in a running pod needs the API
// server's exec; a session's commands run through its exec agent.
func (r *Runtime) Exec(ctx context.Context, id string, req sandbox.ExecRequest) (sandbox.ExitStatus, error) {
	if _, err := r.job(ctx, id); err != nil {
		return sandbox.ExitStatus{Code: -1}, fmt.Errorf("exec: %w", err)
	}
	return sandbox.ExitStatus{Code: -1}, fmt.Errorf("exec in sandbox %s: the kubernetes runtime runs no commands in a running sandbox: %w", id, errdefs.ErrNotImplemented)
}

// observed is sandbox id's Job and newest pod in the cache; job is nil if
// the cache has none.
func (r *Runtime) observed(id string) (*batchv1.Job, *corev1.Pod) {
	var job *batchv1.Job
	var err error
	if bd := r.boundTo(id); bd != nil {
		if job, err = r.jobs.Get(bd.job); err != nil {
			return nil, nil
		}
	} else if job, err = r.jobs.Get(id); err != nil || job.Labels[sandbox.LabelSandbox] != id {
		// A claimed warm pod's, by its label.
		job = nil
		jobs, _ := r.jobs.List(labels.SelectorFromSet(labels.Set{sandbox.LabelSandbox: id}))
		for _, j := range jobs {
			if strings.HasPrefix(j.Name, warmpool.Prefix) {
				job = j
			}
		}
		if job == nil {
			return nil, nil
		}
	}
	// By its Job's name: a claimed warm pod keeps its labels.
	pods, _ := r.pods.List(labels.SelectorFromSet(labels.Set{batchv1.JobNameLabel: job.Name}))
	var newest *corev1.Pod
	for _, p := range pods {
		if newest == nil || p.CreationTimestamp.After(newest.CreationTimestamp.Time) {
			newest = p
		}
	}
	return job, newest
}

// exit is how sandbox id ended, if it has: its pod's container's end (or
// the last one watched, once the pod is gone), a deadline the Job
// controller marked, or, with no pod, the Job's end or its deletion.
func (r *Runtime) exit(id string, job *batchv1.Job, pod *corev1.Pod) (sandbox.ExitStatus, bool) {
	deadline := deadlineExceeded(job)
	if pod != nil {
		es, ok := podExit(pod)
		switch {
		case ok:
			es.DeadlineExceeded = deadline
			return noTask(job, es), true
		case deadline: // at once, not after the pod's grace period
			return sandbox.ExitStatus{Code: -1, DeadlineExceeded: true, Message: "DeadlineExceeded: the Job ran past its activeDeadlineSeconds"}, true
		}
		return sandbox.ExitStatus{}, false // it runs, or stops: its end comes
	}
	r.mu.Lock()
	es, ok := r.exits[job.Name]
	r.mu.Unlock()
	if ok {
		es.DeadlineExceeded = deadline
		return noTask(job, es), true
	}
	for _, c := range job.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch {
		case deadline:
			return sandbox.ExitStatus{Code: -1, DeadlineExceeded: true, ExitedAt: c.LastTransitionTime.UTC(), Message: "DeadlineExceeded: the Job ran past its activeDeadlineSeconds"}, true
		case c.Type == batchv1.JobComplete:
			return sandbox.ExitStatus{Code: 0, ExitedAt: c.LastTransitionTime.UTC(), Message: "Job complete"}, true
		case c.Type == batchv1.JobFailed:
			return sandbox.ExitStatus{Code: -1, ExitedAt: c.LastTransitionTime.UTC(), Message: c.Reason + ": " + c.Message}, true
		}
	}
	if job.DeletionTimestamp != nil {
		// Being deleted (finalizerReclaim holds it), its pod gone: the
		// Job controller marks no end on a Job being deleted, and
		// starts no pod for it.
		return sandbox.ExitStatus{Code: -1, ExitedAt: job.DeletionTimestamp.UTC(), Message: "the Job was deleted before its end was seen"}, true
	}
	return sandbox.ExitStatus{}, false
}

// deadlineExceeded reports whether the Job controller ended job for its
// activeDeadlineSeconds: FailureTarget comes at the deadline, Failed only
// once the pod is gone.
func deadlineExceeded(job *batchv1.Job) bool {
	for _, c := range job.Status.Conditions {
		if (c.Type == batchv1.JobFailureTarget || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue && c.Reason == batchv1.JobReasonDeadlineExceeded {
			return true
		}
	}
	return false
}

// startFailures are the waiting reasons of a container that will not
// start: its sandbox has ended.
var startFailures = []string{"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError", "RunContainerError"}

// podExit is how pod's worker container ended, if it has.
func podExit(pod *corev1.Pod) (sandbox.ExitStatus, bool) {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != container {
			continue
		}
		if t := cs.State.Terminated; t != nil {
			// The reason is the node's. The message is the sandbox's (its
			// termination log, else the end of its output: the kubelet's
			// FallbackToLogsOnError): its last words, as under every
			// runtime, when the node's reason is no OOM kill.
			es := sandbox.ExitStatus{Code: int(t.ExitCode), OOMKilled: t.Reason == "OOMKilled", ExitedAt: t.FinishedAt.UTC(), Message: t.Reason}
			if m := sandbox.ExitMessage(es.Code, func() []byte { return []byte(t.Message) }); m != "" && !es.OOMKilled {
				es.Message = m
			}
			return es, true
		}
		if w := cs.State.Waiting; w != nil && slices.Contains(startFailures, w.Reason) {
			return sandbox.ExitStatus{Code: -1, Message: strings.TrimSuffix(w.Reason+": "+w.Message, ": ")}, true
		}
	}
	if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
		return sandbox.ExitStatus{Code: -1, Message: strings.TrimSuffix(pod.Status.Reason+": "+pod.Status.Message, ": ")}, true
	}
	return sandbox.ExitStatus{}, false
}

// settleWait bounds how long Wait waits for the kubelet to read a killed
// container's reason again (see settling).
const settleWait = 10 * time.Second

// settling reports whether es, how pod's worker container ended, may still
// turn into an OOM kill. Before 2.3, containerd's CRI can handle a
// container's OOM event after its exit event (the shim sends them from two
// goroutines), and the kubelet, reading in between, reports the SIGKILL
// as "Error". It
// reads the reason again once it has stopped the pod's sandbox, in the
// status whose PodReadyToStartContainers condition turns False.
func settling(pod *corev1.Pod, es sandbox.ExitStatus) bool {
	if es.OOMKilled || es.Code != 137 {
		return false
	}
	limited := false
	for _, c := range pod.Spec.Containers {
		if c.Name == container && !c.Resources.Limits.Memory().IsZero() {
			limited = true
		}
	}
	if !limited {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReadyToStartContainers {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Wait blocks until the sandbox has ended, watching, not polling.
func (r *Runtime) Wait(ctx context.Context, id string) (sandbox.ExitStatus, error) {
	if _, err := r.job(ctx, id); err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("wait: %w", err)
	}
	if err := r.ready(ctx); err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("wait: %w", err)
	}
	seen := false
	var settle <-chan time.Time // set once an exit may still become an OOM kill
	settled := false
	for {
		changed := r.changes()
		job, pod := r.observed(id)
		switch {
		case job != nil:
			seen = true
			if job.DeletionTimestamp != nil && pod != nil && pod.DeletionTimestamp == nil {
				// Deleted by another (an operator) as it runs: its pod
				// goes, as the garbage collector would take it were the
				// Job not kept for its directories (finalizerReclaim).
				if err := r.stopPod(ctx, id, pod, time.Second); err != nil {
					r.log.Warn("cannot stop the pod of a Job deleted as it runs; trying again at its next change", logkey.SandboxID, id, logkey.Error, err)
				}
			}
			es, ok := r.exit(id, job, pod)
			if !ok {
				break
			}
			if settled || pod == nil || !settling(pod, es) {
				return es, nil
			}
			if settle == nil {
				settle = time.After(settleWait)
			}
		case seen:
			// Gone from the cache after it was there: deleted meanwhile.
			if _, err := r.job(ctx, id); errors.Is(err, errdefs.ErrNotFound) {
				return sandbox.ExitStatus{}, fmt.Errorf("wait: sandbox %s was destroyed: %w", id, errdefs.ErrNotFound)
			}
		}
		select {
		case <-changed:
		case <-settle:
			settled = true
		case <-ctx.Done():
			return sandbox.ExitStatus{}, fmt.Errorf("wait for sandbox %s: %w", id, ctx.Err())
		}
	}
}

// Status returns the sandbox's state as last watched.
func (r *Runtime) Status(ctx context.Context, id string) (sandbox.Status, error) {
	if err := r.ready(ctx); err != nil {
		return sandbox.Status{}, fmt.Errorf("status: %w", err)
	}
	job, pod := r.observed(id)
	if job == nil {
		// Not watched yet, or not there: the API server says which.
		j, err := r.job(ctx, id)
		if err != nil {
			return sandbox.Status{}, fmt.Errorf("status: %w", err)
		}
		return sandbox.Status{State: sandbox.StateCreating, StartedAt: j.CreationTimestamp.UTC()}, nil
	}
	s := sandbox.Status{State: sandbox.StateCreating, StartedAt: job.CreationTimestamp.UTC()}
	if es, ok := r.exit(id, job, pod); ok {
		s.State, s.Exit, s.Message = sandbox.StateExited, &es, es.Message
	} else if pod != nil && pod.Status.Phase == corev1.PodRunning {
		s.State = sandbox.StateRunning
	}
	return s, nil
}

// MinGrace is the shortest grace period a kubelet gives a container it
// stops (its minimumGracePeriodInSeconds): a Stop with less waits this.
const MinGrace = 2 * time.Second

// Stop deletes the sandbox's pod with grace as its grace period: the
// kubelet sends SIGTERM, waits, then kills. The kubelet waits at least
// MinGrace, whatever the pod's deletion asks. The Job (backoffLimit 0)
// starts no other. It returns once the pod has ended.
func (r *Runtime) Stop(ctx context.Context, id string, grace time.Duration) error {
	if _, err := r.job(ctx, id); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	if err := r.ready(ctx); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	for {
		changed := r.changes()
		job, pod := r.observed(id)
		if job == nil {
			// Not watched yet (just made), or gone: the API server says.
			if _, err := r.job(ctx, id); errors.Is(err, errdefs.ErrNotFound) {
				return nil
			}
		} else if pod == nil {
			// No pod: the Job's end, or its deletion, says whether
			// one may yet come.
			if _, ended := r.exit(id, job, nil); ended {
				return nil
			}
		}
		if pod != nil {
			if _, ended := podExit(pod); ended {
				return nil // its processes are gone with its container
			}
			if pod.DeletionTimestamp == nil {
				if err := r.stopPod(ctx, id, pod, grace); err != nil {
					return err
				}
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("stop sandbox %s: %w", id, ctx.Err())
		}
	}
}

// stopPod deletes sandbox id's pod with grace as its grace period: the
// kubelet sends SIGTERM, waits (at least MinGrace), then kills.
func (r *Runtime) stopPod(ctx context.Context, id string, pod *corev1.Pod, grace time.Duration) error {
	// Whole seconds, at least one: a grace period of 0 would remove the
	// pod from the API at once, before the node has stopped it.
	secs := max(int64((grace+time.Second-1)/time.Second), 1)
	err := r.api.delete(ctx, "pods", pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &secs})
	if err != nil && !apierrors.IsNotFound(err) {
		return classify("stop sandbox "+id, err)
	}
	r.log.Info("sandbox stopping", logkey.SandboxID, id, "grace", grace)
	return nil
}

// List returns this server's Jobs whose labels include selector, those
// being deleted too (finalizerReclaim holds them until a Destroy has taken
// back their directories). It asks the API server, not the watch's cache,
// which may not have a Job that Create has just made.
func (r *Runtime) List(ctx context.Context, selector map[string]string) ([]sandbox.Handle, error) {
	sel := labels.Set{sandbox.LabelRuntime: Name, sandbox.LabelInstance: r.opts.Instance}
	for k, v := range selector {
		if _, mine := sel[k]; !mine {
			sel[k] = v
		}
	}
	jobs, err := r.api.listJobs(ctx, labels.SelectorFromSet(sel).String())
	if err != nil {
		return nil, classify("list sandboxes", err)
	}
	var out []sandbox.Handle
	for i := range jobs.Items {
		j := &jobs.Items[i]
		id := j.Labels[sandbox.LabelSandbox]
		if sandbox.ValidateID(id) != nil {
			continue
		}
		out = append(out, *handle(id, j))
	}
	return out, nil
}

// ownedTrees are the directories job's sandbox was given, as its
// annotation records them: only directories of the data root, which is all
// a Job mounts, whatever else an annotation someone edited names.
func (r *Runtime) ownedTrees(job *batchv1.Job) []hostuser.Tree {
	var trees []hostuser.Tree
	if err := json.Unmarshal([]byte(job.Annotations[annotationOwned]), &trees); err != nil {
		r.log.Warn("a Job without its owned directories; none taken back", logkey.SandboxID, job.Name, logkey.Error, err)
	}
	// The data root is the server's, and the sandbox's identity is the
	// runtime's: an annotation names neither.
	for i := range trees {
		trees[i].Owner, trees[i].To = hostuser.Identity{UID: os.Geteuid(), GID: os.Getegid()}, r.opts.User
	}
	return slices.DeleteFunc(trees, func(t hostuser.Tree) bool {
		rel, err := filepath.Rel(r.opts.DataRoot, t.Dir)
		outside := err != nil || !filepath.IsLocal(rel)
		if outside {
			r.log.Warn("a Job names a directory outside the data root as its own; not taken back", logkey.SandboxID, job.Name, "dir", t.Dir)
		}
		return outside
	})
}

// Destroy deletes the sandbox's Job, its pod and its Secret, waits until
// the pod is gone (nothing writes to its mounts any more), takes back the
// directories it was given and then lets the Job go (finalizerReclaim).
// It returns once the watch has seen the Job go, so that Status answers
// ErrNotFound. Unknown ids return nil.
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	bd := r.boundTo(id)
	job, err := r.job(ctx, id)
	switch {
	case errors.Is(err, errdefs.ErrNotFound) && bd != nil:
		// A claim of this server's whose Job went before its patch (and
		// finalizer) landed: what it gave is still to take back.
		job = &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: bd.job, UID: bd.uid}}
	case errors.Is(err, errdefs.ErrNotFound):
		// Gone from the API, maybe by a Destroy cut short after the
		// Job's deletion: the watch may not have seen it go yet.
		return r.unwatched(ctx, id, "")
	case err != nil:
		return fmt.Errorf("destroy: %w", err)
	}
	// What a claim of this server's gave, whether or not its patch
	// landed; else what the Job's annotation says.
	var trees []hostuser.Tree
	if bd != nil {
		trees = bd.trees
	} else {
		trees = r.ownedTrees(job)
	}
	if err := r.destroy(ctx, id, job, trees); err != nil {
		return err
	}
	// The claim's record goes last: a server that dies before finds it,
	// and takes back what it names. A claimed warm pod's Job is named
	// after it, whether this server or one gone claimed it.
	if bd != nil {
		os.RemoveAll(bd.root)
		r.warmMu.Lock()
		delete(r.bound, id)
		r.warmMu.Unlock()
	} else if r.opts.StateDir != "" && strings.HasPrefix(job.Name, warmpool.Prefix) && sandbox.ValidateID(job.Name) == nil {
		os.RemoveAll(filepath.Join(r.warmDir(), job.Name))
	}
	return nil
}

// destroy is Destroy of sandbox id, whose Job is job and whose pod was
// given trees. Each step may have been done by a Destroy cut short: the
// Job's deletion left it in the API (finalizerReclaim) for this one.
func (r *Runtime) destroy(ctx context.Context, id string, job *batchv1.Job, trees []hostuser.Tree) error {
	if err := r.ready(ctx); err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	// One second of grace, not 0: 0 removes the pod from the API before
	// the node has stopped it, and its processes could still write to
	// the directories taken back below.
	background, grace := metav1.DeletePropagationBackground, int64(1)
	err := r.api.delete(ctx, "jobs", job.Name, metav1.DeleteOptions{PropagationPolicy: &background, Preconditions: &metav1.Preconditions{UID: &job.UID}})
	if err != nil && !apierrors.IsNotFound(err) {
		return classify("destroy sandbox "+id, err)
	}
	r.crash(sandbox.CrashJobDeleted)
	// Its pods by their Job's name: a claimed warm pod keeps the
	// labels it was made with.
	sel := labels.SelectorFromSet(labels.Set{batchv1.JobNameLabel: job.Name, sandbox.LabelInstance: r.opts.Instance}).String()
	if err := r.api.deleteAll(ctx, "pods", sel, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil && !apierrors.IsNotFound(err) {
		return classify("destroy sandbox "+id, err)
	}
	for {
		changed := r.changes()
		left, err := r.api.listPods(ctx, sel)
		if err != nil {
			return classify("destroy sandbox "+id, err)
		}
		if len(left.Items) == 0 {
			break
		}
		select {
		case <-changed:
		case <-time.After(time.Second): // a pod's removal is watched, this is a backstop
		case <-ctx.Done():
			return fmt.Errorf("destroy sandbox %s: its pod is still there: %w", id, ctx.Err())
		}
	}
	r.crash(sandbox.CrashPodGone)
	if err := r.api.delete(ctx, "secrets", envSecret(job.Name), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return classify("destroy sandbox "+id, err)
	}
	if err := hostuser.Reclaim(trees); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	r.crash(sandbox.CrashReclaimed)
	if err := r.release(ctx, job); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	if err := r.unwatched(ctx, id, job.UID); err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.exits, job.Name)
	delete(r.made, id)
	r.mu.Unlock()
	r.log.Info("sandbox destroyed", logkey.SandboxID, id)
	return nil
}

// release removes finalizerReclaim from job, whose directories are taken
// back: the API server then removes the Job.
func (r *Runtime) release(ctx context.Context, job *batchv1.Job) error {
	for {
		cur, err := r.jobNamed(ctx, job.Name)
		switch {
		case apierrors.IsNotFound(err) || err == nil && cur.UID != job.UID:
			return nil
		case err != nil:
			return classify("release Job "+job.Name, err)
		case !slices.Contains(cur.Finalizers, finalizerReclaim):
			return nil
		}
		// Against the version read: another finalizer added meanwhile
		// (a foreground deletion's) stays.
		rest := slices.DeleteFunc(slices.Clone(cur.Finalizers), func(f string) bool { return f == finalizerReclaim })
		body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": cur.ResourceVersion, "finalizers": rest}})
		err = r.api.patch(ctx, "jobs", job.Name, body, &batchv1.Job{})
		if err == nil || apierrors.IsNotFound(err) {
			return nil
		}
		if !apierrors.IsConflict(err) {
			return classify("release Job "+job.Name, err)
		}
	}
}

// unwatched returns once the watch no longer shows sandbox id's Job (the
// one of uid, if not empty), which the API server has removed, or keeps
// only for finalizers of others', which are not Destroy's to wait for.
func (r *Runtime) unwatched(ctx context.Context, id string, uid types.UID) error {
	if err := r.ready(ctx); err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	for {
		changed := r.changes()
		job, _ := r.observed(id)
		if job == nil || uid != "" && job.UID != uid {
			return nil
		}
		select {
		case <-changed:
		case <-time.After(time.Second):
			cur, err := r.jobNamed(ctx, job.Name)
			if err == nil && cur.UID == job.UID && cur.DeletionTimestamp != nil && len(cur.Finalizers) > 0 && !slices.Contains(cur.Finalizers, finalizerReclaim) {
				r.log.Warn("a destroyed sandbox's Job stays for others' finalizers", logkey.SandboxID, id, "job", job.Name, "finalizers", cur.Finalizers)
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("destroy sandbox %s: its Job is gone, and the watch has not seen it go: %w", id, ctx.Err())
		}
	}
}
