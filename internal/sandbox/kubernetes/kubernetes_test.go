package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes/k8stest"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/testenv"
)

// classes are the RuntimeClasses the tests run under: the node's default
// (runc) and gVisor.
var classes = []string{"", k8stest.GVisor}

func className(c string) string {
	if c == "" {
		return "runc"
	}
	return c
}

// cluster is one test's namespace and claim (a volume over the host's
// root, so any host directory is a subPath: sandboxtest.DataRoot).
type cluster struct {
	cfg       *rest.Config
	ns, claim string
}

func newCluster(t *testing.T) cluster {
	t.Helper()
	cfg := k8stest.Require(t)
	cs := k8stest.Clientset(t, cfg)
	ns := k8stest.Namespace(t, cs)
	return cluster{cfg: cfg, ns: ns, claim: k8stest.Claim(t, cs, ns, sandboxtest.DataRoot)}
}

// mustNew returns a Runtime in c's namespace under RuntimeClass class,
// with its own instance.
func (c cluster) mustNew(tb testing.TB, class, instance string) *Runtime {
	tb.Helper()
	r, err := New(Options{
		Config:       c.cfg,
		Namespace:    c.ns,
		DataRoot:     sandboxtest.DataRoot,
		Claim:        c.claim,
		RuntimeClass: class,
		DefaultImage: k8stest.BusyboxImage,
		PullPolicy:   "Never",
		JobTTL:       time.Hour,
		Instance:     instance,
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() })
	return r
}

func TestConformance(t *testing.T) {
	t.Parallel()
	for _, class := range classes {
		t.Run(className(class), func(t *testing.T) {
			c := newCluster(t)
			sandboxtest.Run(t, sandboxtest.Harness{
				Setup: func(t *testing.T) func() sandbox.Runtime {
					inst := sandboxtest.NewID(t)
					return func() sandbox.Runtime { return c.mustNew(t, class, inst) }
				},
				NoHostDirs: true,
				MinGrace:   MinGrace,
				Latency:    20 * time.Second,
			})
		})
	}
}

func TestSurvivesServerDeath(t *testing.T) {
	t.Parallel()
	// The namespace, claim and instance travel to the helper process as
	// the "state"; the helper connects to the same namespace.
	newRuntime := func(tb testing.TB, state string) sandbox.Runtime {
		f := strings.SplitN(state, "/", 3)
		return cluster{cfg: k8stest.Require(tb), ns: f[0], claim: f[1]}.mustNew(tb, "", f[2])
	}
	setup := func(t *testing.T) (string, string) {
		c := newCluster(t)
		return c.ns + "/" + c.claim + "/" + sandboxtest.NewID(t), testenv.TempDir(t)
	}
	sandboxtest.ServerDeath(t, setup, newRuntime)
}

// run creates a sandbox running script with a fresh directory at /out,
// waits for it and returns its exit status, what it wrote to /out/out and
// the sandbox's id (destroyed when the test ends).
func run(t *testing.T, r *Runtime, script string, mod func(*sandbox.Spec)) (sandbox.ExitStatus, string, string) {
	t.Helper()
	dir := testenv.TempDir(t)
	sp := sandbox.Spec{
		ID:      sandboxtest.NewID(t),
		Command: []string{"/bin/sh", "-c", script},
		Dir:     "/out",
		Mounts:  []sandbox.Mount{{Source: sandboxtest.MountSource(dir), Target: "/out"}},
		Env:     []string{"CORRAL_SECRET_TEST=s3cret-value"},
	}
	if mod != nil {
		mod(&sp)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := r.Create(ctx, sp); err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { r.Destroy(context.Background(), sp.ID) })
	es, err := r.Wait(ctx, sp.ID)
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	out, _ := os.ReadFile(filepath.Join(dir, "out"))
	return es, string(out), sp.ID
}

// TestHardening checks what a pod's process is under each RuntimeClass:
// uid and gid 1000, no capabilities, no_new_privs, a read-only root, its
// environment from the Secret, and no service account token; and that
// the pod's pid 1, its pause process, is another user's, whose memory it
// cannot open (under the runtime's default seccomp profile: the kernel
// refuses it, not a filter).
func TestHardening(t *testing.T) {
	t.Parallel()
	for _, class := range classes {
		t.Run(className(class), func(t *testing.T) {
			t.Parallel()
			c := newCluster(t)
			r := c.mustNew(t, class, sandboxtest.NewID(t))
			script := `exec > out 2>&1
id -u; id -g
grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status
touch /root-write && echo root writable || echo root read-only
ls /var/run/secrets/kubernetes.io 2>/dev/null && echo token mounted || echo no token
echo "env $CORRAL_SECRET_TEST"
echo "pid 1 $(cat /proc/1/comm) $(grep '^Uid:' /proc/1/status)"
for f in /proc/1/mem /proc/1/task/1/mem; do (exec 3<$f) 2>/dev/null && echo "$f open" || echo "$f closed"; done`
			es, out, _ := run(t, r, script, nil)
			if es.Code != 0 {
				t.Fatalf("exit %+v: %s", es, out)
			}
			pause := fmt.Sprintf("pid 1 pause Uid:\t%d\t%[1]d\t%[1]d\t%[1]d\n", PauseUser.UID)
			for _, want := range []string{"1000\n1000\n", "CapEff:\t0000000000000000", "root read-only", "no token", "env s3cret-value",
				pause, "/proc/1/mem closed", "/proc/1/task/1/mem closed"} {
				if !strings.Contains(out, want) {
					t.Errorf("sandbox reported %q, want %q in it", out, want)
				}
			}
			if class == "" && !strings.Contains(out, "NoNewPrivs:\t1") {
				t.Errorf("sandbox reported %q, want NoNewPrivs 1", out) // gVisor's /proc does not show it
			}
		})
	}
}

// TestJobShape: the Job is seed 000's manifest, and no value of the
// environment is a literal in it.
func TestJobShape(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	r := c.mustNew(t, "", sandboxtest.NewID(t))
	_, _, id := run(t, r, "true", func(sp *sandbox.Spec) {
		sp.Limits = sandbox.Limits{MemoryBytes: 64 << 20, CPUMillis: 500, WallClock: 90 * time.Second}
	})
	job, err := k8stest.Clientset(t, c.cfg).BatchV1().Jobs(c.ns).Get(context.Background(), id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := job.Spec.Template.Spec
	ctr := p.Containers[0]
	sc := ctr.SecurityContext
	checks := map[string]bool{
		"backoffLimit 0":                   *job.Spec.BackoffLimit == 0,
		"activeDeadlineSeconds 90":         *job.Spec.ActiveDeadlineSeconds == 90,
		"ttlSecondsAfterFinished 3600":     *job.Spec.TTLSecondsAfterFinished == 3600,
		"restartPolicy Never":              p.RestartPolicy == corev1.RestartPolicyNever,
		"labels app, task-id":              job.Labels["app"] == AppWorker && job.Labels["task-id"] == id && p.Containers != nil,
		"uid/gid 1000, fsGroup, non-root":  *sc.RunAsUser == 1000 && *sc.RunAsGroup == 1000 && *p.SecurityContext.FSGroup == 1000 && *p.SecurityContext.RunAsNonRoot,
		"pause as 65535":                   *p.SecurityContext.RunAsUser == 65535 && *p.SecurityContext.RunAsGroup == 65535,
		"seccomp RuntimeDefault":           p.SecurityContext.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault,
		"no token":                         !*p.AutomountServiceAccountToken,
		"no privilege escalation, no caps": !*sc.AllowPrivilegeEscalation && len(sc.Capabilities.Drop) == 1 && sc.Capabilities.Drop[0] == "ALL",
		"read-only root":                   *sc.ReadOnlyRootFilesystem,
		"memory limit 64Mi":                ctr.Resources.Limits.Memory().String() == "64Mi",
		"cpu limit 500m":                   ctr.Resources.Limits.Cpu().String() == "500m",
		"no env literal":                   len(ctr.Env) == 0 && len(ctr.EnvFrom) == 1 && ctr.EnvFrom[0].SecretRef.Name == id+"-env",
		"subPath mount":                    ctr.VolumeMounts[1].SubPath != "" && ctr.VolumeMounts[1].MountPath == "/out",
		"output as a failure's message":    ctr.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError,
		"the reclaim finalizer":            slices.Equal(job.Finalizers, []string{finalizerReclaim}),
	}
	for what, ok := range checks {
		if !ok {
			t.Errorf("the Job lacks %s", what)
		}
	}
	if b, _ := job.Marshal(); strings.Contains(string(b), "s3cret-value") {
		t.Errorf("the Job holds the environment's value")
	}
}

// TestJobDeletedElsewhere: a Job deleted behind the runtime's back (by
// its TTL, an operator, or a Destroy cut short) stays in the API until a
// Destroy has taken back the directories it gave; its pod is stopped, and
// List shows the Job meanwhile, so that a restarted server's
// reconciliation finds, stops and destroys it.
func TestJobDeletedElsewhere(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	inst := sandboxtest.NewID(t)
	r := c.mustNew(t, "", inst)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := testenv.TempDir(t)
	sp := sandbox.Spec{
		ID:      sandboxtest.NewID(t),
		Command: []string{"/bin/sh", "-c", "touch /out/made && sleep 100"},
		Mounts:  []sandbox.Mount{{Source: sandboxtest.MountSource(dir), Target: "/out"}},
	}
	if _, err := r.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Destroy(context.Background(), sp.ID) })
	k8stest.WaitFor(t, "the worker writing to its directory", func() bool {
		_, err := os.Stat(filepath.Join(dir, "made"))
		return err == nil
	})
	// Well within the worker's sleep.
	wctx, wcancel := context.WithTimeout(ctx, 45*time.Second)
	defer wcancel()
	waited := make(chan error, 1)
	go func() {
		_, err := r.Wait(wctx, sp.ID)
		waited <- err
	}()
	jobs := k8stest.Clientset(t, c.cfg).BatchV1().Jobs(c.ns)
	background := metav1.DeletePropagationBackground
	if err := jobs.Delete(ctx, sp.ID, metav1.DeleteOptions{PropagationPolicy: &background}); err != nil {
		t.Fatal(err)
	}
	if job, err := jobs.Get(ctx, sp.ID, metav1.GetOptions{}); err != nil || job.DeletionTimestamp == nil {
		t.Fatalf("the deleted Job = %v, want it kept, being deleted", err)
	}
	// Its pod is stopped, as the garbage collector would have taken it:
	// the task's Wait ends well before its sleep would.
	if err := <-waited; err != nil {
		t.Fatalf("Wait as the Job is deleted: %v", err)
	}
	pods := k8stest.Clientset(t, c.cfg).CoreV1().Pods(c.ns)
	sel := metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + sp.ID}
	k8stest.WaitFor(t, "the pod gone", func() bool {
		l, err := pods.List(ctx, sel)
		return err == nil && len(l.Items) == 0
	})
	// A server started afresh, as after a crash, lists it, and its
	// reconciliation's Stop and Wait end: the Job controller marks no
	// end on a Job being deleted.
	r2 := c.mustNew(t, "", inst)
	hs, err := r2.List(ctx, nil)
	if err != nil || !slices.ContainsFunc(hs, func(h sandbox.Handle) bool { return h.ID == sp.ID }) {
		t.Fatalf("List = %v, %v; want the Job being deleted", hs, err)
	}
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	if err := r2.Stop(sctx, sp.ID, 0); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if es, err := r2.Wait(sctx, sp.ID); err != nil || es.Code != -1 {
		t.Errorf("Wait = %+v, %v; want the Job's deletion", es, err)
	}
	if err := r2.Destroy(ctx, sp.ID); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "made")} {
		if fi, err := os.Lstat(p); err != nil || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid()) {
			t.Errorf("%s after Destroy: %v, want it taken back by the server (uid %d)", p, err, os.Geteuid())
		}
	}
	if _, err := jobs.Get(ctx, sp.ID, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Job after Destroy: %v, want it gone", err)
	}
	if _, err := r2.Status(ctx, sp.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Status after Destroy = %v, want ErrNotFound", err)
	}
}

// TestDestroyLeavesOthersFinalizers: a Job that someone else holds with a
// finalizer of theirs does not hold Destroy, which lets go of its own and
// returns.
func TestDestroyLeavesOthersFinalizers(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	r := c.mustNew(t, "", sandboxtest.NewID(t))
	_, _, id := run(t, r, "true", nil)
	jobs := k8stest.Clientset(t, c.cfg).BatchV1().Jobs(c.ns)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	body := `{"metadata":{"finalizers":["` + finalizerReclaim + `","example.com/keep"]}}`
	if _, err := jobs.Patch(ctx, id, types.MergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := r.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	job, err := jobs.Get(ctx, id, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the Job after Destroy: %v, want it held by the other finalizer", err)
	}
	if job.DeletionTimestamp == nil || !slices.Equal(job.Finalizers, []string{"example.com/keep"}) {
		t.Errorf("the Job after Destroy has finalizers %v (deleted at %v), want it being deleted, held by the other finalizer alone", job.Finalizers, job.DeletionTimestamp)
	}
}

// TestDeadline: a sandbox that runs past its wall-clock limit ends when
// the Job controller marks the deadline, not after the pod's grace period.
func TestDeadline(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	r := c.mustNew(t, "", sandboxtest.NewID(t))
	start := time.Now()
	es, _, _ := run(t, r, "trap '' TERM; sleep 600", func(sp *sandbox.Spec) { sp.Limits.WallClock = 3 * time.Second })
	took := time.Since(start)
	if !es.DeadlineExceeded {
		t.Errorf("ExitStatus = %+v, want DeadlineExceeded", es)
	}
	// The pod's grace period is 10 s: an end after it means Wait waited
	// for the Job's Failed condition instead.
	if took > 12*time.Second {
		t.Errorf("the deadline of 3 s ended Wait after %s", took)
	}
}

// TestHostDirRefused: a directory of the server's host outside the data
// root cannot be mounted on other nodes.
func TestHostDirRefused(t *testing.T) {
	r, err := New(Options{Config: &rest.Config{Host: "https://127.0.0.1:1"}, DataRoot: "/data", Claim: "c", DefaultImage: "x"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	err = r.validate(sandbox.Spec{ID: "t-1", Command: []string{"true"}, Mounts: []sandbox.Mount{{Source: "/srv/repos/app", Target: "/workspace/project", HostDir: true}}})
	if err == nil || !strings.Contains(err.Error(), "runtime on the server's host") {
		t.Errorf("validate = %v, want the host directory refused", err)
	}
}

// TestSeccompProfile: under runc, the container runtime's default profile
// lets a pod ptrace and use io_uring (the escape probe's findings); with
// Corral's profile installed on the node as a Localhost profile, both are
// refused, and so are keyrings, bpf and user namespaces, under runc and
// under gVisor (whose runsc applies it with oci-seccomp).
func TestSeccompProfile(t *testing.T) {
	t.Parallel()
	for _, class := range classes {
		t.Run(className(class), func(t *testing.T) {
			t.Parallel()
			testSeccompProfile(t, class)
		})
	}
}

func testSeccompProfile(t *testing.T, class string) {
	c := newCluster(t)
	bin := testenv.TempDir(t)
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "probe"), "github.com/corral-dev/corral/internal/sandbox/sandboxtest/probe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the probe: %v\n%s", err, out)
	}
	checks := []string{"ptrace traceme", "io_uring_setup", "keyctl", "bpf", "unshare user namespace"}
	type seccompCase struct {
		name    string
		profile string
		closed  bool
	}
	cases := []seccompCase{{"Corral's", k8stest.SeccompProfile(t, class), true}}
	if class == "" {
		// The control: without the profile the probe gets through.
		cases = append(cases, seccompCase{"RuntimeDefault", "", false})
	}
	for _, tc := range cases {
		r := c.mustNew(t, class, sandboxtest.NewID(t))
		r.opts.SeccompProfile = tc.profile
		dir := testenv.TempDir(t)
		sp := sandbox.Spec{
			ID:      sandboxtest.NewID(t),
			Command: []string{"/probe/probe", "--sandboxed", "--out", "/out/probe.json"},
			Dir:     "/out",
			Mounts: []sandbox.Mount{
				{Source: sandboxtest.MountSource(dir), Target: "/out"},
				{Source: sandboxtest.MountSource(bin), Target: "/probe", ReadOnly: true},
			},
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if _, err := r.Create(ctx, sp); err != nil {
			t.Fatalf("%s: Create: %v", tc.name, err)
		}
		if _, err := r.Wait(ctx, sp.ID); err != nil {
			t.Fatalf("%s: Wait: %v", tc.name, err)
		}
		r.Destroy(ctx, sp.ID)
		cancel()
		b, err := os.ReadFile(filepath.Join(dir, "probe.json"))
		var report map[string]probeResult
		if err != nil || json.Unmarshal(b, &report) != nil {
			t.Fatalf("%s: the probe's report: %v %s", tc.name, err, b)
		}
		for _, check := range checks {
			got, ok := report[check]
			if !ok {
				t.Errorf("%s: the probe did not try %q", tc.name, check)
				continue
			}
			if tc.closed && got.OK { // OK: the probe did it
				t.Errorf("%s: %s is open: %s", tc.name, check, got.Detail)
			}
		}
		if !tc.closed && !report["ptrace traceme"].OK {
			t.Errorf("%s: ptrace traceme closed without Corral's profile: the control shows nothing", tc.name)
		}
	}
}

// probeResult is one check of the escape probe's report: OK says the
// probe managed what the check tries.
type probeResult struct {
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// The worker may write its container's termination log: a failure's
// message is then that, not the end of its output, made one safe line
// like the output's last words.
func TestTerminationMessage(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	r := c.mustNew(t, "", sandboxtest.NewID(t))
	es, _, _ := run(t, r, "echo 'the output' >&2; printf 'earlier\\nfor the \\033[2Jlog' > /dev/termination-log; exit 3", nil)
	if want := "for the [2Jlog"; es.Code != 3 || es.Message != want {
		t.Errorf("ExitStatus = %+v, want code 3 and message %q", es, want)
	}
}

// PodAddr knows the addresses of this server's pods, and no other.
func TestPodAddr(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	r := c.mustNew(t, "", sandboxtest.NewID(t))
	if r.PodAddr("127.0.0.1") {
		t.Error("PodAddr(127.0.0.1) before any pod: true")
	}
	_, _, id := run(t, r, "true", nil)
	pods, err := r.pods.List(labels.SelectorFromSet(labels.Set{sandbox.LabelSandbox: id}))
	if err != nil || len(pods) != 1 || pods[0].Status.PodIP == "" {
		t.Fatalf("the sandbox's pod: %v, %v", pods, err)
	}
	if ip := pods[0].Status.PodIP; !r.PodAddr(ip) {
		t.Errorf("PodAddr(%s), its pod's address: false", ip)
	}
	for _, ip := range []string{"127.0.0.1", "192.0.2.1", ""} {
		if r.PodAddr(ip) {
			t.Errorf("PodAddr(%q): true", ip)
		}
	}
}

// A Job's owned-directories annotation names what Destroy gives back; one
// naming a directory outside the data root (edited by someone who may
// edit Jobs) is not followed.
func TestOwnedTreesStayInTheDataRoot(t *testing.T) {
	r, err := New(Options{Config: &rest.Config{Host: "https://127.0.0.1:1"}, DataRoot: "/data", Claim: "c", DefaultImage: "x"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{}
	job.Name = "t-1"
	job.Annotations = map[string]string{annotationOwned: `[{"dir":"/data/tasks/t-1","owner":{"UID":0,"GID":0}},{"dir":"/etc","owner":{"UID":1000,"GID":1000}},{"dir":"/data/../etc","owner":{"UID":1000,"GID":1000}}]`}
	got := r.ownedTrees(job)
	if len(got) != 1 || got[0].Dir != "/data/tasks/t-1" {
		t.Errorf("ownedTrees = %+v, want the task directory alone", got)
	}
}

// TestExitWithoutPod: with no pod, a Job has ended when the Job controller
// marked it, or when it is being deleted (the controller marks no end on
// such a Job), and not before.
func TestExitWithoutPod(t *testing.T) {
	r, err := New(Options{Config: &rest.Config{Host: "https://127.0.0.1:1"}, DataRoot: "/data", Claim: "c", DefaultImage: "x"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	deleted := metav1.Now()
	complete := batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}
	for _, tc := range []struct {
		name  string
		job   batchv1.Job
		ended bool
		code  int
	}{
		{"running", batchv1.Job{}, false, 0},
		{"complete", batchv1.Job{Status: batchv1.JobStatus{Conditions: []batchv1.JobCondition{complete}}}, true, 0},
		{"deleted", batchv1.Job{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &deleted, Finalizers: []string{finalizerReclaim}}}, true, -1},
	} {
		tc.job.Name = "t-1"
		es, ended := r.exit("t-1", &tc.job, nil)
		if ended != tc.ended || ended && es.Code != tc.code {
			t.Errorf("%s: exit = %+v, %v; want ended %v with code %d", tc.name, es, ended, tc.ended, tc.code)
		}
	}
}

// TestSettling: a memory-limited container killed by SIGKILL whose node
// says "Error" may be an OOM kill that containerd (before 2.3) handled
// after the exit, which the kubelet reports once it has stopped the pod's
// sandbox. Wait waits for that status, and no longer than settleWait. The
// pods are bound to a node that does not exist, so no kubelet writes
// their status but the test.
func TestSettling(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cs := k8stest.Clientset(t, c.cfg)
	r := c.mustNew(t, "", sandboxtest.NewID(t))
	ctx := context.Background()
	if err := r.ready(ctx); err != nil {
		t.Fatal(err)
	}
	// status gives the pod of sandbox id the worker's exit (code 137,
	// reason) and the sandbox condition.
	status := func(t *testing.T, id, reason string, sandboxUp corev1.ConditionStatus) {
		t.Helper()
		pods, err := cs.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{LabelSelector: sandbox.LabelSandbox + "=" + id})
		if err != nil || len(pods.Items) != 1 {
			t.Fatalf("pods of %s: %v, %v", id, pods, err)
		}
		pod := pods.Items[0]
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReadyToStartContainers, Status: sandboxUp, LastTransitionTime: metav1.Now()}}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: container, Image: k8stest.BusyboxImage, State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: reason, StartedAt: metav1.Now(), FinishedAt: metav1.Now()},
		}}}
		if _, err := cs.CoreV1().Pods(c.ns).UpdateStatus(ctx, &pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		k8stest.WaitFor(t, "the watch to see the status", func() bool {
			_, p := r.observed(id)
			return p != nil && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Terminated.Reason == reason
		})
	}
	// start makes sandbox id's Job, its pod on no node, and a Wait for it.
	start := func(t *testing.T) (string, chan sandbox.ExitStatus) {
		id := sandboxtest.NewID(t)
		sp := sandbox.Spec{ID: id, Command: []string{"true"}, Dir: "/", Limits: sandbox.Limits{MemoryBytes: 32 << 20}}
		job := r.jobFor(sp, nil)
		job.Spec.Template.Spec.NodeName = "corral-no-node"
		if _, err := cs.BatchV1().Jobs(c.ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			bg := metav1.DeletePropagationBackground
			cs.BatchV1().Jobs(c.ns).Delete(ctx, id, metav1.DeleteOptions{PropagationPolicy: &bg})
			cs.CoreV1().Pods(c.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}, metav1.ListOptions{LabelSelector: sandbox.LabelSandbox + "=" + id})
		})
		k8stest.WaitFor(t, "the Job's pod", func() bool {
			_, p := r.observed(id)
			return p != nil
		})
		ended := make(chan sandbox.ExitStatus, 1)
		go func() {
			es, err := r.Wait(ctx, id)
			if err != nil {
				t.Error(err)
			}
			ended <- es
		}()
		return id, ended
	}

	t.Run("oom after the exit", func(t *testing.T) {
		t.Parallel()
		id, ended := start(t)
		status(t, id, "Error", corev1.ConditionTrue)
		select {
		case es := <-ended:
			t.Fatalf("Wait ended with %+v while the sandbox was up", es)
		case <-time.After(time.Second):
		}
		status(t, id, "OOMKilled", corev1.ConditionFalse)
		if es := <-ended; !es.OOMKilled || es.Code != 137 {
			t.Errorf("ExitStatus = %+v, want the OOM kill", es)
		}
	})
	t.Run("no status after", func(t *testing.T) {
		t.Parallel()
		id, ended := start(t)
		begin := time.Now()
		status(t, id, "Error", corev1.ConditionTrue)
		es := <-ended
		if es.OOMKilled || es.Code != 137 || es.Message != "killed by SIGKILL (signal 9)" {
			t.Errorf("ExitStatus = %+v, want a SIGKILL that was no OOM kill", es)
		}
		if took := time.Since(begin); took < settleWait-time.Second {
			t.Errorf("Wait ended %s after the exit, want about %s", took, settleWait)
		}
	})
}

func TestSettlingRule(t *testing.T) {
	pod := func(limit string, sandboxUp corev1.ConditionStatus) *corev1.Pod {
		p := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: container}}}}
		if limit != "" {
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(limit)}
		}
		if sandboxUp != "" {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReadyToStartContainers, Status: sandboxUp}}
		}
		return p
	}
	killed := sandbox.ExitStatus{Code: 137, Message: "killed by SIGKILL (signal 9)"}
	for _, c := range []struct {
		what string
		pod  *corev1.Pod
		es   sandbox.ExitStatus
		want bool
	}{
		{"killed, limited, sandbox up", pod("32Mi", corev1.ConditionTrue), killed, true},
		{"sandbox stopped", pod("32Mi", corev1.ConditionFalse), killed, false},
		{"no sandbox condition (an older kubelet)", pod("32Mi", ""), killed, false},
		{"no memory limit", pod("", corev1.ConditionTrue), killed, false},
		{"already an OOM kill", pod("32Mi", corev1.ConditionTrue), sandbox.ExitStatus{Code: 137, OOMKilled: true}, false},
		{"exit code 1", pod("32Mi", corev1.ConditionTrue), sandbox.ExitStatus{Code: 1, Message: "Error"}, false},
		{"SIGTERM", pod("32Mi", corev1.ConditionTrue), sandbox.ExitStatus{Code: 143, Message: "killed by SIGTERM (signal 15)"}, false},
	} {
		if got := settling(c.pod, c.es); got != c.want {
			t.Errorf("%s: settling = %v, want %v", c.what, got, c.want)
		}
	}
}

// TestPodExit: a terminated worker's exit says what it would say under
// every other runtime (sandbox.ExitMessage), from the pod's termination
// message, unless the node's reason is an OOM kill.
func TestPodExit(t *testing.T) {
	pod := func(code int32, reason, message string) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: container,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, Message: message}}}}}}
	}
	for _, c := range []struct {
		what string
		pod  *corev1.Pod
		want sandbox.ExitStatus
	}{
		{"success", pod(0, "Completed", "done\n"), sandbox.ExitStatus{Code: 0, Message: "Completed"}},
		{"failure with last words", pod(2, "Error", "panic: boom\ngoroutine 1 [running]:\n"), sandbox.ExitStatus{Code: 2, Message: "panic: boom"}},
		{"failure without", pod(1, "Error", ""), sandbox.ExitStatus{Code: 1, Message: "Error"}},
		{"a signal", pod(137, "Error", "last line\n"), sandbox.ExitStatus{Code: 137, Message: "killed by SIGKILL (signal 9)"}},
		{"an OOM kill", pod(137, "OOMKilled", "last line\n"), sandbox.ExitStatus{Code: 137, OOMKilled: true, Message: "OOMKilled"}},
		{"above the signals", pod(255, "Error", "gave up\n"), sandbox.ExitStatus{Code: 255, Message: "gave up"}},
	} {
		es, ended := podExit(c.pod)
		es.ExitedAt = time.Time{}
		if !ended || es != c.want {
			t.Errorf("%s: podExit = %+v, %v; want %+v", c.what, es, ended, c.want)
		}
	}
}

// A request cut short by its context says so (a Wait whose context ends
// during its first request is the context's error), and is unavailable.
func TestClassifyContext(t *testing.T) {
	err := classify("sandbox t-1", &url.Error{Op: "Get", URL: "https://127.0.0.1:6443/apis/batch/v1/namespaces/n/jobs/t-1", Err: context.DeadlineExceeded})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("classify = %v, want context.DeadlineExceeded and ErrUnavailable", err)
	}
}

// TestLeftoverSlotWaitsForItsPod: the slot of a warm pod a server gone
// left stays while a pod of its Job is there (a pod the kubelet is still
// starting makes a missing slot again: it creates a subPath that is not
// there), and goes at the first pass after none is.
func TestLeftoverSlotWaitsForItsPod(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	r := c.mustNew(t, "", sandboxtest.NewID(t))
	r.opts.StateDir = testenv.TempDir(t)
	id := "warm-deadserver-" + strings.TrimPrefix(sandboxtest.NewID(t), "t-")
	slot := filepath.Join(r.warmDir(), id)
	if err := os.MkdirAll(filepath.Join(slot, "0"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cs := k8stest.Clientset(t, c.cfg)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: id, Labels: map[string]string{batchv1.JobNameLabel: id}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "w", Image: k8stest.BusyboxImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"sleep", "600"}}}},
	}
	if _, err := cs.CoreV1().Pods(c.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := r.destroyLeftoverWarm(ctx, ""); n != 1 {
		t.Errorf("with its pod there: %d slots left for their pods, want 1", n)
	}
	if _, err := os.Stat(slot); err != nil {
		t.Fatalf("the slot went while its pod is there: %v", err)
	}
	var zero int64
	if err := cs.CoreV1().Pods(c.ns).Delete(ctx, id, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); r.destroyLeftoverWarm(ctx, "") > 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a pass still waits for the pod of %s, deleted a minute ago", id)
		}
	}
	if _, err := os.Stat(slot); !os.IsNotExist(err) {
		t.Errorf("the slot is still there after its pod went: %v", err)
	}
}
