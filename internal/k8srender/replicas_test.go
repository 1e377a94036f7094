//go:build integration

package k8srender

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/postgres/postgrestest"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes/k8stest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// podNetwork is the test node's pod addresses (scripts/k8s/lib.sh): the
// servers reach PostgreSQL from there.
const podNetwork = "10.88.0.0/24"

// TestRenderedReplicasOnTheNode runs the rendered manifests' server on the
// test node, as rendered but for what the node lacks: two replicas of
// `corral serve`, in an image built from this checkout, on one PostgreSQL
// database. A task spawned through each replica runs as a Job and ends
// with its output, alike seen from either replica, its egress through
// either replica. A replica lost while its task runs, crashed or drained,
// leaves the task to the other, which reattaches to its Job and ends it
// once, on the worker's report; the Deployment replaces the crashed one.
//
// The node has no DNS and no kube-proxy (scripts/k8s/README.md), so the
// servers reach the API server at the node's address, and the test plays
// kube-proxy for the Service (proxyService): worker pods reach the servers
// at the node's address. So the NetworkPolicies, which hold workers to
// the server pods, are not applied here: TestNetworkPoliciesHold tests
// them.
func TestRenderedReplicasOnTheNode(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	began := time.Now()
	image := serverImage(t)
	t.Logf("server image %s built and imported in %.1f s", image, time.Since(began).Seconds())
	ns := k8stest.Namespace(t, c.cs)
	pg := postgrestest.NewNetworkServer(t, k8stest.NodeIP, podNetwork)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r := &rig{cluster: c, ns: ns, token: k8stest.Name("token"), data: testenv.TempDir(t), web: newWebServer(t), followed: map[string]bool{}}
	r.jobs = c.watchJobs(ctx, t, ns)
	svc := c.proxyService(ctx, t, ns, Server, "http", "egress")

	// The workers' requests stay small: other tests share the node's two
	// cores. Their egress may reach the test's web server alone.
	cfg := load(t, fmt.Sprintf(`store: {driver: postgres}
ai_worker_config:
  namespace: %s
  ai_coder_image: %s
  runtime_class: ""
  resources: {cpu_request: 100m, memory_request: 64Mi}
kubernetes:
  pull_policy: Never
egress: {mode: allowlist, allow: [%q]}
`, ns, k8stest.BusyboxImage, r.web.addr), "CORRAL_STORE_DSN="+pg.NetworkDSN)
	// The server's image needs no imagePullPolicy: the rendered one,
	// IfNotPresent for a tag other than latest, finds it on the node.
	stream, err := Render(cfg, Options{ServerImage: image, Replicas: 2, Storage: "1Gi"})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range decode(t, stream) {
		switch u.GetKind() {
		case "NetworkPolicy":
			continue // see above
		case "Secret":
			if u.GetName() == Server {
				set(t, u, map[string]any{TokenKey: r.token, WebhookKey: k8stest.Name("webhook"), StoreDSNKey: pg.NetworkDSN}, "stringData")
			}
		case "ConfigMap":
			// Workers reach the Service where the test's stand-in for
			// kube-proxy listens.
			file := filepath.Base(ConfigFile)
			set(t, u, serverURLs(t, nested[string](t, u, "data", file), svc["http"], svc["egress"]), "data", file)
		case "PersistentVolumeClaim":
			// The node's stand-in for a ReadWriteMany class: a volume
			// over a host directory, bound to the rendered claim.
			set(t, u, k8stest.Volume(t, c.cs, ns, u.GetName(), r.data), "spec", "volumeName")
			set(t, u, "", "spec", "storageClassName")
		case "Deployment":
			// The in-cluster client's address of the API server is the
			// kubernetes Service's, which does not route here: the
			// apiserver's own address instead (its certificate names it,
			// and the ServiceAccount's ca.crt verifies it).
			d := typed[appsv1.Deployment](t, u)
			ct := &d.Spec.Template.Spec.Containers[0]
			ct.Env = append(ct.Env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: k8stest.NodeIP}, corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: "6443"})
			u = untyped(t, d)
		}
		if err := c.apply(t, u, false); err != nil {
			t.Fatalf("apply %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	reps := r.waitReplicas(ctx, t, "")
	t.Logf("2 replicas ready %.1f s after the start: %v", time.Since(began).Seconds(), reps)

	// A task through each replica; each ends with its output, seen from
	// the other replica as from its own. Its two requests out, one after
	// the other, reach the two replicas through the Service: either one's
	// egress proxy serves the task, whichever runs it. One task at a time,
	// so that the other's requests come not between.
	ips := []string{reps[0].ip, reps[1].ip}
	slices.Sort(ips)
	for i, rep := range reps {
		get := func(n int) string {
			return fmt.Sprintf("wget -q -O output/%d.txt http://%s/%s/%d", n, r.web.addr, rep.id, n)
		}
		tk, _, err := rep.client.Spawn(ctx, service.SpawnRequest{TaskDescription: "spawned through " + rep.pod, Agent: "command", Network: task.NetworkAllowlist,
			Command: []string{"sh", "-c", get(1) + " && " + get(2) + " && cat output/1.txt output/2.txt > output/result.txt && echo printed through " + rep.id}})
		if err != nil {
			t.Fatalf("spawn through %s: %v", rep, err)
		}
		for _, from := range []replica{reps[1-i], rep} {
			res := from.result(ctx, t, tk.ID)
			if got, want := res.FileContents["result.txt"].Content, fmt.Sprintf("served /%[1]s/1served /%[1]s/2", rep.id); res.Status != task.Success || got != want {
				t.Errorf("task %s spawned through %s, from %s: %s %q (%s), want success with %q", tk.ID, rep, from, res.Status, got, res.ErrorMessage, want)
			}
		}
		proxies := append(r.web.servedTo("/"+rep.id+"/1"), r.web.servedTo("/"+rep.id+"/2")...)
		if slices.Sort(proxies); !slices.Equal(proxies, ips) {
			t.Errorf("task %s's requests came through the proxies at %v, want one through each replica's (%v)", tk.ID, proxies, ips)
		}
		var logs strings.Builder
		if err := reps[1-i].client.Logs(ctx, service.LogsRequest{TaskID: tk.ID}, &logs); err != nil || logs.String() != "printed through "+rep.id+"\n" {
			t.Errorf("task %s's transcript: %q, %v", tk.ID, logs.String(), err)
		}
		if n := r.jobs.made(tk.ID); n != 1 {
			t.Errorf("task %s ran in %d Jobs, want 1", tk.ID, n)
		}
		checkEnd(t, reps[1-i].events(ctx, t, tk.ID), tk.ID)
	}

	// A replica crashes while its task runs. The kubelet gives even a pod
	// deleted with grace period 0 a SIGTERM and 2 s before SIGKILL, and a
	// server that stops cleanly gives up its lease: SIGKILL first, as a
	// crash of its node would, so that the lease has to lapse.
	killed := time.Now()
	owner, _ := r.loseReplica(ctx, t, reps, "crash", func(owner replica) {
		c.kill(ctx, t, ns, owner.pod)
		killed = time.Now()
		if err := c.cs.CoreV1().Pods(ns).Delete(ctx, owner.pod, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
			t.Fatal(err)
		}
	})
	// The Deployment replaces it.
	reps = r.waitReplicas(ctx, t, owner.pod)
	t.Logf("2 replicas ready again %.1f s after the crash: %v", time.Since(killed).Seconds(), reps)

	// A replica is drained (a rollout, kubectl drain) while its task runs:
	// SIGTERM and the pod's grace period. It stops, and its task goes on.
	r.loseReplica(ctx, t, reps, "drain", func(owner replica) {
		if err := c.cs.CoreV1().Pods(ns).Delete(ctx, owner.pod, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})
}

// rig is the test's servers and what they reach.
type rig struct {
	cluster
	ns, token string
	data      string // the claim's volume
	web       *webServer
	jobs      *jobWatch
	followed  map[string]bool // the pods whose logs followLog copies
}

// loseReplica spawns a task, which gets /how/before from the test's web
// server, waits for the test's word, then gets /how/after into its result;
// once it runs, lose does away with the replica that runs it (the owner).
// The other replica (the survivor) adopts it and reattaches to its Job;
// the word comes then, so that the worker's request and report go to the
// replicas left. The task ends once, on its report, with its result.
func (r *rig) loseReplica(ctx context.Context, t *testing.T, reps []replica, how string, lose func(owner replica)) (owner, survivor replica) {
	t.Helper()
	get := func(p, file string) string {
		return fmt.Sprintf("wget -q -O output/%s http://%s/%s/%s", file, r.web.addr, how, p)
	}
	tk, _, err := reps[0].client.Spawn(ctx, service.SpawnRequest{TaskDescription: "outlives its replica: " + how, Agent: "command", Network: task.NetworkAllowlist,
		Command: []string{"sh", "-c", get("before", "before.txt") + " && for i in $(seq 1200); do [ -e /task/go ] && break; sleep 0.1; done; " + get("after", "result.txt")}})
	if err != nil {
		t.Fatal(err)
	}
	waitLong(t, "task "+tk.ID+" running, its first request served", func() bool {
		tk, err = reps[0].client.Get(ctx, tk.ID)
		return err == nil && tk.Status == task.Running && len(r.web.servedTo("/"+how+"/before")) > 0
	})
	for _, rep := range reps {
		if rep.id == tk.Replica {
			owner = rep
		} else {
			survivor = rep
		}
	}
	if owner.pod == "" || survivor.pod == "" {
		t.Fatalf("task %s runs on replica %q, not one of %v", tk.ID, tk.Replica, reps)
	}
	lost := time.Now()
	lose(owner)
	waitLong(t, "task "+tk.ID+" adopted", func() bool {
		tk, err = survivor.client.Get(ctx, tk.ID)
		return err == nil && tk.Replica != owner.id
	})
	if tk.Replica != survivor.id {
		t.Fatalf("task %s adopted by %s, want %s", tk.ID, tk.Replica, survivor)
	}
	t.Logf("%s: task %s adopted by %s %.1f s after the loss of %s", how, tk.ID, survivor, time.Since(lost).Seconds(), owner)
	// The worker finishes once the survivor has reattached, not merely
	// adopted, the task: the survivor reads the worker's status.json
	// before it records the reattach, so the task's end is then the
	// worker's webhook's.
	waitLong(t, "task "+tk.ID+" reattached", func() bool {
		return slices.ContainsFunc(survivor.events(ctx, t, tk.ID), func(e eventstore.Event) bool { return e.Type == task.EventReattached })
	})
	if err := os.WriteFile(filepath.Join(r.data, "tasks", tk.ID, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res := survivor.result(ctx, t, tk.ID)
	if got, want := res.FileContents["result.txt"].Content, "served /"+how+"/after"; res.Status != task.Success || got != want {
		t.Errorf("%s: task %s: %s %q (%s), want success with %q", how, tk.ID, res.Status, got, res.ErrorMessage, want)
	}
	evs := survivor.events(ctx, t, tk.ID)
	checkEnd(t, evs, tk.ID)
	var adoptions []task.Adopted
	for _, e := range evs {
		if e.Type == task.EventAdopted {
			adoptions = append(adoptions, payload[task.Adopted](t, e))
		}
	}
	if len(adoptions) != 1 || adoptions[0].Replica != survivor.id || adoptions[0].From != owner.id {
		t.Errorf("%s: task %s's adoptions: %+v, want one by %s from %s", how, tk.ID, adoptions, survivor.id, owner.id)
	}
	if n := r.jobs.made(tk.ID); n != 1 {
		t.Errorf("%s: task %s ran in %d Jobs, want its one, reattached", how, tk.ID, n)
	}
	return owner, survivor
}

// replica is a server pod and its replica id, with a client of its API at
// the pod's address.
type replica struct {
	pod, ip, id string
	client      *httpapi.Client
}

func (r replica) String() string { return r.pod + " (" + r.id + ")" }

// result waits for task id's end and returns its result, with
// output/result.txt.
func (r replica) result(ctx context.Context, t *testing.T, id string) service.Result {
	t.Helper()
	res, err := r.client.Result(ctx, service.ResultRequest{TaskID: id, Wait: 90 * time.Second, IncludeFileContents: []string{"result.txt"}})
	if err != nil {
		t.Fatalf("task %s's result from %s: %v", id, r, err)
	}
	if !res.Done {
		t.Fatalf("task %s not ended within 90 s: %s", id, res.Status)
	}
	return res
}

// events are task id's events, as r has them.
func (r replica) events(ctx context.Context, t *testing.T, id string) []eventstore.Event {
	t.Helper()
	var out []eventstore.Event
	if err := r.client.Events(ctx, service.EventsRequest{TaskID: id}, func(e eventstore.Event) error {
		out = append(out, e)
		return nil
	}); err != nil {
		t.Fatalf("task %s's events from %s: %v", id, r, err)
	}
	return out
}

// checkEnd checks that task id ended once, on its worker's report.
func checkEnd(t *testing.T, evs []eventstore.Event, id string) {
	t.Helper()
	var ends []task.Completed
	for _, e := range evs {
		if e.Type == task.EventCompleted {
			ends = append(ends, payload[task.Completed](t, e))
		}
	}
	if len(ends) != 1 || ends[0].Reason != "webhook" {
		t.Errorf("task %s's ends: %+v, want one, on its worker's report (webhook)", id, ends)
	}
}

func payload[T any](t *testing.T, e eventstore.Event) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(e.Data, &v); err != nil {
		t.Fatalf("%s %s: %v", e.Type, e.Data, err)
	}
	return v
}

// waitReplicas waits until the Deployment has 2 ready replicas, the pod
// gone (deleted already) not one of them, and the Service's endpoints are
// theirs, and returns them with their replica ids from /healthz, following
// the log of each.
func (r *rig) waitReplicas(ctx context.Context, t *testing.T, gone string) []replica {
	t.Helper()
	var reps []replica
	waitLong(t, "2 ready replicas", func() bool {
		d, err := r.cs.AppsV1().Deployments(r.ns).Get(ctx, Server, metav1.GetOptions{})
		if err != nil || d.Status.ReadyReplicas != 2 {
			return false
		}
		pods, err := r.cs.CoreV1().Pods(r.ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + Server})
		if err != nil {
			return false
		}
		reps = reps[:0]
		var want []string
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && ready(&p) && p.Name != gone {
				reps = append(reps, replica{pod: p.Name, ip: p.Status.PodIP})
				want = append(want, net.JoinHostPort(p.Status.PodIP, fmt.Sprint(Port)))
			}
		}
		// What the test's kube-proxy sends connections to.
		slices.Sort(want)
		return len(reps) == 2 && slices.Equal(r.endpoints(ctx, r.ns, Server, "http"), want)
	})
	for i := range reps {
		rep := &reps[i]
		base := "http://" + net.JoinHostPort(rep.ip, fmt.Sprint(Port))
		rep.client = httpapi.NewClient(base, r.token)
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		var h struct{ Status, Replica string }
		err = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if err != nil || h.Status != "ok" || !strings.HasPrefix(h.Replica, "r-") {
			t.Fatalf("%s's /healthz: %+v, %v", rep.pod, h, err)
		}
		rep.id = h.Replica
		r.checkNoRestart(ctx, t, r.ns, rep.pod)
		if !r.followed[rep.pod] {
			r.followed[rep.pod] = true
			r.followLog(t, r.ns, rep.pod)
		}
	}
	if reps[0].id == reps[1].id {
		t.Fatalf("two pods, one replica: %v", reps)
	}
	return reps
}

// checkNoRestart fails t if pod's server has restarted: ready again, but
// it failed, and its last words say why.
func (c cluster) checkNoRestart(ctx context.Context, t *testing.T, ns, pod string) {
	t.Helper()
	p, err := c.cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.Name != Server || s.RestartCount == 0 {
			continue
		}
		last, _ := c.cs.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: Server, Previous: true, TailLines: new(int64(20))}).DoRaw(ctx)
		t.Errorf("pod %s's server restarted %d times; the last run ended %+v:\n%s", pod, s.RestartCount, s.LastTerminationState.Terminated, last)
	}
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// followLog copies pod's server log until the pod ends, and shows it if t
// fails.
func (c cluster) followLog(t *testing.T, ns, pod string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var log testenv.SyncBuffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		r, err := c.cs.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: Server, Follow: true}).Stream(ctx)
		if err != nil {
			fmt.Fprintf(&log, "(no log: %v)\n", err)
			return
		}
		defer r.Close()
		io.Copy(&log, r)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("server log of pod %s:\n%s", pod, log.String())
		}
	})
}

// kill kills pod's server with SIGKILL, through the node's containerd.
func (c cluster) kill(ctx context.Context, t *testing.T, ns, pod string) {
	t.Helper()
	p, err := c.cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var id string
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == Server {
			id = strings.TrimPrefix(s.ContainerID, "containerd://")
		}
	}
	if out, err := exec.Command("ctr", "--address", k8stest.ContainerdSocket, "--namespace", "k8s.io", "tasks", "kill", "--signal", "SIGKILL", id).CombinedOutput(); err != nil {
		t.Fatalf("kill %s's server (container %q): %v: %s", pod, id, err, out)
	}
}

// webServer is an HTTP server on the node's address, where the servers'
// egress proxies reach it, that records whose proxy asked for each path.
type webServer struct {
	addr string
	mu   sync.Mutex
	from map[string][]string // path -> the proxies' addresses
}

func newWebServer(t *testing.T) *webServer {
	t.Helper()
	ln, err := net.Listen("tcp", k8stest.NodeIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	s := &webServer{addr: ln.Addr().String(), from: map[string][]string{}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		s.mu.Lock()
		s.from[r.URL.Path] = append(s.from[r.URL.Path], host)
		s.mu.Unlock()
		fmt.Fprintf(w, "served %s", r.URL.Path)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return s
}

// servedTo is the addresses of the proxies that asked for path.
func (s *webServer) servedTo(path string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.from[path])
}

// jobWatch counts the Jobs made for each task.
type jobWatch struct {
	mu   sync.Mutex
	jobs map[string]map[string]bool // task id -> Job UIDs
}

func (w *jobWatch) made(id string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.jobs[id])
}

// watchJobs watches the Jobs of ns until ctx ends.
func (c cluster) watchJobs(ctx context.Context, t *testing.T, ns string) *jobWatch {
	t.Helper()
	wi, err := c.cs.BatchV1().Jobs(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w := &jobWatch{jobs: map[string]map[string]bool{}}
	go func() {
		defer wi.Stop()
		for ev := range wi.ResultChan() {
			if ev.Type != watch.Added {
				continue
			}
			j, ok := ev.Object.(*batchv1.Job)
			if !ok {
				continue
			}
			id := j.Labels[sandbox.LabelTaskID]
			w.mu.Lock()
			if w.jobs[id] == nil {
				w.jobs[id] = map[string]bool{}
			}
			w.jobs[id][string(j.UID)] = true
			w.mu.Unlock()
		}
	}()
	return w
}

// proxyService plays kube-proxy for the Service name in ns on the test
// node, which has none: for each of ports (the Service's port names) it
// listens on the node's address, where pods reach the host, and sends each
// connection to the Service's ready endpoints in turn (round robin, so
// that two connections in a row reach two replicas), the next one when
// one does not answer. It returns each port's listen address.
func (c cluster) proxyService(ctx context.Context, t *testing.T, ns, name string, ports ...string) map[string]string {
	t.Helper()
	addrs := map[string]string{}
	for _, port := range ports {
		ln, err := net.Listen("tcp", k8stest.NodeIP+":0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		addrs[port] = ln.Addr().String()
		var turn atomic.Uint64
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				go c.forward(ctx, conn, c.endpoints(ctx, ns, name, port), int(turn.Add(1)))
			}
		}()
	}
	return addrs
}

// endpoints are the ready endpoints (address:port) of port of Service name,
// as its EndpointSlices list them, sorted.
func (c cluster) endpoints(ctx context.Context, ns, name, port string) []string {
	list, err := c.cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	if err != nil {
		return nil
	}
	var out []string
	for _, s := range list.Items {
		for _, p := range s.Ports {
			if p.Name == nil || *p.Name != port || p.Port == nil {
				continue
			}
			for _, e := range s.Endpoints {
				if e.Conditions.Ready == nil || *e.Conditions.Ready {
					for _, a := range e.Addresses {
						out = append(out, net.JoinHostPort(a, fmt.Sprint(*p.Port)))
					}
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// forward sends conn to targets[turn], or the next that answers.
func (c cluster) forward(ctx context.Context, conn net.Conn, targets []string, turn int) {
	defer conn.Close()
	for i := range targets {
		up, err := net.DialTimeout("tcp", targets[(turn+i)%len(targets)], time.Second)
		if err != nil {
			continue
		}
		defer up.Close()
		done := make(chan struct{})
		go func() {
			io.Copy(up, conn)
			up.(*net.TCPConn).CloseWrite()
			close(done)
		}()
		io.Copy(conn, up)
		conn.(*net.TCPConn).CloseWrite()
		<-done
		return
	}
}

// serverImage builds corral and corral-worker (which the server stages
// into its data root for worker pods) from this checkout into an image of
// the server's on the node: busybox_root's file system
// (scripts/k8s/lib.sh), the binaries in /usr/local/bin, the host's CA
// bundle, running as uid 1000. Its tag is the run's own: the binaries
// change with the code. It is removed from the node when t ends.
func serverImage(t *testing.T) string {
	t.Helper()
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	root := filepath.Join(tmp, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, repo, nil, "bash", "-c", `. scripts/k8s/lib.sh && busybox_root "$1"`, "bash", root)
	bin := filepath.Join(root, "usr", "local", "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	// testenv.MainWithCorral's build, so that the two share Go's cache.
	run(t, repo, []string{"CGO_ENABLED=0"}, goTool(), "build", "-o", bin+"/", "./cmd/corral", "./cmd/corral-worker")
	ca, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "etc", "ssl", "certs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "ssl", "certs", "ca-certificates.crt"), ca, 0o644); err != nil {
		t.Fatal(err)
	}
	name := "localhost/corral-test-server:" + strings.TrimPrefix(k8stest.Name(""), "-")
	tar := filepath.Join(tmp, "image.tar")
	run(t, repo, nil, "scripts/k8s/image.sh", "--entrypoint", `["/usr/local/bin/corral"]`, "--user", "1000:1000", name, root, tar)
	run(t, repo, nil, "scripts/k8s/import.sh", tar)
	t.Cleanup(func() {
		exec.Command("ctr", "--address", k8stest.ContainerdSocket, "--namespace", "k8s.io", "images", "rm", name).Run()
	})
	return name
}

// goTool is the go command: on PATH, or the one scripts/k8s/lib.sh adds.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// run runs a command in dir with env added to the test's, and fails t
// with its output if it fails.
func run(t *testing.T, dir string, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// serverURLs is the server's configuration file content with the
// kubernetes runtime's server_url and egress_addr set to httpAddr and
// egressAddr.
func serverURLs(t *testing.T, content, httpAddr, egressAddr string) string {
	t.Helper()
	var m map[string]any
	if err := sigsyaml.Unmarshal([]byte(content), &m); err != nil {
		t.Fatal(err)
	}
	k, _ := m["kubernetes"].(map[string]any)
	if k == nil {
		t.Fatalf("no kubernetes section in the server's configuration:\n%s", content)
	}
	k["server_url"] = "http://" + httpAddr
	k["egress_addr"] = egressAddr
	out, err := sigsyaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// set sets u's field at fields to v.
func set(t *testing.T, u *unstructured.Unstructured, v any, fields ...string) {
	t.Helper()
	if err := unstructured.SetNestedField(u.Object, v, fields...); err != nil {
		t.Fatalf("%s %s: set %s: %v", u.GetKind(), u.GetName(), strings.Join(fields, "."), err)
	}
}

// nested is u's field at fields.
func nested[T any](t *testing.T, u *unstructured.Unstructured, fields ...string) T {
	t.Helper()
	v, ok, err := unstructured.NestedFieldNoCopy(u.Object, fields...)
	x, isT := v.(T)
	if err != nil || !ok || !isT {
		t.Fatalf("%s %s: no %T at %s (%v)", u.GetKind(), u.GetName(), x, strings.Join(fields, "."), err)
	}
	return x
}

// typed is u as a T.
func typed[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	v := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, v); err != nil {
		t.Fatal(err)
	}
	return v
}

// untyped is obj as rendered (toYAML's form), decoded.
func untyped(t *testing.T, obj object) *unstructured.Unstructured {
	t.Helper()
	doc, err := toYAML(obj)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := sigsyaml.Unmarshal(doc, &u.Object); err != nil {
		t.Fatal(err)
	}
	return u
}
