//go:build integration

package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sclient "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes/k8stest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// onKubernetes returns a configuration change that runs tasks of runtime
// kubernetes on the test cluster under RuntimeClass class ("" for the
// node's runc): a namespace of the test's own, a volume over the data
// root, and the server listening on the node's bridge address, where pods
// reach it (with a token, as a non-loopback address needs).
func onKubernetes(class string) func(testing.TB, *config.Config) {
	return func(tb testing.TB, c *config.Config) {
		cfg := k8stest.Require(tb)
		cs := k8stest.Clientset(tb, cfg)
		ns := k8stest.Namespace(tb, cs)
		addr := freeAddr(tb, k8stest.NodeIP)
		token := filepath.Join(tb.TempDir(), "token")
		if err := os.WriteFile(token, []byte(k8stest.Name("token")+"\n"), 0o600); err != nil {
			tb.Fatal(err)
		}
		c.Listen, c.APITokenFile = addr, token
		c.Kubernetes.Kubeconfig = kubeconfig()
		c.Kubernetes.ServerURL = "http://" + addr
		c.Kubernetes.PullPolicy = "Never"
		c.AIWorker.Namespace = ns
		c.AIWorker.WorkspacePVC = k8stest.Claim(tb, cs, ns, c.Data)
		c.AIWorker.RuntimeClass = class
		c.AIWorker.ServiceAccount = "" // the namespace's default
		c.AIWorker.AICoderImage = k8stest.BusyboxImage
		// Small requests: at the default 500m the node's two CPUs hold
		// four pods, and the suite's parallel servers, each with its
		// warm pods, had theirs wait for a place ("Insufficient cpu")
		// for most of their time. The limits stay the defaults.
		c.AIWorker.Resources.CPURequest = 10
		c.AIWorker.Resources.MemoryRequest, _ = config.ParseSize("16Mi")
		// Corral's profile for the class, as a deployment that follows
		// docs/kubernetes.md runs it: the runtime's default lets a pod ptrace
		// and use io_uring.
		c.Kubernetes.SeccompProfile = k8stest.SeccompProfile(tb, class)
	}
}

func kubeconfig() string {
	if p := os.Getenv("CORRAL_TEST_KUBECONFIG"); p != "" {
		return p
	}
	return k8stest.Kubeconfig
}

// TestKubernetesTasks: a task on the kubernetes runtime runs as a Job,
// writes its output through the claim and reports over the network; one
// past its timeout ends as a timeout when the Job's deadline passes; a
// cancelled one ends at once; and no Job is left.
func TestKubernetesTasks(t *testing.T) {
	t.Parallel()
	for _, class := range []string{"", k8stest.GVisor} {
		t.Run(className(class), func(t *testing.T) {
			t.Parallel()
			s := MustStart(t, escapeRuntime{edit: onKubernetes(class)}.config(t))
			ctx := context.Background()
			spawn := func(script string, timeout int) string {
				req := service.SpawnRequest{TaskDescription: "on kubernetes", Agent: "command", Runtime: "kubernetes", Command: []string{"sh", "-c", script}}
				if timeout > 0 {
					req.TimeoutMinutes = &timeout
				}
				return mustSpawn(t, s.client, req).ID
			}
			if err := os.WriteFile(filepath.Join(s.data, "shared", "hello.txt"), []byte("hello from shared\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			ok := spawn("id -u > output/id.txt; cat /workspace/shared/hello.txt >> output/id.txt", 0)
			res := s.wait(t, ok, 90*time.Second, "id.txt")
			if got := res.FileContents["id.txt"].Content; res.Status != task.Success || got != "1000\nhello from shared\n" {
				t.Errorf("task: %s %s, id.txt %q", res.Status, res.ErrorMessage, got)
			}
			cancelled := spawn("sleep 600", 0)
			s.waitStatus(t, cancelled, task.Running, 60*time.Second)
			if _, err := s.client.Cancel(ctx, cancelled); err != nil {
				t.Fatal(err)
			}
			if res := s.wait(t, cancelled, 60*time.Second); res.Status != task.Cancelled {
				t.Errorf("cancelled task: %s %s", res.Status, res.ErrorMessage)
			}
		})
	}
}

// TestKubernetesCSVChart: seed 000's use case with the command agent in a
// gVisor worker pod: a Python script totals a bank statement from the
// shared workspace by category and draws a chart into the task's output.
func TestKubernetesCSVChart(t *testing.T) {
	t.Parallel()
	script, err := os.ReadFile("testdata/claude_chart.py")
	if err != nil {
		t.Fatal(err)
	}
	s := MustStart(t, escapeRuntime{edit: func(tb testing.TB, c *config.Config) {
		onKubernetes(k8stest.GVisor)(tb, c)
		k8stest.RequireImage(tb, k8stest.ClaudeImage)
		c.AIWorker.AICoderImage = k8stest.ClaudeImage
	}}.config(t))
	writeTransactions(t, s.data)
	tk := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "Parse my transactions and chart my spending by category",
		Agent: "command", Runtime: "kubernetes", ContextFiles: []string{"data/transactions.csv"}, Command: []string{"python3", "-c", string(script)}})
	s.waitSuccess(t, tk.ID, 90*time.Second)
	checkChart(t, s.data, tk.ID)
}

func className(c string) string {
	if c == "" {
		return "runc"
	}
	return c
}

// TestKubernetesKill9: a server killed with SIGKILL while a task's Job runs
// finds the Job after a restart and records the task's real result; a Job
// of this server's with no task (an orphan) is removed; no Job or pod is
// left.
func TestKubernetesKill9(t *testing.T) {
	t.Parallel()
	k := killableOnKubernetes(t, "")
	cfg, cs, ns, data, claim := k.cfg, k.cs, k.ns, k.data, k.claim
	ctx := context.Background()
	srv := k.start(t)
	tk := mustSpawn(t, srv.client, service.SpawnRequest{TaskDescription: "runs across the restart",
		Command: []string{"sh", "-c", "while [ ! -e /task/go ]; do sleep 0.05; done; echo survived > output/result.txt"}})
	srv.waitRunning(t, tk.ID, 60*time.Second)
	srv.kill()
	jobs := func(selector string) int {
		l, err := cs.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			t.Fatal(err)
		}
		return len(l.Items)
	}
	if n := jobs("corral.task-id=" + tk.ID); n != 1 {
		t.Fatalf("%d Jobs for the task after the server died, want its one", n)
	}
	// An orphan: a Job of this server's (same namespace and data root)
	// that no task owns.
	absData, _ := filepath.Abs(data)
	rt, err := kubernetes.New(kubernetes.Options{Config: cfg, Namespace: ns, DataRoot: absData, Claim: claim, DefaultImage: k8stest.BusyboxImage, PullPolicy: "Never"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	orphan := "task-orphan" + strings.TrimPrefix(k8stest.Name(""), "-")
	if _, err := rt.Create(ctx, sandbox.Spec{ID: orphan, Command: []string{"sleep", "600"}, Labels: map[string]string{sandbox.LabelManaged: "true", sandbox.LabelTaskID: orphan}}); err != nil {
		t.Fatal(err)
	}
	rt.Close()
	// The worker finishes while no server runs.
	if err := os.WriteFile(filepath.Join(data, "tasks", tk.ID, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	srv = k.start(t)
	res, err := srv.client.Result(ctx, service.ResultRequest{TaskID: tk.ID, Wait: 90 * time.Second, IncludeFileContents: []string{"result.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != task.Success || res.FileContents["result.txt"].Content != "survived\n" {
		t.Errorf("after the restart: %s %q (%s), want success with survived", res.Status, res.FileContents["result.txt"].Content, res.ErrorMessage)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if jobs("") == 0 && len(pods.Items) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Jobs and %d pods left in %s, want none (the task's and the orphan's removed)", jobs(""), len(pods.Items), ns)
		}
	}
}

// TestKubernetesDestroyCrashPoints: a server killed with SIGKILL at each
// step of a task's sandbox's Destroy, after the task's end is recorded
// (its Job deleted and held by the runtime's finalizer; its pod gone; its
// directories taken back, the finalizer still there), its sandbox a cold
// Job or a claimed warm pod, then started again: the task keeps its end
// and its output, and the new server's reconciliation finishes the
// Destroy from the Job it finds (and, for a claimed pod, the claim's
// record): no Job, pod or Secret of the task is left, and its files are
// the server's again.
func TestKubernetesDestroyCrashPoints(t *testing.T) {
	t.Parallel()
	for _, warm := range []bool{false, true} {
		for _, point := range []string{sandbox.CrashJobDeleted, sandbox.CrashPodGone, sandbox.CrashReclaimed} {
			name := point
			if warm {
				name = "warm-" + point
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				testKubernetesDestroyCrash(t, point, warm)
			})
		}
	}
}

func testKubernetesDestroyCrash(t *testing.T, point string, warm bool) {
	var k kubeServer
	if warm {
		k = warmOnKubernetes(t, "", 1)
	} else {
		k = killableOnKubernetes(t, "")
	}
	ctx := context.Background()
	srv := k.startCrashing(t, point)
	var warmJob string
	if warm {
		warmJob = k.waitWarmPods(t, srv.proc, 1)[0]
	}
	tk := mustSpawn(t, srv.client, service.SpawnRequest{TaskDescription: "destroy cut at " + point,
		Command: []string{"sh", "-c", "echo done > output/out.txt"}})
	srv.waitKilled(t, point)
	byTask := metav1.ListOptions{LabelSelector: sandbox.LabelTaskID + "=" + tk.ID}
	jobs, err := k.cs.BatchV1().Jobs(k.ns).List(ctx, byTask)
	if err != nil {
		t.Fatal(err)
	}
	// What the next server has to go on: the Job, being deleted.
	if len(jobs.Items) != 1 || jobs.Items[0].DeletionTimestamp == nil {
		t.Fatalf("the task's Jobs after a kill at %s: %+v, want its one, being deleted", point, jobs.Items)
	}
	job := jobs.Items[0].Name
	if warm && job != warmJob {
		t.Fatalf("the task ran in Job %s, not the warm pod's %s", job, warmJob)
	}

	next := k.start(t)
	res, err := next.client.Result(ctx, service.ResultRequest{TaskID: tk.ID, Wait: time.Minute, IncludeFileContents: []string{"out.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != task.Success || res.FileContents["out.txt"].Content != "done\n" {
		t.Errorf("after the restart: %s %q (%s), want success with done", res.Status, res.FileContents["out.txt"].Content, res.ErrorMessage)
	}
	// A claimed warm pod keeps the labels it was made with: its pods are
	// found by their Job's name.
	byJob := metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job}
	left := ""
	waitFor(t, "the task's Job, pods and Secrets gone", func() bool {
		_, jerr := k.cs.BatchV1().Jobs(k.ns).Get(ctx, job, metav1.GetOptions{})
		if jerr != nil && !apierrors.IsNotFound(jerr) {
			t.Fatal(jerr)
		}
		pods, perr := k.cs.CoreV1().Pods(k.ns).List(ctx, byJob)
		secrets, serr := k.cs.CoreV1().Secrets(k.ns).List(ctx, byTask)
		if err := errors.Join(perr, serr); err != nil {
			t.Fatal(err)
		}
		if now := fmt.Sprintf("the Job %s (%v), %d pods and %d Secrets of the task left", job, jerr, len(pods.Items), len(secrets.Items)); now != left {
			left = now
			t.Log(left)
		}
		return apierrors.IsNotFound(jerr) && len(pods.Items)+len(secrets.Items) == 0
	})
	// The Job goes only once its directories are taken back.
	if theirs := notOurs(filepath.Join(k.data, "tasks", tk.ID)); len(theirs) > 0 {
		t.Errorf("the task's files not taken back from the pod's identity: %v", theirs)
	}
}

// kubeServer is what a test needs to run `corral serve` as a process of
// its own on the test cluster, to kill it with SIGKILL and start it again
// on the same data root.
type kubeServer struct {
	cfg                                   *rest.Config
	cs                                    k8sclient.Interface
	ns, data, claim, addr, token, cfgFile string
}

// killableOnKubernetes makes a namespace, a claim over a fresh data root
// and a configuration file whose runtime is kubernetes under RuntimeClass
// class ("" for the node's runc, with the runtime's default seccomp
// profile; else Corral's), with the server listening on the node's bridge
// address, where pods reach it.
func killableOnKubernetes(t *testing.T, class string) kubeServer {
	t.Helper()
	k := kubeServer{cfg: k8stest.Require(t)}
	k.cs = k8stest.Clientset(t, k.cfg)
	// The data root first: its removal, a cleanup, then comes after the
	// namespace's, which waits for the pods to be gone. A gVisor pod
	// still stopping wrote into the data root as it was removed
	// (TestKubernetesWarm/gvisor, 2026-12-02: "directory not empty").
	k.data = testenv.TempDir(t)
	k.ns = k8stest.Namespace(t, k.cs)
	k.claim = k8stest.Claim(t, k.cs, k.ns, k.data)
	k.addr = freeAddr(t, k8stest.NodeIP)
	k.token = k8stest.Name("token")
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	k.cfgFile = filepath.Join(dir, "corral.yaml")
	profile := ""
	if class != "" {
		profile = k8stest.SeccompProfile(t, class)
	}
	// Small requests, as onKubernetes's: the crash tests' servers run in
	// parallel, each with its pods.
	yaml := fmt.Sprintf(`api_token_file: %s
runtime: kubernetes
kubernetes:
  kubeconfig: %s
  server_url: http://%s
  pull_policy: Never
  seccomp_profile: %q
ai_worker_config:
  namespace: %s
  workspace_pvc: %s
  runtime_class: %q
  service_account: ""
  ai_coder_image: %s
  resources:
    cpu_request: 10m
    memory_request: 16Mi
`, tokenFile, kubeconfig(), k.addr, profile, k.ns, k.claim, class, k8stest.BusyboxImage)
	if err := os.WriteFile(tokenFile, []byte(k.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(k.cfgFile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return k
}

// start starts `corral serve` on k.
func (k kubeServer) start(t *testing.T) *proc {
	t.Helper()
	return startProcessAt(t, k.data, k.addr, k.token, "--config", k.cfgFile)
}

// BenchmarkKubernetesTask measures, in one run and interleaved, a trivial
// task (echo hi) on the kubernetes runtime from POST /api/tasks to its
// result, beside a bare Job of the same image and command from its
// creation to its container's end (and to the Job's Complete, which comes
// later), as a client of the API would see them; both under runc on the
// test node. It reports the medians and the ratio of the first two.
func BenchmarkKubernetesTask(b *testing.B) {
	var ns string
	s := startServer(b, nil, nil, func(c *config.Config) { onKubernetes("")(b, c); ns = c.AIWorker.Namespace })
	cs := k8stest.Clientset(b, k8stest.Require(b))
	ctx := context.Background()
	var corral, bare, complete []float64
	for i := 0; i < b.N; i++ {
		start := time.Now()
		tk := mustSpawn(b, s.client, service.SpawnRequest{TaskDescription: "echo", Agent: "command", Runtime: "kubernetes", Command: []string{"echo", "hi"}})
		res, err := s.client.Result(ctx, service.ResultRequest{TaskID: tk.ID, Wait: 2 * time.Minute})
		if err != nil || res.Status != task.Success {
			b.Fatalf("task: %v %s %s", err, res.Status, res.ErrorMessage)
		}
		corral = append(corral, float64(time.Since(start).Microseconds())/1000)

		start = time.Now()
		name := k8stest.Name("bare")
		if _, err := cs.BatchV1().Jobs(ns).Create(ctx, bareJob(name), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		// The earliest a client of the API can know echo ended: its
		// container's terminated state; then the Job's Complete.
		pods, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "job-name=" + name})
		if err != nil {
			b.Fatal(err)
		}
		for ev := range pods.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && slices.ContainsFunc(p.Status.ContainerStatuses, func(c corev1.ContainerStatus) bool { return c.State.Terminated != nil }) {
				break
			}
		}
		pods.Stop()
		bare = append(bare, float64(time.Since(start).Microseconds())/1000)
		jobs, err := cs.BatchV1().Jobs(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
		if err != nil {
			b.Fatal(err)
		}
		for ev := range jobs.ResultChan() {
			if j, ok := ev.Object.(*batchv1.Job); ok && slices.ContainsFunc(j.Status.Conditions, func(c batchv1.JobCondition) bool {
				return c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue
			}) {
				break
			}
		}
		jobs.Stop()
		complete = append(complete, float64(time.Since(start).Microseconds())/1000)
		background := metav1.DeletePropagationBackground
		cs.BatchV1().Jobs(ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &background})
	}
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	c, m := median(corral), median(bare)
	b.ReportMetric(c, "corral-ms")
	b.ReportMetric(m, "bare-job-ended-ms")
	b.ReportMetric(median(complete), "bare-job-complete-ms")
	b.ReportMetric(c/m, "ratio")
}

// bareJob is a Job of the test image running echo hi, as a person would
// write one: the same security context Corral's pods have, no volumes.
func bareJob(name string) *batchv1.Job {
	uid := int64(1000)
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			BackoffLimit: new(int32(0)),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy:   corev1.RestartPolicyNever,
				SecurityContext: &corev1.PodSecurityContext{RunAsUser: &uid, RunAsGroup: &uid, RunAsNonRoot: new(true)},
				Containers: []corev1.Container{{
					Name: "bare", Image: k8stest.BusyboxImage, ImagePullPolicy: corev1.PullNever, Command: []string{"echo", "hi"},
					SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: new(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
				}},
			}},
		},
	}
}
