//go:build integration

package k8srender

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes/k8stest"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/testenv"
)

// kubectl is the test cluster's kubectl (scripts/k8s/build.sh).
const kubectl = "/var/cache/corral-test/k8s/bin/kubectl"

// cluster is the test cluster through a dynamic client, so that any
// rendered object can be applied.
type cluster struct {
	cfg    *rest.Config
	cs     k8s.Interface
	dyn    dynamic.Interface
	mapper apimeta.RESTMapper
}

func newCluster(t *testing.T) cluster {
	t.Helper()
	cfg := k8stest.Require(t)
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cluster{cfg: cfg, cs: k8stest.Clientset(t, cfg), dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))}
}

// decode splits a rendered stream into its objects.
func decode(t *testing.T, stream []byte) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, doc := range strings.Split(string(stream), "\n---\n")[1:] {
		u := &unstructured.Unstructured{}
		if err := sigsyaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("decode %q: %v", doc, err)
		}
		out = append(out, u)
	}
	return out
}

// resource is the client of u's kind, in u's namespace if it has one.
func (c cluster) resource(t *testing.T, u *unstructured.Unstructured) dynamic.ResourceInterface {
	t.Helper()
	gvk := u.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("%s: %v", gvk, err)
	}
	if m.Scope.Name() == apimeta.RESTScopeNameNamespace {
		return c.dyn.Resource(m.Resource).Namespace(u.GetNamespace())
	}
	return c.dyn.Resource(m.Resource)
}

// apply applies u server-side with strict field validation; dryRun
// changes nothing.
func (c cluster) apply(t *testing.T, u *unstructured.Unstructured, dryRun bool) error {
	t.Helper()
	data, err := json.Marshal(u.Object)
	if err != nil {
		t.Fatal(err)
	}
	opts := metav1.PatchOptions{FieldManager: "corral-k8s-render-test", FieldValidation: "Strict", Force: new(false)}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = c.resource(t, u).Patch(context.Background(), u.GetName(), types.ApplyPatchType, data, opts)
	return err
}

// render renders the configuration content for the test cluster.
func render(t *testing.T, content string) []byte {
	t.Helper()
	out, err := Render(load(t, content), Options{ServerImage: k8stest.BusyboxImage, Storage: "1Gi"})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestServerSideDryRun: the API server takes every rendered object as it
// is (server-side apply, strict field validation, admission, RBAC's
// escalation check on the Role), and the dry run leaves nothing behind.
func TestServerSideDryRun(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ns := k8stest.Namespace(t, c.cs) // namespaced objects need it to exist even in a dry run
	// A RuntimeClass of its own, so the check below sees a name that
	// cannot be there already.
	rc := k8stest.Name("corral-rc")
	stream := render(t, strings.NewReplacer("namespace: ai", "namespace: "+ns, "runtime_class: gvisor", "runtime_class: "+rc).Replace(custom))
	objs := decode(t, stream)
	for _, u := range objs {
		if err := c.apply(t, u, true); err != nil {
			t.Errorf("dry-run apply %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	// What an operator runs, with the test cluster's kubectl.
	if _, err := os.Stat(kubectl); err == nil {
		cmd := exec.Command(kubectl, "--kubeconfig", kubeconfig(), "apply", "--dry-run=server", "-f", "-")
		cmd.Stdin = bytes.NewReader(stream)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("kubectl apply --dry-run=server: %v\n%s", err, out)
		} else if n := strings.Count(string(out), "(server dry run)"); n != len(objs) {
			t.Errorf("kubectl applied %d objects, want %d:\n%s", n, len(objs), out)
		}
	} else if os.Getenv("CI") == "true" {
		t.Errorf("no kubectl at %s", kubectl)
	}
	for _, u := range objs {
		if u.GetKind() == "Namespace" {
			continue // the test's own
		}
		_, err := c.resource(t, u).Get(context.Background(), u.GetName(), metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("%s %s after the dry run: %v, want not found", u.GetKind(), u.GetName(), err)
		}
	}
}

func kubeconfig() string {
	if p := os.Getenv("CORRAL_TEST_KUBECONFIG"); p != "" {
		return p
	}
	return k8stest.Kubeconfig
}

// TestRBACSufficesForTheRuntime runs the kubernetes runtime as the
// server's ServiceAccount, with the rendered Role alone: a sandbox is
// made, runs, is stopped and destroyed. What the Role leaves out, the
// server cannot do.
func TestRBACSufficesForTheRuntime(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ns := k8stest.Namespace(t, c.cs)
	// With warm pods, which follow the nodes' memory pressure: the one
	// cluster-wide right, checked below.
	objs := decode(t, render(t, "ai_worker_config: {namespace: "+ns+", runtime_class: \"\"}\nkubernetes: {warm_pool: 1}\n"))
	for _, u := range objs {
		switch u.GetKind() {
		case "ClusterRole", "ClusterRoleBinding":
			if err := c.apply(t, u, false); err != nil {
				t.Fatalf("apply %s %s: %v", u.GetKind(), u.GetName(), err)
			}
			t.Cleanup(func() { c.resource(t, u).Delete(context.Background(), u.GetName(), metav1.DeleteOptions{}) })
		case "ServiceAccount", "Role", "RoleBinding":
			if err := c.apply(t, u, false); err != nil {
				t.Fatalf("apply %s %s: %v", u.GetKind(), u.GetName(), err)
			}
		}
	}
	claim := k8stest.Claim(t, c.cs, ns, sandboxtest.DataRoot)

	// The server's identity: its ServiceAccount's user and groups.
	as := rest.CopyConfig(c.cfg)
	as.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":" + Server,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Rights it must not have.
	self := k8stest.Clientset(t, as).AuthorizationV1().SelfSubjectAccessReviews()
	for _, ra := range []authorizationv1.ResourceAttributes{
		{Namespace: ns, Verb: "get", Resource: "secrets"},
		{Namespace: ns, Verb: "list", Resource: "secrets"},
		{Namespace: ns, Verb: "create", Resource: "pods"},
		{Namespace: ns, Verb: "create", Resource: "pods", Subresource: "exec"},
		{Namespace: ns, Verb: "update", Group: "rbac.authorization.k8s.io", Resource: "roles"},
		{Namespace: "default", Verb: "create", Group: "batch", Resource: "jobs"},
		{Verb: "get", Resource: "nodes"},
		{Verb: "update", Resource: "nodes"},
		{Verb: "list", Resource: "pods"}, // in every namespace
	} {
		r, err := self.Create(ctx, &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &ra}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status.Allowed {
			t.Errorf("the server may %s %s/%s in %s", ra.Verb, ra.Resource, ra.Subresource, ra.Namespace)
		}
	}
	// The one it has beyond its namespace, for the warm pods.
	if r, err := self.Create(ctx, &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "list", Resource: "nodes"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	} else if !r.Status.Allowed {
		t.Errorf("the server of warm pods may not list nodes: %s", r.Status.Reason)
	}

	rt, err := kubernetes.New(kubernetes.Options{
		Config:         as,
		Namespace:      ns,
		DataRoot:       sandboxtest.DataRoot,
		Claim:          claim,
		ServiceAccount: "corral-worker", // rendered, and applied above
		DefaultImage:   k8stest.BusyboxImage,
		PullPolicy:     "Never",
		JobTTL:         time.Hour,
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	caps, err := rt.Capabilities(ctx)
	if err != nil || !caps.Available {
		t.Fatalf("Capabilities: %+v, %v", caps, err)
	}
	dir := testenv.TempDir(t)
	spec := func(script string) sandbox.Spec {
		return sandbox.Spec{
			ID:      sandboxtest.NewID(t),
			Command: []string{"/bin/sh", "-c", script},
			Dir:     "/out",
			Mounts:  []sandbox.Mount{{Source: sandboxtest.MountSource(dir), Target: "/out"}},
			Env:     []string{"CORRAL_RBAC_TEST=from-the-secret"},
		}
	}

	// Runs to the end: create (Secret, Job, the Secret's owner), wait
	// (the informers' list and watch), destroy.
	done := spec(`echo "$CORRAL_RBAC_TEST" > out`)
	if _, err := rt.Create(ctx, done); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if es, err := rt.Wait(ctx, done.ID); err != nil || es.Code != 0 {
		t.Fatalf("Wait: %+v, %v", es, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "out")); string(b) != "from-the-secret\n" {
		t.Errorf("the sandbox wrote %q", b)
	}
	if err := rt.Destroy(ctx, done.ID); err != nil {
		t.Errorf("Destroy: %v", err)
	}

	// Stopped while it runs: its pod deleted.
	long := spec("sleep 600")
	if _, err := rt.Create(ctx, long); err != nil {
		t.Fatalf("Create: %v", err)
	}
	// The update that makes the Job own the environment's Secret (without
	// it the runtime only warns, and a dead server's Secrets stay).
	if s, err := c.cs.CoreV1().Secrets(ns).Get(ctx, long.ID+"-env", metav1.GetOptions{}); err != nil || len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Kind != "Job" {
		t.Errorf("the sandbox's Secret is not its Job's: %v", err)
	}
	for {
		st, err := rt.Status(ctx, long.ID)
		if err != nil {
			t.Fatalf("Status: %v", err)
		}
		if st.State == sandbox.StateRunning {
			break
		}
		if st.State == sandbox.StateExited {
			t.Fatalf("the sandbox ended: %+v", st)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the sandbox did not start: %+v", st)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if err := rt.Stop(ctx, long.ID, time.Second); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if err := rt.Destroy(ctx, long.ID); err != nil {
		t.Errorf("Destroy: %v", err)
	}
	for _, id := range []string{done.ID, long.ID} {
		if _, err := c.cs.BatchV1().Jobs(ns).Get(ctx, id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Job %s after Destroy: %v", id, err)
		}
		if _, err := c.cs.CoreV1().Secrets(ns).Get(ctx, id+"-env", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Secret %s-env after Destroy: %v", id, err)
		}
	}
}
