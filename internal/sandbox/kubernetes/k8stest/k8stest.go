// Package k8stest gives tests the single-node cluster scripts/k8s/up.sh
// starts on the test machine (a real kubelet, containerd, runc and gVisor):
// its configuration, a namespace per test and a volume over a host
// directory, all removed when the test ends.
package k8stest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/corral-dev/corral/internal/sandbox/seccomp"
	"github.com/corral-dev/corral/internal/testenv"
)

// Names scripts/k8s/lib.sh gives the cluster's parts.
const (
	// Kubeconfig is where up.sh writes the admin kubeconfig, unless
	// CORRAL_TEST_KUBECONFIG names another.
	Kubeconfig = "/run/corral-k8s/kubeconfig"
	// NodeIP is the node's address: pods reach the host there.
	NodeIP = "10.88.0.1"
	// BusyboxImage holds Debian's static busybox and an /etc/passwd with
	// uid 1000; up.sh imports it.
	BusyboxImage = "localhost/corral-busybox:1"
	// ClaudeImage is Debian 12 with python3 and the host's Claude Code; `scripts/k8s/image.sh claude` builds it and
	// scripts/test.sh imports it (RequireImage).
	ClaudeImage = "localhost/corral-claude:1"
	// GVisor is the RuntimeClass that runs pods under gVisor's runsc.
	GVisor = "gvisor"
	// SeccompDir is the node's kubelet seccomp directory, where Localhost
	// profiles live.
	SeccompDir = "/run/corral-k8s/kubelet/seccomp"
)

// SeccompProfile installs Corral's seccomp profile for pods of
// RuntimeClass class on the node for tb (`corral k8s seccomp`, with
// --gvisor for GVisor) and returns its name relative to SeccompDir.
func SeccompProfile(tb testing.TB, class string) string {
	tb.Helper()
	// The node is this machine.
	profile, err := seccomp.OCIProfile(runtime.GOARCH)
	if class == GVisor {
		profile, err = seccomp.GVisorOCIProfile(runtime.GOARCH)
	}
	if err != nil {
		tb.Fatal(err)
	}
	name := Name("corral-test") + ".json"
	if err := os.MkdirAll(SeccompDir, 0o755); err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(SeccompDir, name)
	if err := os.WriteFile(path, []byte(profile), 0o644); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.Remove(path) })
	return name
}

// ContainerdSocket is the test node's containerd (scripts/k8s/lib.sh).
const ContainerdSocket = "/run/corral-k8s/containerd.sock"

// RequireImage skips tb (fails it in CI) unless the node has image, which
// the tests cannot pull: there is no registry.
func RequireImage(tb testing.TB, image string) {
	tb.Helper()
	out, err := exec.Command("ctr", "--address", ContainerdSocket, "--namespace", "k8s.io", "images", "ls", "--quiet").Output()
	if err != nil {
		testenv.Missing(tb, fmt.Sprintf("cannot list the test node's images: %v", err))
	}
	if !slices.Contains(strings.Fields(string(out)), image) {
		testenv.Missing(tb, "the test node has no image "+image+": scripts/k8s/import.sh with the tarball scripts/k8s/image.sh makes for it")
	}
}

// Require returns the test cluster's configuration, or skips tb (fails it
// in CI) when no cluster is up.
func Require(tb testing.TB) *rest.Config {
	tb.Helper()
	testenv.RequireRoot(tb)
	path := os.Getenv("CORRAL_TEST_KUBECONFIG")
	if path == "" {
		path = Kubeconfig
	}
	if _, err := os.Stat(path); err != nil {
		testenv.Missing(tb, "no Kubernetes test cluster ("+path+"): scripts/k8s/build.sh, then scripts/k8s/up.sh")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		tb.Fatal(err)
	}
	return cfg
}

// Clientset is a client of cfg's cluster.
func Clientset(tb testing.TB, cfg *rest.Config) kubernetes.Interface {
	tb.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return cs
}

// Name returns prefix and a random suffix: a fresh object name.
func Name(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// Namespace makes a namespace for tb, deleted (with all in it) when tb
// ends; the test waits until no pod is left in it (none, as a rule: its
// server's stop destroyed them; a test that killed its server leaves
// them), so no pod outlives it, but not for the namespace itself, whose
// removal took the namespace controller 5 to 15 s of every test.
func Namespace(tb testing.TB, cs kubernetes.Interface) string {
	tb.Helper()
	ctx := context.Background()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Name("corral-test")}}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := cs.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil {
			tb.Errorf("delete namespace %s: %v", ns.Name, err)
			return
		}
		// A test that killed its server leaves Jobs whose finalizer
		// (the runtime's, until a Destroy takes their directories back)
		// no server will remove: the namespace would never go.
		jobs, err := cs.BatchV1().Jobs(ns.Name).List(ctx, metav1.ListOptions{})
		if err != nil {
			tb.Errorf("list the Jobs left in namespace %s: %v", ns.Name, err)
			jobs = &batchv1.JobList{}
		}
		for _, j := range jobs.Items {
			if len(j.Finalizers) == 0 {
				continue
			}
			_, err := cs.BatchV1().Jobs(ns.Name).Patch(ctx, j.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				tb.Errorf("remove the finalizers of Job %s/%s: %v", ns.Name, j.Name, err)
			}
		}
		for ctx.Err() == nil {
			pods, err := cs.CoreV1().Pods(ns.Name).List(ctx, metav1.ListOptions{})
			if err == nil && len(pods.Items) == 0 {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		tb.Errorf("pods still in namespace %s 2 minutes after its deletion", ns.Name)
	})
	return ns.Name
}

// Claim makes a PersistentVolume over the host directory dir and a claim
// in namespace ns bound to it, and returns the claim's name: the
// single-node cluster's stand-in for a ReadWriteMany volume.
func Claim(tb testing.TB, cs kubernetes.Interface, ns, dir string) string {
	tb.Helper()
	ctx := context.Background()
	name := Name("corral-data")
	volume := Volume(tb, cs, ns, name, dir)
	empty := ""
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			StorageClassName: &empty,
			VolumeName:       volume,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	WaitFor(tb, "claim "+name+" bound", func() bool {
		c, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && c.Status.Phase == corev1.ClaimBound
	})
	return name
}

// Volume makes a 1Gi ReadWriteMany PersistentVolume over the host
// directory dir, for the claim named claim in namespace ns only (to be
// made with volumeName set to the volume's name and storageClassName ""),
// and returns its name once the PV controller has seen it; it is deleted
// when tb ends.
func Volume(tb testing.TB, cs kubernetes.Interface, ns, claim, dir string) string {
	tb.Helper()
	ctx := context.Background()
	name := Name("corral-data")
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "",
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
			ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: claim},
		},
	}
	if _, err := cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cs.CoreV1().PersistentVolumes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	// A claim made before the PV controller has seen its volume waits
	// for the controller's next sync, 10 to 15 s later.
	WaitFor(tb, "volume "+name+" available", func() bool {
		v, err := cs.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		return err == nil && v.Status.Phase == corev1.VolumeAvailable
	})
	return name
}

// WaitFor waits up to 30 s for done.
func WaitFor(tb testing.TB, what string, done func() bool) {
	tb.Helper()
	for deadline := time.Now().Add(30 * time.Second); !done(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not within 30 s", what)
		}
	}
}

// NodeListener listens on the node's address (where pods reach the host)
// until tb ends, accepting connections and closing them, and returns its
// address (host:port).
func NodeListener(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", NodeIP+":0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln.Addr().String()
}
