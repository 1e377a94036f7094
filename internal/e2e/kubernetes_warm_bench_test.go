//go:build integration

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes/k8stest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// BenchmarkKubernetesWarm measures, interleaved in one run on the test
// node under runc, a trivial task (its command creates a file, then
// echoes hi) from POST /api/tasks to its command running (the file's
// mtime) and to its result, on a server with warm pods (each task claims
// one) and on one without (cold), beside a bare Job of the same image
// running the same command (to its command running, the mtime of the same
// file on a hostPath volume, and to its container's end as a watch sees
// it). Pods request little CPU and memory (10m, 16 MiB). Then it spawns as many tasks at once as the warm pool holds and
// reports the claims per second: the tasks over the time from the first
// spawn to the last task's start. It prints p50 and p99 of each; run it
// with -benchtime=1x, CORRAL_BENCH_N tasks of each kind (default 20), and
// CORRAL_BENCH_RUNTIME_CLASS=gvisor for every pod, the bare Job's too,
// under gVisor.
func BenchmarkKubernetesWarm(b *testing.B) {
	n := 20
	if v, err := strconv.Atoi(os.Getenv("CORRAL_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	const pool = 16
	class := os.Getenv("CORRAL_BENCH_RUNTIME_CLASS")
	// onKubernetes's small requests (the bare Job has none).
	on := func(c *config.Config) {
		onKubernetes(class)(b, c)
		// The burst's tasks all at once, not three at a time. A task
		// holds its slot until its sandbox is gone, and a pod takes
		// seconds to end: with pool slots, the last sequential tasks'
		// pods still ending left the burst fewer, and its last task
		// waited in the queue for one (not for a claim).
		c.AIWorker.MaxConcurrentWorkers = 2 * pool
	}
	var ns string
	warm := startServer(b, nil, nil, func(c *config.Config) {
		on(c)
		c.Kubernetes.WarmPool, c.Kubernetes.WarmIdle, ns = pool, 0, c.AIWorker.Namespace
	})
	cold := startServer(b, nil, nil, on)
	cs := k8stest.Clientset(b, k8stest.Require(b))
	ctx := context.Background()
	// The bare Jobs' volume: a directory of the node (this machine).
	bareDir := b.TempDir()
	if err := os.Chmod(bareDir, 0o777); err != nil {
		b.Fatal(err)
	}
	ready := func() int {
		for _, st := range warm.app.WarmStats() {
			if st.Runtime == "kubernetes" && st.Shape == "none" {
				return st.Ready
			}
		}
		return 0
	}
	waitReady := func() {
		for deadline := time.Now().Add(3 * time.Minute); ready() < pool; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d warm pods ready after 3 minutes", ready(), pool)
			}
		}
	}
	const script = ": > output/ran; echo hi"
	corral := func(s *server) (running, result time.Duration) {
		start := time.Now()
		tk := mustSpawn(b, s.client, service.SpawnRequest{TaskDescription: "echo", Agent: "command", Runtime: "kubernetes", Command: []string{"sh", "-c", script}})
		res, err := s.client.Result(ctx, service.ResultRequest{TaskID: tk.ID, Wait: 2 * time.Minute})
		result = time.Since(start)
		if err != nil || res.Status != task.Success {
			b.Fatalf("task: %v %s %s", err, res.Status, res.ErrorMessage)
		}
		fi, err := os.Stat(filepath.Join(s.data, "tasks", tk.ID, "output", "ran"))
		if err != nil {
			b.Fatal(err)
		}
		return fi.ModTime().Sub(start), result
	}
	bare := func(i int) (running, result time.Duration) {
		name := k8stest.Name("bare")
		job := bareJob(name)
		spec := &job.Spec.Template.Spec
		if class != "" {
			spec.RuntimeClassName = &class
		}
		spec.Volumes = []corev1.Volume{{Name: "out", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: bareDir}}}}
		spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "out", MountPath: "/output"}}
		spec.Containers[0].WorkingDir = "/"
		ran := fmt.Sprintf("ran-%d", i)
		spec.Containers[0].Command = []string{"sh", "-c", ": > output/" + ran + "; echo hi"}
		start := time.Now()
		pods, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "job-name=" + name})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := cs.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		for ev := range pods.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && slices.ContainsFunc(p.Status.ContainerStatuses, func(c corev1.ContainerStatus) bool { return c.State.Terminated != nil }) {
				break
			}
		}
		pods.Stop()
		result = time.Since(start)
		background := metav1.DeletePropagationBackground
		cs.BatchV1().Jobs(ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &background})
		fi, err := os.Stat(filepath.Join(bareDir, ran))
		if err != nil {
			b.Fatal(err)
		}
		return fi.ModTime().Sub(start), result
	}
	var wRun, wRes, cRun, cRes, bRun, bRes []time.Duration
	b.ResetTimer()
	for range b.N {
		for i := range n {
			waitReady()
			r, e := corral(warm)
			wRun, wRes = append(wRun, r), append(wRes, e)
			r, e = corral(cold)
			cRun, cRes = append(cRun, r), append(cRes, e)
			r, e = bare(i)
			bRun, bRes = append(bRun, r), append(bRes, e)
		}
	}
	// The burst: the whole pool claimed at once.
	waitReady()
	var claims0 uint64
	for _, st := range warm.app.WarmStats() {
		if st.Runtime == "kubernetes" {
			claims0 += st.Claims
		}
	}
	ids := make([]string, pool)
	commits0 := warm.app.Commits().Commits
	var wg sync.WaitGroup
	for i := range pool {
		wg.Go(func() {
			ids[i] = mustSpawn(b, warm.client, service.SpawnRequest{TaskDescription: "burst", Agent: "command", Runtime: "kubernetes", Command: []string{"true"}}).ID
		})
	}
	wg.Wait()
	var first, last time.Time
	var spans []time.Duration // each task's, from its creation to its start
	for _, id := range ids {
		for {
			tk, err := warm.client.Get(ctx, id)
			if err != nil {
				b.Fatal(err)
			}
			if tk.StartedAt != nil {
				if first.IsZero() || tk.CreatedAt.Before(first) {
					first = tk.CreatedAt
				}
				if tk.StartedAt.After(last) {
					last = *tk.StartedAt
				}
				spans = append(spans, tk.StartedAt.Sub(tk.CreatedAt))
				break
			}
			time.Sleep(50 * time.Millisecond) // within the API's rate limit
		}
	}
	var claims uint64
	for _, st := range warm.app.WarmStats() {
		if st.Runtime == "kubernetes" {
			claims += st.Claims
		}
	}
	if claims-claims0 != pool {
		b.Errorf("the burst's %d tasks made %d claims", pool, claims-claims0)
	}
	rate := float64(pool) / last.Sub(first).Seconds()

	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	pct := func(v []time.Duration, p float64) float64 {
		v = slices.Clone(v)
		slices.Sort(v)
		return ms(v[min(len(v)-1, int(p*float64(len(v))))])
	}
	for _, m := range []struct {
		name string
		v    []time.Duration
	}{{"warm-running", wRun}, {"warm-result", wRes}, {"cold-running", cRun}, {"cold-result", cRes}, {"bare-running", bRun}, {"bare-result", bRes}} {
		b.ReportMetric(pct(m.v, 0.5), m.name+"-p50-ms")
		b.ReportMetric(pct(m.v, 0.99), m.name+"-p99-ms")
	}
	b.ReportMetric(pct(wRes, 0.5)/pct(bRes, 0.5), "warm/bare-result")
	b.ReportMetric(pct(cRes, 0.5)/pct(bRes, 0.5), "cold/bare-result")
	b.ReportMetric(rate, "claims/s")
	b.Logf("%d tasks of each kind; the burst: %d claims in %s; each task from its creation to its start: p50 %.0f ms, max %.0f ms; %d commits of the event store from the first spawn to the last start read",
		n, pool, last.Sub(first), pct(spans, 0.5), pct(spans, 1), warm.app.Commits().Commits-commits0)
}
