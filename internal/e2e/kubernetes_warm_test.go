//go:build integration

package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/corral-dev/corral/internal/sandbox/kubernetes/k8stest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// warmOnKubernetes is killableOnKubernetes with pool warm pods of each
// shape, kept however idle.
func warmOnKubernetes(t *testing.T, class string, pool int) kubeServer {
	t.Helper()
	k := killableOnKubernetes(t, class)
	b, err := os.ReadFile(k.cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	yaml := strings.Replace(string(b), "kubernetes:\n", fmt.Sprintf("kubernetes:\n  warm_pool: %d\n  warm_idle: 0s\n", pool), 1)
	if err := os.WriteFile(k.cfgFile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return k
}

// waitSlotsGone waits until no warm pod's slot whose name starts with
// prefix is left: those of a server gone go once their pods have.
func (k kubeServer) waitSlotsGone(t *testing.T, prefix string) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ents, _ := os.ReadDir(filepath.Join(k.data, "run", "kubernetes", "warm"))
		if !slices.ContainsFunc(ents, func(e os.DirEntry) bool { return strings.HasPrefix(e.Name(), prefix) }) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("slots of warm pods of a server gone are left: %v, of %s*", ents, prefix)
		}
	}
}

// warmJobs are the namespace's warm pods' Jobs not claimed, by name.
func (k kubeServer) warmJobs(t *testing.T) []string {
	t.Helper()
	l, err := k.cs.BatchV1().Jobs(k.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "corral.dev/warm=true"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, j := range l.Items {
		if j.DeletionTimestamp == nil {
			names = append(names, j.Name)
		}
	}
	slices.Sort(names)
	return names
}

// jobOf is the name of task id's Job ("" for none).
func (k kubeServer) jobOf(t *testing.T, id string) string {
	t.Helper()
	l, err := k.cs.BatchV1().Jobs(k.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "corral.task-id=" + id})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 1 {
		return ""
	}
	return l.Items[0].Name
}

// waitJobOf waits until task id's Job, by its labels, is the warm pod's
// job: the claim patches it while the task starts.
func (k kubeServer) waitJobOf(t *testing.T, id, job string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		got := k.jobOf(t, id)
		if got == job {
			return
		}
		if got != "" || time.Now().After(deadline) {
			t.Fatalf("the task runs in Job %q, want the warm pod's %s", got, job)
		}
	}
}

// warmReady reports how many warm pods of the kubernetes runtime wait
// for a task, as srv's /metrics says.
func (k kubeServer) warmReady(t *testing.T, srv *proc) int {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+k.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, `corral_warm_sandboxes{runtime="kubernetes",shape="none"} `); ok {
			fmt.Sscan(v, &n)
		}
	}
	return n
}

// waitWarmPods waits until srv has n warm pods ready and returns their
// Jobs.
func (k kubeServer) waitWarmPods(t *testing.T, srv *proc, n int) []string {
	t.Helper()
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if k.warmReady(t, srv) == n {
			if jobs := k.warmJobs(t); len(jobs) == n {
				return jobs
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %d warm pods ready within 90s: %d ready, Jobs %v", n, k.warmReady(t, srv), k.warmJobs(t))
		}
	}
}

// TestKubernetesWarm: a task on kubernetes claims a warm pod, made before
// it, whose Job becomes the task's (its labels, its deadline from the
// task's timeout) and which runs the task with the right output under the
// pod's identity; the pod is gone after the task and the next task gets
// another; a server killed and started again destroys the warm pods the
// first one made and makes new ones, which take tasks. Under runc and
// gVisor.
func TestKubernetesWarm(t *testing.T) {
	t.Parallel()
	for _, class := range []string{"", k8stest.GVisor} {
		t.Run(className(class), func(t *testing.T) {
			t.Parallel()
			testKubernetesWarm(t, class)
		})
	}
}

func testKubernetesWarm(t *testing.T, class string) {
	k := warmOnKubernetes(t, class, 1)
	ctx := context.Background()
	srv := k.start(t)
	if err := os.WriteFile(filepath.Join(k.data, "shared", "hello.txt"), []byte("hello from shared\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	first := k.waitWarmPods(t, srv, 1)[0]
	timeout := 5
	tk := mustSpawn(t, srv.client, service.SpawnRequest{TaskDescription: "warm", Runtime: "kubernetes", TimeoutMinutes: &timeout,
		Command: []string{"sh", "-c", "while [ ! -e /task/go ]; do sleep 0.05; done; id -u > output/id.txt; cat /workspace/shared/hello.txt >> output/id.txt; env > output/env.txt"}})
	srv.waitRunning(t, tk.ID, 60*time.Second)
	// The Job's patch lands while the task starts.
	k.waitJobOf(t, tk.ID, first)
	job, err := k.cs.BatchV1().Jobs(k.ns).Get(ctx, first, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d := job.Spec.ActiveDeadlineSeconds; d == nil || *d < 300 || *d > 300+int64(time.Since(job.CreationTimestamp.Time)/time.Second)+2 {
		t.Errorf("the claimed Job's activeDeadlineSeconds is %v, want the pod's age plus the task's 300 s", d)
	}
	if job.Labels["corral.dev/warm"] != "" {
		t.Errorf("the claimed Job is still labelled warm: %v", job.Labels)
	}
	// It now holds the task's directories: until they are taken back,
	// it stays (kubernetes.TestJobDeletedElsewhere).
	if !slices.Contains(job.Finalizers, "corral.dev/reclaim") {
		t.Errorf("the claimed Job's finalizers are %v, want corral.dev/reclaim", job.Finalizers)
	}
	if err := os.WriteFile(filepath.Join(k.data, "tasks", tk.ID, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := srv.client.Result(ctx, service.ResultRequest{TaskID: tk.ID, Wait: 90 * time.Second, IncludeFileContents: []string{"id.txt", "env.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.FileContents["id.txt"].Content; res.Status != task.Success || got != "1000\nhello from shared\n" {
		t.Fatalf("the warm task: %s %s, id.txt %q", res.Status, res.ErrorMessage, got)
	}
	if env := res.FileContents["env.txt"].Content; strings.Contains(env, "CORRAL_WARM") {
		t.Errorf("the task's environment holds the warm pod's variables:\n%s", env)
	}

	// The pod served its one task: its Job goes, and the next task gets
	// the pod made after the claim.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := k.cs.BatchV1().Jobs(k.ns).Get(ctx, first, metav1.GetOptions{}); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the claimed warm pod's Job %s is still there after its task", first)
		}
	}
	second := k.waitWarmPods(t, srv, 1)[0]
	if second == first {
		t.Fatalf("the pool offers %s again", first)
	}
	tk2 := mustSpawn(t, srv.client, service.SpawnRequest{TaskDescription: "warm again", Runtime: "kubernetes",
		Command: []string{"sh", "-c", "while [ ! -e /task/go ]; do sleep 0.05; done; echo two > output/two.txt"}})
	srv.waitRunning(t, tk2.ID, 60*time.Second)
	k.waitJobOf(t, tk2.ID, second)
	os.WriteFile(filepath.Join(k.data, "tasks", tk2.ID, "go"), nil, 0o644)
	if res, err := srv.client.Result(ctx, service.ResultRequest{TaskID: tk2.ID, Wait: 90 * time.Second, IncludeFileContents: []string{"two.txt"}}); err != nil || res.FileContents["two.txt"].Content != "two\n" {
		t.Fatalf("the second warm task: %v %s %s", err, res.Status, res.ErrorMessage)
	}

	// A restart destroys the warm pods left, and builds anew.
	left := k.waitWarmPods(t, srv, 1)[0]
	srv.kill()
	srv = k.start(t)
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if jobs := k.warmJobs(t); len(jobs) == 1 && jobs[0] != left && k.warmReady(t, srv) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the restart the warm Jobs are %v, want one new one instead of %s", k.warmJobs(t), left)
		}
	}
	tk3 := mustSpawn(t, srv.client, service.SpawnRequest{TaskDescription: "after the restart", Runtime: "kubernetes", Command: []string{"sh", "-c", "echo three > output/three.txt"}})
	res, err = srv.client.Result(ctx, service.ResultRequest{TaskID: tk3.ID, Wait: 90 * time.Second, IncludeFileContents: []string{"three.txt"}})
	if err != nil || res.Status != task.Success || res.FileContents["three.txt"].Content != "three\n" {
		t.Fatalf("the task after the restart: %v %s %s", err, res.Status, res.ErrorMessage)
	}
	k.waitSlotsGone(t, left)
}
