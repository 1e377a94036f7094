//go:build integration

package k8srender

import (
	"bufio"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes/k8stest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestReleaseOnTheNode builds a release of the checkout with
// scripts/release.sh (this machine's binaries and the server's image) and
// runs it: the checksums hold, the binaries are static and say the
// checkout's version (git describe), and the server's image, imported
// into the test node, runs the manifests the release's own `corral k8s
// render` makes of the default configuration (SQLite, one replica, workers
// under gVisor), as rendered but for what the node lacks (as
// TestRenderedReplicasOnTheNode: a volume for the claim, the API server's
// address, the test playing kube-proxy, no NetworkPolicies). The
// Deployment gets ready, the API says the release's version, and a task
// spawned through it runs as a Job and ends with its output.
func TestReleaseOnTheNode(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	k8stest.RequireImage(t, k8stest.BusyboxImage)
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	describe, err := exec.Command("git", "-C", repo, "describe", "--tags", "--always", "--dirty").Output()
	if err != nil {
		t.Fatalf("git describe: %v", err)
	}
	version := strings.TrimSpace(string(describe))
	began := time.Now()
	dist := t.TempDir()
	run(t, repo, []string{"OUT=" + dist, "ARCHES=" + runtime.GOARCH, "IMAGES=server"}, "scripts/release.sh")
	t.Logf("release %s built in %.1f s", version, time.Since(began).Seconds())
	out := filepath.Join(dist, version)
	bin := checkRelease(t, out, version)
	image := "localhost/corral:" + imageTag(version)
	tar := filepath.Join(out, fmt.Sprintf("corral-image-%s-%s.tar", version, runtime.GOARCH))
	run(t, repo, nil, "scripts/k8s/import.sh", tar)
	t.Cleanup(func() {
		exec.Command("ctr", "--address", k8stest.ContainerdSocket, "--namespace", "k8s.io", "images", "rm", image).Run()
	})

	ns := k8stest.Namespace(t, c.cs)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	token := k8stest.Name("token")
	data := testenv.TempDir(t)
	svc := c.proxyService(ctx, t, ns, Server, "http", "egress")
	cfgFile := filepath.Join(t.TempDir(), "corral.yaml")
	// The workers' requests stay small: other tests share the node's two
	// cores.
	if err := os.WriteFile(cfgFile, fmt.Appendf(nil, `ai_worker_config:
  namespace: %s
  ai_coder_image: %s
  resources: {cpu_request: 100m, memory_request: 64Mi}
kubernetes:
  pull_policy: Never
`, ns, k8stest.BusyboxImage), 0o600); err != nil {
		t.Fatal(err)
	}
	render := exec.Command(filepath.Join(bin, "corral"), "k8s", "render", "--config", cfgFile, "--server-image", image, "--storage", "1Gi")
	render.Stderr = os.Stderr
	stream, err := render.Output()
	if err != nil {
		t.Fatalf("corral k8s render: %v", err)
	}
	for _, u := range decode(t, stream) {
		switch u.GetKind() {
		case "NetworkPolicy":
			// Workers reach the server through the test's kube-proxy on
			// the node's address, which they would hold them from:
			// TestNetworkPoliciesHold tests them.
			continue
		case "RuntimeClass":
			// The node has its gvisor (scripts/k8s/up.sh), shared by every
			// test: the rendered header says to leave it out then.
			continue
		case "Secret":
			switch u.GetName() {
			case Server:
				set(t, u, map[string]any{TokenKey: token, WebhookKey: k8stest.Name("webhook")}, "stringData")
			default:
				// The agents' keys, unused by the command agent: "" as
				// the header says.
				keys := nested[map[string]any](t, u, "stringData")
				for k := range keys {
					keys[k] = ""
				}
				set(t, u, keys, "stringData")
			}
		case "ConfigMap":
			file := filepath.Base(ConfigFile)
			set(t, u, serverURLs(t, nested[string](t, u, "data", file), svc["http"], svc["egress"]), "data", file)
		case "PersistentVolumeClaim":
			set(t, u, k8stest.Volume(t, c.cs, ns, u.GetName(), data), "spec", "volumeName")
			set(t, u, "", "spec", "storageClassName")
		case "Deployment":
			d := typed[appsv1.Deployment](t, u)
			ct := &d.Spec.Template.Spec.Containers[0]
			ct.Env = append(ct.Env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: k8stest.NodeIP}, corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: "6443"})
			u = untyped(t, d)
		}
		if err := c.apply(t, u, false); err != nil {
			t.Fatalf("apply %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}

	t.Cleanup(func() {
		if t.Failed() {
			c.showServerLogs(t, ns)
		}
	})
	var pod corev1.Pod
	waitLong(t, "the server ready", func() bool {
		d, err := c.cs.AppsV1().Deployments(ns).Get(ctx, Server, metav1.GetOptions{})
		if err != nil || d.Status.ReadyReplicas != 1 {
			return false
		}
		pods, err := c.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + Server})
		if err != nil {
			return false
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && ready(&p) {
				pod = p
				return true
			}
		}
		return false
	})
	t.Logf("server %s ready %.1f s after the start", pod.Name, time.Since(began).Seconds())
	defer c.checkNoRestart(ctx, t, ns, pod.Name)
	base := "http://" + net.JoinHostPort(pod.Status.PodIP, fmt.Sprint(Port))

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/health", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var h httpapi.Health
	err = json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || h.Version != version || !h.Ready {
		t.Fatalf("GET /api/health: %s %+v, %v; want ready, version %s", resp.Status, h, err, version)
	}

	client := httpapi.NewClient(base, token)
	tk, _, err := client.Spawn(ctx, service.SpawnRequest{TaskDescription: "through the release's server", Agent: "command", Network: task.NetworkNone,
		Command: []string{"sh", "-c", "echo ran in the release > output/result.txt && echo printed"}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := client.Result(ctx, service.ResultRequest{TaskID: tk.ID, Wait: 2 * time.Minute, IncludeFileContents: []string{"result.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.FileContents["result.txt"].Content; !res.Done || res.Status != task.Success || got != "ran in the release\n" {
		t.Fatalf("task %s: done %v, %s %q (%s), want success with its output", tk.ID, res.Done, res.Status, got, res.ErrorMessage)
	}
	var logs strings.Builder
	if err := client.Logs(ctx, service.LogsRequest{TaskID: tk.ID}, &logs); err != nil || logs.String() != "printed\n" {
		t.Errorf("task %s's transcript: %q, %v", tk.ID, logs.String(), err)
	}
	t.Logf("task %s through the release's server: %s %.1f s after the start", tk.ID, res.Status, time.Since(began).Seconds())
}

// showServerLogs logs the last lines of every server container in ns,
// and of its previous run if it restarted.
func (c cluster) showServerLogs(t *testing.T, ns string) {
	ctx := context.Background()
	pods, err := c.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + Server})
	if err != nil {
		t.Logf("server pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		for _, previous := range []bool{true, false} {
			log, err := c.cs.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: Server, Previous: previous, TailLines: new(int64(40))}).DoRaw(ctx)
			if err == nil {
				t.Logf("pod %s's server (previous run: %v):\n%s", p.Name, previous, log)
			}
		}
	}
}

// checkRelease checks the release in dir (scripts/release.sh's, of this
// machine's architecture only): SHA256SUMS names every other file and
// holds, the binaries' archive holds corral, corral-worker and the systemd
// unit, the binaries are static and `corral version` says version. It
// returns the directory of the unpacked binaries.
func checkRelease(t *testing.T, dir, version string) string {
	t.Helper()
	archive := fmt.Sprintf("corral-%s-linux-%s", version, runtime.GOARCH)
	sums, err := os.Open(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer sums.Close()
	var listed []string
	for sc := bufio.NewScanner(sums); sc.Scan(); {
		_, name, _ := strings.Cut(sc.Text(), "  ")
		listed = append(listed, name)
	}
	if want := []string{archive + ".tar.gz", fmt.Sprintf("corral-image-%s-%s.tar", version, runtime.GOARCH)}; !slices.Equal(listed, want) {
		t.Errorf("SHA256SUMS lists %q, want %q", listed, want)
	}
	run(t, dir, nil, "sha256sum", "--check", "--strict", "SHA256SUMS")

	unpacked := t.TempDir()
	run(t, unpacked, nil, "tar", "-xzf", filepath.Join(dir, archive+".tar.gz"))
	bin := filepath.Join(unpacked, archive)
	entries, err := os.ReadDir(bin)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"corral", "corral-worker", "corral.service"}; !slices.Equal(names, want) {
		t.Errorf("%s.tar.gz holds %q, want %q", archive, names, want)
	}
	for _, name := range []string{"corral", "corral-worker"} {
		f, err := elf.Open(filepath.Join(bin, name))
		if err != nil {
			t.Fatal(err)
		}
		libs, _ := f.ImportedLibraries()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				libs = append(libs, "an interpreter")
			}
		}
		f.Close()
		if len(libs) > 0 {
			t.Errorf("%s is not static: it needs %q", name, libs)
		}
	}
	got, err := exec.Command(filepath.Join(bin, "corral"), "version").Output()
	if err != nil || string(got) != "corral "+version+"\n" {
		t.Errorf("corral version: %q, %v; want corral %s", got, err, version)
	}
	unit, err := os.ReadFile(filepath.Join(bin, "corral.service"))
	if err != nil {
		t.Fatal(err)
	}
	if shipped, err := os.ReadFile("../../deploy/systemd/corral.service"); err != nil || string(unit) != string(shipped) {
		t.Errorf("the archive's corral.service is not deploy/systemd/corral.service (%v)", err)
	}
	return bin
}

// imageTag is version as an image tag holds it, as scripts/release.sh and
// corral k8s render's default image name make it: anything but letters,
// digits, '_', '.' and '-' as '-'.
func imageTag(version string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || r == '.' || r == '-' || r < 128 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return r
		}
		return '-'
	}, version)
}
