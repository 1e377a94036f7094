//go:build integration

package e2e_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes/k8stest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
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
		ln, err := net.Listen("tcp", k8stest.NodeIP+":0")
		if err != nil {
			tb.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
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
	for _, class := range []string{"", k8stest.GVisor} {
		t.Run(className(class), func(t *testing.T) {
			t.Parallel()
			s := MustStart(t, escapeRuntime{edit: onKubernetes(class)}.config(t))
			ctx := context.Background()
			spawn := func(script string, timeout int) string {
				tk, _, err := s.client.Spawn(ctx, service.SpawnRequest{TaskDescription: "on kubernetes", Agent: "command", Runtime: "kubernetes",
					Command: []string{"sh", "-c", script}, TimeoutMinutes: timeout})
				if err != nil {
					t.Fatal(err)
				}
				return tk.ID
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

func className(c string) string {
	if c == "" {
		return "runc"
	}
	return c
}
