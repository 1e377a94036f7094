//go:build integration

package e2e_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// startCrashing is k.start with CORRAL_TEST_CRASH_AT=point: the server
// kills itself with SIGKILL the first time a task reaches point.
func (k kubeServer) startCrashing(t *testing.T, point string) *crashing {
	t.Helper()
	cmd := serveCommand(t, k.data, k.addr, "--config", k.cfgFile)
	cmd.Env = append(cmd.Env, "CORRAL_TEST_CRASH_AT="+point)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &crashing{proc: &proc{cmd: cmd, client: httpapi.NewClient("http://"+k.addr, k.token), url: "http://" + k.addr}, exited: make(chan struct{})}
	go func() { c.err = cmd.Wait(); close(c.exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL)
		<-c.exited
	})
	waitHealthy(t, c.url)
	return c
}

// strictPod checks that pod, a worker pod, is as strict as a cold Job's:
// the label the NetworkPolicies select, no service account token, pid 1
// not the worker's, and a worker that is not root, holds no capability,
// cannot gain privileges and cannot write its root file system.
func strictPod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	s := pod.Spec
	if pod.Labels["app"] != "corral-worker" {
		t.Errorf("pod %s: labels %v, want app=corral-worker (the NetworkPolicies' selector)", pod.Name, pod.Labels)
	}
	sc := s.SecurityContext
	if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken || sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
		sc.RunAsUser == nil || *sc.RunAsUser != 65535 || sc.SeccompProfile == nil {
		t.Errorf("pod %s: pod security %+v, token %v", pod.Name, sc, s.AutomountServiceAccountToken)
	}
	c := s.Containers[0].SecurityContext
	if c == nil || c.RunAsUser == nil || *c.RunAsUser != 1000 || c.AllowPrivilegeEscalation == nil || *c.AllowPrivilegeEscalation ||
		c.Privileged == nil || *c.Privileged || c.ReadOnlyRootFilesystem == nil || !*c.ReadOnlyRootFilesystem ||
		c.Capabilities == nil || !slices.Equal(c.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(c.Capabilities.Add) > 0 {
		t.Errorf("pod %s: container security %+v", pod.Name, c)
	}
}

// TestKubernetesWarmCrashPoints: a server killed with SIGKILL at each
// step of a claim of a warm pod (taken; the task's entries moved into the
// pod's slot; its directories given to the pod's identity and the binding
// recorded; the start taken by the pod's poll, its answer not written;
// the answer written; the Job patched as the task's), then started again:
// the task is not lost and not stuck. Where the start never left, the
// pod is destroyed and the task starts again (task_start_retried) and
// runs once; where it may have, the pod is the task's and the task ends
// with its own result, run once: where the answer went out, its pod had
// it whole; where the poll had taken the start but its answer was never
// written, the pod's worker asks again and the new server answers the
// same start from the claim's record.
// The task's files are in its directory, owned by the server again; the
// claimed warm Job goes with the task, and no warm Job of the dead server
// is left; the claimed pod keeps a cold pod's labels and security.
func TestKubernetesWarmCrashPoints(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		point   string
		retried bool // the task starts again
	}{
		{sandbox.CrashClaimed, true},
		{sandbox.CrashMoved, true},
		{sandbox.CrashHandedOver, true},
		{sandbox.CrashSent, false},
		{sandbox.CrashAnswered, false},
		{sandbox.CrashRelabelled, false},
	} {
		t.Run(tt.point, func(t *testing.T) {
			t.Parallel()
			testKubernetesWarmCrash(t, tt.point, tt.retried)
		})
	}
}

func testKubernetesWarmCrash(t *testing.T, point string, retried bool) {
	k := warmOnKubernetes(t, "", 1)
	ctx := context.Background()
	srv := k.startCrashing(t, point)
	warm := k.waitWarmPods(t, srv.proc, 1)[0]
	pods, err := k.cs.CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + warm})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the warm pod of %s: %v %v", warm, pods, err)
	}
	strictPod(t, &pods.Items[0])

	tk, _, spawnErr := srv.client.Spawn(ctx, service.SpawnRequest{TaskDescription: "claim cut at " + point, Runtime: "kubernetes",
		Command: []string{"sh", "-c", "echo run >> output/runs.txt; cat prompt.md > output/prompt.txt"}})
	srv.waitKilled(t, point)

	next := k.start(t)
	id := tk.ID
	if spawnErr != nil {
		// Killed before the spawn's answer: the task is there all the
		// same.
		l, err := next.client.List(ctx, service.ListRequest{Limit: 10})
		if err != nil || len(l.Tasks) != 1 {
			t.Fatalf("tasks after the restart: %+v %v, want the one spawned", l, err)
		}
		id = l.Tasks[0].ID
	}
	res, err := next.client.Result(ctx, service.ResultRequest{TaskID: id, Wait: 2 * time.Minute, IncludeFileContents: []string{"runs.txt", "prompt.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	next.client.Events(ctx, service.EventsRequest{TaskID: id}, func(e eventstore.Event) error {
		types = append(types, e.Type)
		return nil
	})
	again := slices.Contains(types, task.EventStartRetried)
	runs := res.FileContents["runs.txt"].Content
	switch {
	case !res.Status.Terminal():
		t.Fatalf("the task is still %s after the restart (events %v)", res.Status, types)
	case res.Status != task.Success || runs != "run\n" || again != retried:
		t.Errorf("the task: %s (%s), runs.txt %q, events %v; want success, one run, started again %v", res.Status, res.ErrorMessage, runs, types, retried)
	case res.FileContents["prompt.txt"].Content == "":
		t.Errorf("the task's command did not find its prompt.md in its directory")
	}

	// The task's files are in its directory, and the server's again.
	dir := filepath.Join(k.data, "tasks", id)
	if _, err := os.Stat(filepath.Join(dir, "prompt.md")); err != nil {
		t.Errorf("the task's prompt.md after the restart: %v", err)
	}
	// Destroy takes the directories back after the task's end is
	// recorded: wait for the claimed Job to go first.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err := k.cs.BatchV1().Jobs(k.ns).Get(ctx, warm, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the warm Job %s of the dead server's claim is still there after its task: %v", warm, err)
		}
	}
	theirs := notOurs(dir)
	for deadline := time.Now().Add(10 * time.Second); len(theirs) > 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		theirs = notOurs(dir)
	}
	if len(theirs) > 0 {
		t.Errorf("the task's files not taken back from the pod's identity: %v", theirs)
	}
	// The dead server's warm pods and their slots are gone; the new one's
	// pool has pods of its own.
	old := strings.Join(strings.SplitN(warm, "-", 3)[:2], "-") + "-"
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		jobs := k.warmJobs(t)
		if !slices.ContainsFunc(jobs, func(j string) bool { return strings.HasPrefix(j, old) }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("warm Jobs of the dead server left: %v", jobs)
		}
	}
	k.waitSlotsGone(t, old)
	// The claimed pod, where the task ran in it, stayed a worker pod as
	// strict as a cold one (its pod template is its creation's).
	if l, err := k.cs.CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{}); err == nil {
		for i := range l.Items {
			strictPod(t, &l.Items[i])
		}
	}
}

// notOurs lists what in dir this process's user does not own.
func notOurs(dir string) []string {
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if fi, ierr := d.Info(); err == nil && ierr == nil && fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid()) {
			out = append(out, p)
		}
		return nil
	})
	return out
}
