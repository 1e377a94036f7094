//go:build integration

package k8srender

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes/k8stest"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestNetworkPoliciesHold: on the test node, which enforces NetworkPolicy
// (kube-router's controller, scripts/k8s/up.sh), the rendered policies keep
// a worker pod to the cluster's DNS and the server's two ports. Every
// other pod (a kube-dns impostor in another namespace among them), the
// server's other ports, the API server, the node's own listeners and an
// address outside the cluster refuse it, and no pod reaches it. The same
// worker, before the policies exist, reaches them all: the refusals are
// the policies', not the node's network.
//
// The probe is TCP; DNS over UDP is allowed by the same rule as over TCP.
func TestNetworkPoliciesHold(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ns := k8stest.Namespace(t, c.cs)
	elsewhere := k8stest.Namespace(t, c.cs)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	server := c.listener(ctx, t, ns, map[string]string{"app": Server}, Port, EgressPort, 9090).ip
	dns := c.listener(ctx, t, "kube-system", map[string]string{"k8s-app": "kube-dns"}, 53).ip
	impostor := c.listener(ctx, t, elsewhere, map[string]string{"k8s-app": "kube-dns"}, 53)
	peer := c.listener(ctx, t, ns, map[string]string{"app": "peer"}, 8080)
	node := strings.Replace(k8stest.NodeListener(t), ":", " ", 1)
	outside := outsideListener(t)
	targets := []struct {
		name, addr string
		allowed    bool
	}{
		{"server-webhook", fmt.Sprintf("%s %d", server, Port), true},
		{"server-egress-proxy", fmt.Sprintf("%s %d", server, EgressPort), true},
		{"kube-dns", dns + " 53", true},
		{"server-other-port", server + " 9090", false},
		{"kube-dns-impostor", impostor.ip + " 53", false},
		{"peer-pod", peer.ip + " 8080", false},
		{"api-server", k8stest.NodeIP + " 6443", false},
		{"kubelet", k8stest.NodeIP + " 10250", false},
		{"node-listener", node, false},
		{"outside-address", outside, false},
	}
	// try NAME IP PORT: whether a TCP connection to IP PORT opens.
	const try = `try() { if timeout 10 nc -w 3 $2 $3 -e /bin/true </dev/null >/dev/null 2>&1; then echo "$1 open"; else echo "$1 closed"; fi; }
`
	var probe strings.Builder
	for _, tg := range targets {
		fmt.Fprintf(&probe, "try %s %s >> out\n", tg.name, tg.addr)
	}

	claim := k8stest.Claim(t, c.cs, ns, sandboxtest.DataRoot)
	rt, err := kubernetes.New(kubernetes.Options{
		Config: c.cfg, Namespace: ns, DataRoot: sandboxtest.DataRoot, Claim: claim,
		DefaultImage: k8stest.BusyboxImage, PullPolicy: "Never", JobTTL: time.Hour,
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	// work runs script in a worker pod, which listens on port 8080 too;
	// the peer pod tries it. It returns what the worker wrote to out and
	// whether the peer got in.
	work := func(script string) (string, bool) {
		t.Helper()
		dir := testenv.TempDir(t)
		sp := sandbox.Spec{
			ID: sandboxtest.NewID(t), Command: []string{"/bin/sh", "-c", script + `
nc -ll -p 8080 -e /bin/true &
ip -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1 > addr.tmp && mv addr.tmp addr
for i in $(seq 1 150); do [ -e tried ] && break; sleep 0.2; done`},
			Dir:    "/out",
			Mounts: []sandbox.Mount{{Source: sandboxtest.MountSource(dir), Target: "/out"}},
		}
		if _, err := rt.Create(ctx, sp); err != nil {
			t.Fatalf("Create: %v", err)
		}
		defer rt.Destroy(context.Background(), sp.ID)
		var addr []byte
		waitLong(t, "the worker's address", func() bool {
			addr, _ = os.ReadFile(filepath.Join(dir, "addr"))
			return len(addr) > 0
		})
		in := exec.Command(kubectl, "--kubeconfig", kubeconfig(), "exec", "-n", ns, peer.name, "--",
			"nc", "-w", "3", strings.TrimSpace(string(addr)), "8080", "-e", "/bin/true").Run() == nil
		if err := os.WriteFile(filepath.Join(dir, "tried"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if es, err := rt.Wait(ctx, sp.ID); err != nil || es.Code != 0 {
			t.Fatalf("worker: %+v, %v", es, err)
		}
		b, _ := os.ReadFile(filepath.Join(dir, "out"))
		return string(b), in
	}

	// Before the policies: every target answers, and the peer gets in.
	before, in := work(try + probe.String())
	for _, tg := range targets {
		if !strings.Contains(before, tg.name+" open\n") {
			t.Fatalf("before any policy, a worker could not reach %s (%s): the node's network, not a policy, refuses it:\n%s", tg.name, tg.addr, before)
		}
	}
	if !in {
		t.Fatalf("before any policy, the peer pod could not reach the worker")
	}

	for _, u := range decode(t, render(t, "ai_worker_config: {namespace: "+ns+", runtime_class: \"\"}\n")) {
		if u.GetKind() == "NetworkPolicy" {
			if err := c.apply(t, u, false); err != nil {
				t.Fatalf("apply %s: %v", u.GetName(), err)
			}
		}
	}

	// A worker is held to the policies once the controller has its
	// address (kube-router has no CNI hook that would hold its first
	// packets): it waits, at most 30 s, until the first refusal holds,
	// then tries each target.
	after, in := work(fmt.Sprintf("%sfor i in $(seq 1 60); do try wait %s > state; grep -q closed state && break; sleep 0.5; done\n%s",
		try, impostor.ip+" 53", probe.String()))
	for _, tg := range targets {
		want := tg.name + " closed\n"
		if tg.allowed {
			want = tg.name + " open\n"
		}
		if !strings.Contains(after, want) {
			t.Errorf("under the policies, want %q (%s):\n%s", strings.TrimSpace(want), tg.addr, after)
		}
	}
	if in {
		t.Errorf("under the policies, the peer pod reached the worker")
	}
	t.Logf("under the policies:\n%s", after)
}

// waitLong waits up to 2 minutes for done.
func waitLong(t *testing.T, what string, done func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); !done(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 2 minutes", what)
		}
	}
}

// listening is a listener pod's name and address.
type listening struct{ name, ip string }

// listener runs a pod in ns with labels that accepts connections on ports
// and closes them, and returns it once it runs.
func (c cluster) listener(ctx context.Context, t *testing.T, ns string, labels map[string]string, ports ...int) listening {
	t.Helper()
	var cmd strings.Builder
	for _, p := range ports {
		fmt.Fprintf(&cmd, "nc -ll -p %d -e /bin/true & ", p)
	}
	cmd.WriteString("wait")
	root := int64(0) // to listen on port 53
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: k8stest.Name("listener"), Labels: labels},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  new(false),
			TerminationGracePeriodSeconds: new(int64(0)),
			Containers: []corev1.Container{{
				Name: "listen", Image: k8stest.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:         []string{"/bin/sh", "-c", cmd.String()},
				SecurityContext: &corev1.SecurityContext{RunAsUser: &root},
			}},
		},
	}
	pods := c.cs.CoreV1().Pods(ns)
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pods.Delete(context.Background(), created.Name, metav1.DeleteOptions{}) })
	var ip string
	k8stest.WaitFor(t, "pod "+created.Name+" running", func() bool {
		p, err := pods.Get(ctx, created.Name, metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning {
			return false
		}
		ip = p.Status.PodIP
		return ip != ""
	})
	return listening{created.Name, ip}
}

// outsideListener stands in for the internet: a network namespace of its
// own (a process's, not one `ip netns` mounts: that remounts /run/netns,
// under the CRI's own namespaces), 198.51.100.1 (TEST-NET-2) behind a veth
// pair the node routes to, and a listener on port 80 there. Returns
// "IP PORT".
func outsideListener(t *testing.T) string {
	ln := exec.Command("unshare", "--net", "busybox", "nc", "-ll", "-p", "80", "-e", "/bin/true")
	if err := ln.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Process.Kill(); ln.Wait() })
	pid := strconv.Itoa(ln.Process.Pid)
	ours, _ := os.Readlink("/proc/self/ns/net")
	k8stest.WaitFor(t, "the listener's network namespace", func() bool {
		ns, err := os.Readlink("/proc/" + pid + "/ns/net")
		return err == nil && ns != ours
	})
	suffix := k8stest.Name("x")[2:]
	host, peer := "ci"+suffix, "cp"+suffix
	t.Cleanup(func() { exec.Command("ip", "link", "del", host).Run() })
	in := []string{"nsenter", "-t", pid, "-n"}
	for _, s := range [][]string{
		{"ip", "link", "add", host, "type", "veth", "peer", "name", peer},
		{"ip", "link", "set", peer, "netns", pid},
		{"ip", "addr", "add", "198.51.100.254/24", "dev", host},
		{"ip", "link", "set", host, "up"},
		append(in, "ip", "addr", "add", "198.51.100.1/24", "dev", peer),
		append(in, "ip", "link", "set", peer, "up"),
		append(in, "ip", "link", "set", "lo", "up"),
		append(in, "ip", "route", "add", "default", "via", "198.51.100.254"),
	} {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	return "198.51.100.1 80"
}
