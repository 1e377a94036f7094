package k8srender

import (
	"bytes"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes"
)

// custom is a configuration that sets every name the manifests take from
// it, and an agent environment holding a key.
const custom = `
ai_worker_config:
  namespace: ai
  ai_coder_image: images.example.org/ai-coder:v1
  service_account: ai-worker
  runtime_class: gvisor
  workspace_pvc: ai-workspace
  workspace_mount_path: /srv/corral
  max_concurrent_workers: 7
kubernetes:
  secret_name: ai-keys
http:
  allowed_hosts: [corral.example.org]
agents:
  claude: {env: {ANTHROPIC_API_KEY: sk-ant-live-secret, CLAUDE_CODE_EXTRA: also-secret}}
`

// load loads a configuration file with content and environ.
func load(t *testing.T, content string, environ ...string) *config.Config {
	t.Helper()
	p := filepath.Join(t.TempDir(), "corral.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(config.LoadOptions{Path: p, Environ: environ})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// loadExpanded is load with --config.expand-env, as the rendered server
// runs.
func loadExpanded(t *testing.T, content string, environ ...string) *config.Config {
	t.Helper()
	p := filepath.Join(t.TempDir(), "corral.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(config.LoadOptions{Path: p, Environ: environ, ExpandEnv: true})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// manifests is a decoded stream, by kind and name.
type manifests struct {
	order []string // kind/name, in the stream's order
	docs  map[string][]byte
}

// mustRender renders cfg and decodes the stream strictly: a field the
// types do not have fails the test.
func mustRender(t *testing.T, cfg *config.Config, opts Options) (manifests, []byte) {
	t.Helper()
	if opts.ServerImage == "" {
		opts.ServerImage = "corral:test"
	}
	out, err := Render(cfg, opts)
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	m := manifests{docs: map[string][]byte{}}
	docs := strings.Split(string(out), "\n---\n")
	if !strings.HasPrefix(docs[0], "# ") {
		t.Fatalf("the stream does not open with a comment: %.200q", docs[0])
	}
	for _, doc := range docs[1:] {
		var tm struct {
			metav1.TypeMeta `json:",inline"`
			Metadata        metav1.ObjectMeta `json:"metadata"`
		}
		if err := sigsyaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("decode %q: %v", doc, err)
		}
		key := tm.Kind + "/" + tm.Metadata.Name
		if _, dup := m.docs[key]; dup {
			t.Errorf("%s twice", key)
		}
		m.order = append(m.order, key)
		m.docs[key] = []byte(doc)
	}
	return m, out
}

// get decodes kind/name into obj strictly.
func (m manifests) get(t *testing.T, key string, obj any) {
	t.Helper()
	doc, ok := m.docs[key]
	if !ok {
		t.Fatalf("no %s in %v", key, m.order)
	}
	if err := sigsyaml.UnmarshalStrict(doc, obj); err != nil {
		t.Fatalf("decode %s: %v", key, err)
	}
}

func TestObjectsAndNames(t *testing.T) {
	m, _ := mustRender(t, load(t, custom), Options{Storage: "20Gi", StorageClass: "nfs-rwx"})
	want := []string{
		"Namespace/ai", "RuntimeClass/gvisor", "ServiceAccount/corral", "ServiceAccount/ai-worker",
		"Role/corral", "RoleBinding/corral", "Secret/corral", "Secret/ai-keys", "ConfigMap/corral",
		"PersistentVolumeClaim/ai-workspace", "NetworkPolicy/" + WorkerEgress, "NetworkPolicy/" + WorkerIngress,
		"Service/corral", "Deployment/corral",
	}
	if d := cmp.Diff(want, m.order); d != "" {
		t.Errorf("objects (-want +got):\n%s", d)
	}
	for _, key := range m.order {
		var o struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := sigsyaml.Unmarshal(m.docs[key], &o); err != nil {
			t.Fatal(err)
		}
		clusterWide := strings.HasPrefix(key, "Namespace/") || strings.HasPrefix(key, "RuntimeClass/")
		if got := o.Metadata.Namespace; clusterWide != (got == "") || (!clusterWide && got != "ai") {
			t.Errorf("%s is in namespace %q", key, got)
		}
	}

	var rc nodev1.RuntimeClass
	m.get(t, "RuntimeClass/gvisor", &rc)
	if rc.Handler != "gvisor" {
		t.Errorf("RuntimeClass handler %q, want gvisor", rc.Handler)
	}
	var pvc corev1.PersistentVolumeClaim
	m.get(t, "PersistentVolumeClaim/ai-workspace", &pvc)
	if got := pvc.Spec.AccessModes; !slices.Equal(got, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}) {
		t.Errorf("claim access modes %v, want ReadWriteMany", got)
	}
	if got := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; got.String() != "20Gi" {
		t.Errorf("claim size %s, want 20Gi", got.String())
	}
	if sc := pvc.Spec.StorageClassName; sc == nil || *sc != "nfs-rwx" {
		t.Errorf("claim storage class %v, want nfs-rwx", sc)
	}
	var sa corev1.ServiceAccount
	m.get(t, "ServiceAccount/ai-worker", &sa)
	if a := sa.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("the workers' ServiceAccount mounts its token (%v)", a)
	}
}

// The stream without a runtime class, a workers' ServiceAccount or Secret
// leaves each out; the claim then takes the cluster's default class.
func TestOptionalObjects(t *testing.T) {
	cfg := load(t, "ai_worker_config: {runtime_class: \"\", service_account: \"\"}\nkubernetes: {secret_name: \"\"}\n")
	m, _ := mustRender(t, cfg, Options{})
	for _, key := range m.order {
		if strings.HasPrefix(key, "RuntimeClass/") || key == "ServiceAccount/corral-worker" || key == "Secret/ai-worker-secrets" {
			t.Errorf("%s rendered", key)
		}
	}
	var pvc corev1.PersistentVolumeClaim
	m.get(t, "PersistentVolumeClaim/corral-workspace", &pvc)
	if pvc.Spec.StorageClassName != nil {
		t.Errorf("storage class %q, want none", *pvc.Spec.StorageClassName)
	}
	if got := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; got.String() != "10Gi" {
		t.Errorf("claim size %s, want 10Gi", got.String())
	}

	m, _ = mustRender(t, load(t, ""), Options{NoSecrets: true})
	for _, key := range m.order {
		if strings.HasPrefix(key, "Secret/") {
			t.Errorf("%s rendered with NoSecrets", key)
		}
	}
}

// The server may do exactly what the kubernetes runtime calls, in its
// namespace only.
func TestRBAC(t *testing.T) {
	m, _ := mustRender(t, load(t, custom), Options{})
	var role rbacv1.Role
	m.get(t, "Role/corral", &role)
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create", "get", "list", "watch", "delete", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch", "delete", "deletecollection"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create", "update", "delete"}},
	}
	if d := cmp.Diff(want, role.Rules); d != "" {
		t.Errorf("Role rules (-want +got):\n%s", d)
	}
	var rb rbacv1.RoleBinding
	m.get(t, "RoleBinding/corral", &rb)
	wantRB := rbacv1.RoleBinding{
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: Server, Namespace: "ai"}},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: Server},
	}
	if d := cmp.Diff(wantRB.Subjects, rb.Subjects); d != "" {
		t.Errorf("RoleBinding subjects (-want +got):\n%s", d)
	}
	if rb.RoleRef != wantRB.RoleRef {
		t.Errorf("RoleBinding roleRef %+v, want %+v", rb.RoleRef, wantRB.RoleRef)
	}
	for _, key := range m.order {
		if strings.HasPrefix(key, "ClusterRole") {
			t.Errorf("%s rendered: the server needs no cluster-wide rights", key)
		}
	}

	// Warm pods follow the nodes' memory pressure: the server may list
	// nodes, and nothing else cluster-wide.
	warm := load(t, custom)
	warm.Kubernetes.WarmPool = 2
	m, _ = mustRender(t, warm, Options{})
	var cr rbacv1.ClusterRole
	m.get(t, "ClusterRole/"+NodeReader("ai"), &cr)
	if d := cmp.Diff([]rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list"}}}, cr.Rules); d != "" {
		t.Errorf("ClusterRole rules with warm pods (-want +got):\n%s", d)
	}
	var crb rbacv1.ClusterRoleBinding
	m.get(t, "ClusterRoleBinding/"+NodeReader("ai"), &crb)
	if d := cmp.Diff(wantRB.Subjects, crb.Subjects); d != "" {
		t.Errorf("ClusterRoleBinding subjects (-want +got):\n%s", d)
	}
	if want := (rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: NodeReader("ai")}); crb.RoleRef != want {
		t.Errorf("ClusterRoleBinding roleRef %+v, want %+v", crb.RoleRef, want)
	}
}

// mustDeployment renders content's server Deployment.
func mustDeployment(t *testing.T, content string) appsv1.Deployment {
	t.Helper()
	m, _ := mustRender(t, load(t, content), Options{ServerImage: "corral:v9"})
	var d appsv1.Deployment
	m.get(t, "Deployment/corral", &d)
	return d
}

// The server runs non-root, as the workers' uid, with nothing it does not
// need; one replica at a time.
func TestDeployment(t *testing.T) {
	m, _ := mustRender(t, load(t, custom), Options{ServerImage: "corral:v9"})
	var d appsv1.Deployment
	m.get(t, "Deployment/corral", &d)
	if r := d.Spec.Replicas; r == nil || *r != 1 {
		t.Errorf("replicas %v, want 1", r)
	}
	if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("strategy %q, want Recreate", d.Spec.Strategy.Type)
	}
	pod := d.Spec.Template.Spec
	// custom's stop_grace is the default, 10 s: the stop's 10 s and 5 of
	// margin leave Kubernetes' own 30.
	if g := pod.TerminationGracePeriodSeconds; g == nil || *g != 30 {
		t.Errorf("termination grace %v, want 30 s", g)
	}
	if g := mustDeployment(t, custom+"limits:\n  stop_grace: 40s\n").Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g != 55 {
		t.Errorf("termination grace with stop_grace 40s: %v, want 55 s (40 s, the stop's 10 and 5 of margin)", g)
	}
	if pod.ServiceAccountName != Server {
		t.Errorf("service account %q, want %s", pod.ServiceAccountName, Server)
	}
	psc := pod.SecurityContext
	uid := int64(1000)
	wantPSC := &corev1.PodSecurityContext{
		RunAsUser: &uid, RunAsGroup: &uid, FSGroup: &uid, RunAsNonRoot: new(true),
		FSGroupChangePolicy: new(corev1.FSGroupChangeOnRootMismatch),
		SeccompProfile:      &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	if diff := cmp.Diff(wantPSC, psc); diff != "" {
		t.Errorf("pod security context (-want +got):\n%s", diff)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	wantSC := &corev1.SecurityContext{
		AllowPrivilegeEscalation: new(false), Privileged: new(false), ReadOnlyRootFilesystem: new(true), RunAsNonRoot: new(true),
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	if diff := cmp.Diff(wantSC, c.SecurityContext); diff != "" {
		t.Errorf("server container security context (-want +got):\n%s", diff)
	}
	if c.Image != "corral:v9" || !slices.Equal(c.Args, []string{"serve", "--config", ConfigFile, "--config.expand-env"}) {
		t.Errorf("server runs %s %v, want corral:v9 serve --config %s --config.expand-env", c.Image, c.Args, ConfigFile)
	}
	// The agents' Secret is the server's, prefixed, and no worker's.
	wantFrom := []corev1.EnvFromSource{{Prefix: AgentEnvPrefix, SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "ai-keys"}, Optional: new(true)}}}
	if diff := cmp.Diff(wantFrom, c.EnvFrom); diff != "" {
		t.Errorf("server envFrom (-want +got):\n%s", diff)
	}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port != intstr.FromString("http") {
			t.Errorf("probe %+v, want GET /healthz on http", p)
		}
	}
	if len(c.Ports) != 2 || c.Ports[0].ContainerPort != Port || c.Ports[0].Name != "http" || c.Ports[1].ContainerPort != EgressPort || c.Ports[1].Name != "egress" {
		t.Errorf("ports %+v, want http %d and egress %d", c.Ports, Port, EgressPort)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, vm := range c.VolumeMounts {
		mounts[vm.MountPath] = vm
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	if vm, ok := mounts["/srv/corral"]; !ok || vm.SubPath != "" || vols[vm.Name].PersistentVolumeClaim == nil || vols[vm.Name].PersistentVolumeClaim.ClaimName != "ai-workspace" {
		t.Errorf("the claim is not the server's data root at /srv/corral: %+v", mounts)
	}
	if vm, ok := mounts["/tmp"]; !ok || vols[vm.Name].EmptyDir == nil {
		t.Errorf("no emptyDir /tmp: %+v", mounts)
	}
	if vm, ok := mounts[ConfigDir]; !ok || !vm.ReadOnly || vols[vm.Name].ConfigMap == nil || vols[vm.Name].ConfigMap.Name != Server {
		t.Errorf("no read-only ConfigMap at %s: %+v", ConfigDir, mounts)
	}
	wantEnv := []corev1.EnvVar{
		{Name: "CORRAL_API_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: Server}, Key: TokenKey}}},
		{Name: "AI_WORKER_WEBHOOK_SECRET", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: Server}, Key: WebhookKey}}},
	}
	if diff := cmp.Diff(wantEnv, c.Env); diff != "" {
		t.Errorf("server env (-want +got):\n%s", diff)
	}
	// The one root step: the data root's owner, with CHOWN alone.
	if len(pod.InitContainers) != 1 {
		t.Fatalf("%d init containers, want 1", len(pod.InitContainers))
	}
	ic := pod.InitContainers[0]
	if !slices.Equal(ic.Command, []string{"chown", "1000:1000", "/srv/corral"}) {
		t.Errorf("init container runs %v", ic.Command)
	}
	wantISC := &corev1.SecurityContext{
		RunAsUser: new(int64(0)), RunAsGroup: new(int64(0)), RunAsNonRoot: new(false),
		AllowPrivilegeEscalation: new(false), Privileged: new(false), ReadOnlyRootFilesystem: new(true),
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"CHOWN"}},
	}
	if diff := cmp.Diff(wantISC, ic.SecurityContext); diff != "" {
		t.Errorf("init container security context (-want +got):\n%s", diff)
	}

	var svc corev1.Service
	m.get(t, "Service/corral", &svc)
	if svc.Spec.Type != corev1.ServiceTypeClusterIP || len(svc.Spec.Ports) != 2 || svc.Spec.Ports[0].Port != Port || svc.Spec.Ports[1].Port != EgressPort || svc.Spec.Ports[1].TargetPort.StrVal != "egress" {
		t.Errorf("service %+v, want ClusterIP on %d", svc.Spec, Port)
	}
	if !cmp.Equal(svc.Spec.Selector, d.Spec.Template.Labels) || !cmp.Equal(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) || svc.Spec.Selector["app"] != Server {
		t.Errorf("service selector %v, deployment selector %v, pod labels %v: want app=%s for all", svc.Spec.Selector, d.Spec.Selector.MatchLabels, d.Spec.Template.Labels, Server)
	}
}

// Workers reach the cluster DNS and the server, nothing else, and nothing
// reaches them.
func TestNetworkPolicies(t *testing.T) {
	m, _ := mustRender(t, load(t, custom), Options{})
	var egress, ingress networkingv1.NetworkPolicy
	m.get(t, "NetworkPolicy/"+WorkerEgress, &egress)
	m.get(t, "NetworkPolicy/"+WorkerIngress, &ingress)
	workers := metav1.LabelSelector{MatchLabels: map[string]string{"app": kubernetes.AppWorker}}
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	dns, server, proxy := intstr.FromInt32(53), intstr.FromInt32(7777), intstr.FromInt32(7778)
	want := networkingv1.NetworkPolicySpec{
		PodSelector: workers,
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		Egress: []networkingv1.NetworkPolicyEgressRule{
			{
				To: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
				}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns}},
			},
			{
				To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": Server}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &server}, {Protocol: &tcp, Port: &proxy}},
			},
		},
	}
	if d := cmp.Diff(want, egress.Spec); d != "" {
		t.Errorf("egress policy (-want +got):\n%s", d)
	}
	wantIn := networkingv1.NetworkPolicySpec{PodSelector: workers, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}
	if d := cmp.Diff(wantIn, ingress.Spec); d != "" {
		t.Errorf("ingress policy (-want +got):\n%s", d)
	}
}

// No secret reaches the stream: every Secret value is the placeholder, the
// server's environment is by reference, and neither the token in the
// environment nor agents.*.env values appear anywhere.
func TestNoSecretLiterals(t *testing.T) {
	cfg := load(t, custom, "CORRAL_API_TOKEN=tok-from-the-environment", "AI_WORKER_WEBHOOK_SECRET=whsec-from-the-environment")
	m, out := mustRender(t, cfg, Options{})
	for _, s := range []string{"tok-from-the-environment", "whsec-from-the-environment", "sk-ant-live-secret", "also-secret"} {
		if bytes.Contains(out, []byte(s)) {
			t.Errorf("the stream holds the secret %q", s)
		}
	}
	secrets := 0
	for _, key := range m.order {
		if !strings.HasPrefix(key, "Secret/") {
			continue
		}
		secrets++
		var s corev1.Secret
		m.get(t, key, &s)
		if len(s.Data) > 0 {
			t.Errorf("%s has data %v; want only stringData placeholders", key, s.Data)
		}
		for k, v := range s.StringData {
			if v != config.Placeholder {
				t.Errorf("%s: %s is %q, want %s", key, k, v, config.Placeholder)
			}
		}
	}
	if secrets != 2 {
		t.Errorf("%d Secrets, want 2", secrets)
	}
	var server, workers corev1.Secret
	m.get(t, "Secret/corral", &server)
	m.get(t, "Secret/ai-keys", &workers)
	if got := sortedKeys(server.StringData); !slices.Equal(got, []string{TokenKey, WebhookKey}) {
		t.Errorf("the server's Secret has keys %v", got)
	}
	// agents.claude.env's names become the workers' keys.
	if got, want := sortedKeys(workers.StringData), []string{"ANTHROPIC_API_KEY", "CLAUDE_CODE_EXTRA", "GEMINI_API_KEY", "OPENAI_API_KEY"}; !slices.Equal(got, want) {
		t.Errorf("the workers' Secret has keys %v, want %v", got, want)
	}
	var d appsv1.Deployment
	m.get(t, "Deployment/corral", &d)
	for _, c := range append(d.Spec.Template.Spec.InitContainers, d.Spec.Template.Spec.Containers...) {
		for _, e := range c.Env {
			if e.Value != "" {
				t.Errorf("container %s has the literal %s=%q", c.Name, e.Name, e.Value)
			}
		}
	}
}

func sortedKeys(m map[string]string) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// The ConfigMap's file is a configuration corral serve loads: the source
// configuration with the cluster's settings.
func TestServerConfigLoads(t *testing.T) {
	m, _ := mustRender(t, load(t, custom), Options{})
	var cm corev1.ConfigMap
	m.get(t, "ConfigMap/corral", &cm)
	if len(cm.Data) != 1 || cm.Data["corral.yaml"] == "" {
		t.Fatalf("ConfigMap data keys %v, want corral.yaml", sortedKeys(cm.Data))
	}
	// The server's environment: every key of the agents' Secret, those
	// unused empty.
	environ := []string{"CORRAL_API_TOKEN=t", AgentEnvPrefix + "ANTHROPIC_API_KEY=sk-from-the-secret"}
	for _, k := range workerKeys(load(t, custom)) {
		if k != "ANTHROPIC_API_KEY" {
			environ = append(environ, AgentEnvPrefix+k+"=")
		}
	}
	cfg := loadExpanded(t, cm.Data["corral.yaml"], environ...)
	if cfg.Listen != "0.0.0.0:7777" || cfg.Data != "/srv/corral" || cfg.Runtime != "kubernetes" || cfg.Kubernetes.Kubeconfig != "" || cfg.Kubernetes.EgressListen != "0.0.0.0:7778" || cfg.Kubernetes.EgressAddr != "" {
		t.Errorf("listen %q data %q runtime %q kubeconfig %q egress_listen %q egress_addr %q", cfg.Listen, cfg.Data, cfg.Runtime, cfg.Kubernetes.Kubeconfig, cfg.Kubernetes.EgressListen, cfg.Kubernetes.EgressAddr)
	}
	if got := cfg.Kubernetes.ServerURL; got != "http://corral.ai.svc:7777" {
		t.Errorf("server_url %q", got)
	}
	if got, want := cfg.HTTP.AllowedHosts, []string{"corral.example.org", "corral", "corral.ai", "corral.ai.svc", "corral.ai.svc.cluster.local"}; !slices.Equal(got, want) {
		t.Errorf("allowed_hosts %v, want %v", got, want)
	}
	// The rest is the source's.
	w := cfg.AIWorker
	if w.Namespace != "ai" || w.AICoderImage != "images.example.org/ai-coder:v1" || w.MaxConcurrentWorkers != 7 || w.WorkspacePVC != "ai-workspace" {
		t.Errorf("the source's values are lost: %+v", w)
	}
	// The keys come from the agents' Secret, through the server's
	// environment; workers get no Secret.
	if cfg.Kubernetes.SecretName != "" {
		t.Errorf("secret_name %q: workers would get the agents' keys", cfg.Kubernetes.SecretName)
	}
	if got, want := cfg.Agents.Claude.Env, map[string]string{"ANTHROPIC_API_KEY": "sk-from-the-secret", "CLAUDE_CODE_EXTRA": ""}; !maps.Equal(got, want) {
		t.Errorf("agents.claude.env %v, want %v", got, want)
	}
	if got := cfg.Agents.Opencode.Env; len(got) != 2 {
		t.Errorf("agents.opencode.env %v, want its two API keys", got)
	}
	if _, err := Render(load(t, strings.Replace(custom, "ai_coder_image: images.example.org/ai-coder:v1", "ai_coder_image: images.example.org/ai-coder:v1\n  allowed_images: [\"images.example.org/*\", \"other.example.org/$team/*\"]", 1)), Options{ServerImage: "corral:v9"}); err == nil || !strings.Contains(err.Error(), "$") {
		t.Errorf("a value holding $ rendered (%v): the server would expand it", err)
	}
	// A changed configuration changes the pod template: the server restarts.
	var d appsv1.Deployment
	m.get(t, "Deployment/corral", &d)
	m2, _ := mustRender(t, load(t, custom+"limits: {max_prompt_bytes: 32KiB}\n"), Options{})
	var d2 appsv1.Deployment
	m2.get(t, "Deployment/corral", &d2)
	if cmp.Equal(d.Spec.Template.Annotations, d2.Spec.Template.Annotations) {
		t.Errorf("the pod template does not change with the configuration: %v", d.Spec.Template.Annotations)
	}
}

// The opening comment says what to edit and what applies the policies.
func TestHeader(t *testing.T) {
	_, out := mustRender(t, load(t, custom), Options{})
	head, _, _ := strings.Cut(string(out), "\n---\n")
	for _, want := range []string{"REPLACE_ME", "CNI that enforces", "the egress proxies", "ReadWriteMany", "handler", "kubectl apply"} {
		if !strings.Contains(head, want) {
			t.Errorf("the header does not say %q:\n%s", want, head)
		}
	}
	for _, line := range strings.Split(head, "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			t.Errorf("header line %q is not a comment", line)
		}
	}
	// A Localhost seccomp profile must be installed on the nodes first.
	if !strings.Contains(head, "runtime's default profile") {
		t.Errorf("without kubernetes.seccomp_profile the header does not say the default applies:\n%s", head)
	}
	_, out = mustRender(t, load(t, strings.Replace(custom, "  secret_name: ai-keys\n", "  secret_name: ai-keys\n  seccomp_profile: corral.json\n", 1)), Options{})
	head, _, _ = strings.Cut(string(out), "\n---\n")
	if !strings.Contains(head, "corral k8s seccomp > /var/lib/kubelet/seccomp/corral.json") {
		t.Errorf("the header does not say how to install the seccomp profile:\n%s", head)
	}
}

// TestReplicas: on PostgreSQL the server runs as replicas (two by
// default), replaced one at a time, its connection string from its
// Secret, a disruption budget letting a drain take one at a time; on
// SQLite, one replica replaced by Recreate and no budget.
func TestReplicas(t *testing.T) {
	m, _ := mustRender(t, load(t, "store: {driver: postgres}\n", "CORRAL_STORE_DSN=x"), Options{ServerImage: "c"})
	var d appsv1.Deployment
	m.get(t, "Deployment/corral", &d)
	if r := d.Spec.Replicas; r == nil || *r != 2 {
		t.Errorf("replicas %v, want 2", r)
	}
	ru := d.Spec.Strategy.RollingUpdate
	if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil || ru.MaxUnavailable.IntValue() != 0 || ru.MaxSurge.IntValue() != 1 {
		t.Errorf("strategy %+v, want a rolling update that surges one and takes none away first", d.Spec.Strategy)
	}
	var dsn *corev1.EnvVar
	for i, e := range d.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "CORRAL_STORE_DSN" {
			dsn = &d.Spec.Template.Spec.Containers[0].Env[i]
		}
	}
	if dsn == nil || dsn.ValueFrom == nil || dsn.ValueFrom.SecretKeyRef == nil || dsn.ValueFrom.SecretKeyRef.Name != Server || dsn.ValueFrom.SecretKeyRef.Key != StoreDSNKey {
		t.Errorf("CORRAL_STORE_DSN %+v, want it from Secret %s key %s", dsn, Server, StoreDSNKey)
	}
	var sec corev1.Secret
	m.get(t, "Secret/corral", &sec)
	if _, ok := sec.StringData[StoreDSNKey]; !ok {
		t.Errorf("Secret keys %v, want %s", slices.Sorted(maps.Keys(sec.StringData)), StoreDSNKey)
	}
	var pdb policyv1.PodDisruptionBudget
	m.get(t, "PodDisruptionBudget/corral", &pdb)
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.Selector.MatchLabels["app"] != Server {
		t.Errorf("disruption budget %+v, want one server at a time", pdb.Spec)
	}
	three, _ := mustRender(t, load(t, "store: {driver: postgres}\n", "CORRAL_STORE_DSN=x"), Options{ServerImage: "c", Replicas: 3})
	three.get(t, "Deployment/corral", &d)
	if *d.Spec.Replicas != 3 {
		t.Errorf("--replicas 3: %d", *d.Spec.Replicas)
	}

	one, _ := mustRender(t, load(t, ""), Options{ServerImage: "c"})
	if _, ok := one.docs["PodDisruptionBudget/corral"]; ok {
		t.Error("a disruption budget for one server on SQLite")
	}
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		name, config string
		opts         Options
		fields       []string
	}{
		{"bad flags", "", Options{ServerImage: "corral: v1", Storage: "lots", StorageClass: "Fast_Disks"}, []string{"--server-image", "--storage", "--storage-class"}},
		{"zero storage", "", Options{ServerImage: "c", Storage: "0"}, []string{"--storage"}},
		{"collisions", "ai_worker_config: {service_account: corral}\nkubernetes: {secret_name: corral}\n", Options{ServerImage: "c"}, []string{"ai_worker_config.service_account", "kubernetes.secret_name"}},
		{"names", "ai_worker_config: {workspace_pvc: Bad_Claim, runtime_class: gvisor.v2}\n", Options{ServerImage: "c"}, []string{"ai_worker_config.workspace_pvc", "ai_worker_config.runtime_class"}},
		{"no claim", "ai_worker_config: {workspace_pvc: \"\"}\n", Options{ServerImage: "c"}, []string{"ai_worker_config.workspace_pvc"}},
		{"mount in /tmp", "ai_worker_config: {workspace_mount_path: /tmp/corral}\n", Options{ServerImage: "c"}, []string{"ai_worker_config.workspace_mount_path"}},
		{"mount over the config", "ai_worker_config: {workspace_mount_path: /etc}\n", Options{ServerImage: "c"}, []string{"ai_worker_config.workspace_mount_path"}},
		{"mount at /", "ai_worker_config: {workspace_mount_path: /}\n", Options{ServerImage: "c"}, []string{"ai_worker_config.workspace_mount_path"}},
		{"host things", "workspaces: {roots: [/srv/repos]}\n", Options{ServerImage: "c"}, []string{"workspaces.roots"}},
		{"agent env without a Secret", "kubernetes: {secret_name: \"\"}\nagents: {gemini: {env: {GEMINI_API_KEY: k}}}\n", Options{ServerImage: "c"}, []string{"agents.gemini.env"}},
		{"replicas on SQLite", "", Options{ServerImage: "c", Replicas: 2}, []string{"--replicas"}},
		{"negative replicas", "", Options{ServerImage: "c", Replicas: -1}, []string{"--replicas"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Render(load(t, tt.config), tt.opts)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Render: %v, want ErrInvalidArgument", err)
			}
			var got []string
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				var fe *errdefs.FieldError
				if errors.As(e, &fe) {
					got = append(got, fe.Field)
				}
			}
			if d := cmp.Diff(tt.fields, got); d != "" {
				t.Errorf("fields (-want +got):\n%s\n%v", d, err)
			}
		})
	}
	// Keys with files the server's pod would not have.
	dir := t.TempDir()
	tok := filepath.Join(dir, "tok")
	os.WriteFile(tok, []byte("x"), 0o600)
	_, err := Render(load(t, "api_tokens: [{name: ci, token_file: "+tok+"}]\nnotify: {url: http://h/x, secret_file: "+tok+"}\n"), Options{ServerImage: "c"})
	for _, want := range []string{"api_tokens", "notify.secret_file"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Render: %v, want %s refused", err, want)
		}
	}
}
