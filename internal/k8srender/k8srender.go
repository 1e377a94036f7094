// Package k8srender renders, from Corral's configuration, the manifests
// that run Corral in a Kubernetes cluster (corral k8s render): one
// multi-document YAML stream with the namespace, the server's Deployment,
// Service, ServiceAccount and least RBAC, the workers' ServiceAccount,
// RuntimeClass and NetworkPolicies, the workspace claim, the server's
// configuration as a ConfigMap, and Secret templates whose values are
// config.Placeholder.
//
// The server runs `corral serve` with the kubernetes runtime, its data root
// on the claim the worker pods mount subPaths of, as uid and gid 1000, the
// identity of the runtime's pods, so that files on the volume need no
// change of owner between the two.
//
// Nothing here contacts a cluster, and no secret value is ever rendered:
// agents.*.env values (which may hold API keys) become keys of the
// workers' Secret, with placeholder values.
package k8srender

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes"
)

// Names of the server's objects. Server is the name of its Deployment,
// Service, ServiceAccount, Role, RoleBinding, Secret and ConfigMap, and
// the app label of its pods.
const (
	Server = "corral"
	// Port is where the server listens in its pod and its Service.
	Port = 7777
	// EgressPort is where it listens for the egress of worker pods
	// (kubernetes.egress_listen), in its pod and its Service.
	EgressPort = 7778
	// ConfigDir is where the ConfigMap is mounted; ConfigFile is the
	// server's configuration file in it.
	ConfigDir  = "/etc/corral"
	ConfigFile = ConfigDir + "/corral.yaml"
	// TokenKey and WebhookKey are the keys of the server's Secret;
	// StoreDSNKey too, when the store is PostgreSQL (its connection
	// string, CORRAL_STORE_DSN).
	TokenKey    = "api-token"
	WebhookKey  = "webhook-secret"
	StoreDSNKey = "store-dsn"
	// WorkerEgress and WorkerIngress are the workers' NetworkPolicies.
	WorkerEgress  = "corral-worker-egress"
	WorkerIngress = "corral-worker-ingress"
)

// uid is the server's uid and gid: the kubernetes runtime's pods run as
// 1000:1000 (its Options.User default, which app leaves alone).
const uid = 1000

// APIKeys are the keys of the agents' Secret besides those agents.*.env
// names: the API keys of the agents Corral has adapters for, by agent.
var APIKeys = map[string][]string{
	"claude":   {"ANTHROPIC_API_KEY"},
	"gemini":   {"GEMINI_API_KEY"},
	"codex":    {"OPENAI_API_KEY"},
	"opencode": {"OPENAI_API_KEY", "ANTHROPIC_API_KEY"},
}

// AgentEnvPrefix prefixes the agents' Secret's keys in the server's
// environment (ANTHROPIC_API_KEY is AGENT_ANTHROPIC_API_KEY there), so that
// none of them can set one of the server's own variables.
const AgentEnvPrefix = "AGENT_"

// partOf labels every object, so `kubectl get -l` finds them all.
var partOf = map[string]string{"app.kubernetes.io/part-of": "corral"}

// Options are what the configuration does not say.
type Options struct {
	// ServerImage is the server's image (corral serve runs in it).
	// Required.
	ServerImage string
	// Storage is the workspace claim's size; "" is 10Gi.
	Storage string
	// StorageClass is the claim's storageClassName; "" leaves it out, for
	// the cluster's default class.
	StorageClass string
	// NoSecrets leaves the Secret templates out, so that applying the
	// stream again does not put the placeholders back.
	NoSecrets bool
	// Replicas is how many servers run (docs/replicas.md): more than one
	// needs store.driver postgres. 0: 2 on PostgreSQL, else 1.
	Replicas int
	// Source names what was rendered (a file, "the defaults"), for the
	// header.
	Source string
}

// Render returns the manifests for cfg as one YAML stream, a comment
// saying what to edit first. Errors are errdefs.ErrInvalidArgument, every
// problem at once, each naming its key or flag.
func Render(cfg *config.Config, opts Options) ([]byte, error) {
	if opts.Storage == "" {
		opts.Storage = "10Gi"
	}
	if opts.Replicas == 0 {
		opts.Replicas = 1
		if cfg.Store.Driver == config.StorePostgres {
			opts.Replicas = 2
		}
	}
	if err := validate(cfg, opts); err != nil {
		return nil, err
	}
	serverCfg, err := serverConfig(cfg)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString(header(cfg, opts))
	for _, obj := range objects(cfg, opts, serverCfg) {
		doc, err := toYAML(obj)
		if err != nil {
			return nil, err
		}
		b.WriteString("---\n")
		b.Write(doc)
	}
	return b.Bytes(), nil
}

// validate refuses what the cluster would refuse, or what would collide
// with the server's own objects.
func validate(cfg *config.Config, opts Options) error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &errdefs.FieldError{Field: field, Err: fmt.Errorf(format, args...)})
	}
	w, k := cfg.AIWorker, cfg.Kubernetes
	names := []struct{ field, name string }{
		{"ai_worker_config.service_account", w.ServiceAccount},
		{"ai_worker_config.workspace_pvc", w.WorkspacePVC},
		{"ai_worker_config.runtime_class", w.RuntimeClass},
		{"kubernetes.secret_name", k.SecretName},
	}
	for _, n := range names {
		if n.name == "" {
			continue
		}
		if e := validation.IsDNS1123Subdomain(n.name); len(e) > 0 {
			bad(n.field, "%q is not a Kubernetes object name: %s", n.name, strings.Join(e, "; "))
		}
	}
	if w.RuntimeClass != "" && len(validation.IsDNS1123Label(w.RuntimeClass)) > 0 {
		bad("ai_worker_config.runtime_class", "%q cannot be a RuntimeClass handler (the same name): lowercase letters, digits and '-', at most 63", w.RuntimeClass)
	}
	if w.WorkspacePVC == "" {
		bad("ai_worker_config.workspace_pvc", "must be set: the claim holding the data root")
	}
	if opts.Replicas < 0 || opts.Replicas > 1 && cfg.Store.Driver != config.StorePostgres {
		bad("--replicas", "must be 1 on SQLite (the servers of a cluster share a PostgreSQL database: store.driver postgres), got %d", opts.Replicas)
	}
	if cfg.Store.DSNFile != "" {
		bad("store.dsn_file", "names a file of one host: leave it out of the configuration rendered for a cluster (the connection string goes in Secret %s, key %s)", Server, StoreDSNKey)
	}
	if w.ServiceAccount == Server {
		bad("ai_worker_config.service_account", "must not be %q, the server's ServiceAccount: workers get no rights", Server)
	}
	if k.SecretName == Server {
		bad("kubernetes.secret_name", "must not be %q, the server's Secret: workers would get its token", Server)
	}
	if mp := w.WorkspaceMountPath; mp == "/" || path.Clean(mp) != mp || overlaps(mp, "/tmp") || overlaps(mp, ConfigDir) {
		bad("ai_worker_config.workspace_mount_path", "must be a clean absolute directory other than /, outside /tmp and %s (the server's), got %q", ConfigDir, mp)
	}
	if len(cfg.Workspaces.Roots) > 0 {
		bad("workspaces.roots", "names directories of one host, which the kubernetes runtime refuses: leave it out of the configuration rendered for a cluster")
	}
	if len(cfg.APITokens) > 0 {
		bad("api_tokens", "not rendered yet: their token files would need a volume; use the one token of the server's Secret (CORRAL_API_TOKEN)")
	}
	if cfg.Notify.SecretFile != "" {
		bad("notify.secret_file", "not rendered yet: the file would need a volume the non-root server can read at mode 0400; leave notify out of the configuration rendered for a cluster")
	}
	if k.SecretName == "" {
		for _, name := range config.AgentNames {
			if ag, _ := cfg.Agents.Get(name); len(ag.Env) > 0 {
				bad("agents."+name+".env", "would go in clear into a ConfigMap: set kubernetes.secret_name, and its keys become that Secret's")
			}
		}
	}
	if strings.TrimSpace(opts.ServerImage) == "" || strings.ContainsAny(opts.ServerImage, " \t\n") {
		bad("--server-image", "must be an image reference, got %q", opts.ServerImage)
	}
	if q, err := resource.ParseQuantity(opts.Storage); err != nil || q.Sign() <= 0 {
		bad("--storage", "must be a positive quantity such as 10Gi, got %q", opts.Storage)
	}
	if opts.StorageClass != "" {
		if e := validation.IsDNS1123Subdomain(opts.StorageClass); len(e) > 0 {
			bad("--storage-class", "%q is not a StorageClass name: %s", opts.StorageClass, strings.Join(e, "; "))
		}
	}
	return errors.Join(errs...)
}

// overlaps reports whether directory a is b, or one holds the other.
func overlaps(a, b string) bool {
	return a == b || strings.HasPrefix(a, b+"/") || strings.HasPrefix(b, a+"/")
}

// ServerURL is where worker pods reach the server: its Service.
func ServerURL(namespace string) string {
	return fmt.Sprintf("http://%s.%s.svc:%d", Server, namespace, Port)
}

// serverConfig is the server's configuration file: cfg as the server in
// the cluster needs it. Secrets come from the environment (the Secrets), so
// the secret-file keys are cleared, and each agent's environment is
// references (${AGENT_KEY}, expanded by --config.expand-env) to the
// agents' Secret's keys, which the server reads: it adds the API keys to
// the agents' model requests at the egress, and workers get no Secret.
func serverConfig(cfg *config.Config) ([]byte, error) {
	c := *cfg
	ns := c.AIWorker.Namespace
	c.Listen = fmt.Sprintf("0.0.0.0:%d", Port)
	c.Data = c.AIWorker.WorkspaceMountPath
	c.Runtime = kubernetes.Name
	c.Kubernetes.ServerURL = ServerURL(ns)
	c.Kubernetes.Kubeconfig = "" // the pod's service account
	c.APITokenFile = ""
	c.AIWorker.WebhookSecretFile = ""
	// Worker pods reach the egress proxies at the Service's egress port
	// (kubernetes.egress_addr follows from server_url).
	c.Kubernetes.EgressListen = fmt.Sprintf("0.0.0.0:%d", EgressPort)
	c.Kubernetes.EgressAddr = ""
	// Callers reach the server by its Service's names.
	hosts := slices.Clone(c.HTTP.AllowedHosts)
	for _, h := range []string{Server, Server + "." + ns, Server + "." + ns + ".svc", Server + "." + ns + ".svc.cluster.local"} {
		if !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	c.HTTP.AllowedHosts = hosts
	c.Agents.Claude.Env, c.Agents.Gemini.Env, c.Agents.Codex.Env, c.Agents.Opencode.Env, c.Agents.Command.Env = nil, nil, nil, nil, nil
	c.Kubernetes.SecretName = ""
	// The server expands the file's values: one of the source's holding a
	// $ would be read as a reference.
	plain, err := yaml.Marshal(&c)
	if err != nil {
		return nil, fmt.Errorf("encode the server's configuration: %w", err)
	}
	if bytes.Contains(plain, []byte("$")) {
		return nil, fmt.Errorf("a value of the configuration holds a $, which the server in the cluster would expand (it runs with --config.expand-env, for the agents' keys): %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Kubernetes.SecretName != "" {
		for _, name := range config.AgentNames {
			refs := map[string]string{}
			for _, k := range agentKeys(cfg, name) {
				refs[k] = "${" + AgentEnvPrefix + k + "}"
			}
			if len(refs) > 0 {
				ag, _ := c.Agents.Get(name)
				ag.Env = refs
				c.Agents.Set(name, ag)
			}
		}
	}
	var b bytes.Buffer
	b.WriteString("# corral serve's configuration, rendered by corral k8s render. Secrets come from\n# the environment (Secret " + Server + "), never from this file.\n")
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&c); err != nil {
		return nil, fmt.Errorf("encode the server's configuration: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode the server's configuration: %w", err)
	}
	return b.Bytes(), nil
}

// agentKeys are the keys of the agents' Secret agent name takes: its API
// keys (APIKeys) and the names its agents.*.env sets, sorted.
func agentKeys(cfg *config.Config, name string) []string {
	keys := slices.Clone(APIKeys[name])
	ag, _ := cfg.Agents.Get(name)
	for k := range ag.Env {
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// workerKeys are the keys of the agents' Secret: every agent's, sorted.
func workerKeys(cfg *config.Config) []string {
	var keys []string
	for _, name := range config.AgentNames {
		for _, k := range agentKeys(cfg, name) {
			if !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	slices.Sort(keys)
	return keys
}

// object is one manifest.
type object interface {
	runtime.Object
	metav1.Object
}

// meta is an object's metadata in the namespace ns ("" for a cluster-wide
// object).
func meta(name, ns string, labels map[string]string) metav1.ObjectMeta {
	l := maps.Clone(partOf)
	maps.Copy(l, labels)
	return metav1.ObjectMeta{Name: name, Namespace: ns, Labels: l}
}

func typeMeta(apiVersion, kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: apiVersion, Kind: kind}
}

// objects are the manifests, in the order kubectl must apply them (the
// namespace first).
func objects(cfg *config.Config, opts Options, serverCfg []byte) []object {
	w, k := cfg.AIWorker, cfg.Kubernetes
	ns := w.Namespace
	serverLabels := map[string]string{"app": Server}
	// Not labelled part of Corral: it may be the cluster's default.
	out := []object{&corev1.Namespace{TypeMeta: typeMeta("v1", "Namespace"), ObjectMeta: metav1.ObjectMeta{Name: ns}}}
	if w.RuntimeClass != "" {
		out = append(out, &nodev1.RuntimeClass{TypeMeta: typeMeta("node.k8s.io/v1", "RuntimeClass"), ObjectMeta: meta(w.RuntimeClass, "", nil), Handler: w.RuntimeClass})
	}
	out = append(out, &corev1.ServiceAccount{TypeMeta: typeMeta("v1", "ServiceAccount"), ObjectMeta: meta(Server, ns, serverLabels)})
	if w.ServiceAccount != "" {
		// Workers never talk to the API server: no token, no rights.
		out = append(out, &corev1.ServiceAccount{
			TypeMeta: typeMeta("v1", "ServiceAccount"), ObjectMeta: meta(w.ServiceAccount, ns, map[string]string{"app": kubernetes.AppWorker}),
			AutomountServiceAccountToken: new(false),
		})
	}
	out = append(out,
		&rbacv1.Role{TypeMeta: typeMeta("rbac.authorization.k8s.io/v1", "Role"), ObjectMeta: meta(Server, ns, serverLabels), Rules: Rules()},
		&rbacv1.RoleBinding{
			TypeMeta: typeMeta("rbac.authorization.k8s.io/v1", "RoleBinding"), ObjectMeta: meta(Server, ns, serverLabels),
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: Server, Namespace: ns}},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: Server},
		})
	if k.WarmPool > 0 {
		// Warm pods go first when a node runs short of memory: the
		// server lists the nodes to know, its one cluster-wide right,
		// rendered only where it keeps warm pods.
		name := NodeReader(ns)
		out = append(out,
			&rbacv1.ClusterRole{TypeMeta: typeMeta("rbac.authorization.k8s.io/v1", "ClusterRole"), ObjectMeta: meta(name, "", serverLabels),
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list"}}}},
			&rbacv1.ClusterRoleBinding{
				TypeMeta: typeMeta("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"), ObjectMeta: meta(name, "", serverLabels),
				Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: Server, Namespace: ns}},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			})
	}
	if !opts.NoSecrets {
		keys := []string{TokenKey, WebhookKey}
		if cfg.Store.Driver == config.StorePostgres {
			keys = append(keys, StoreDSNKey)
		}
		out = append(out, secret(Server, ns, serverLabels, keys))
		if k.SecretName != "" {
			out = append(out, secret(k.SecretName, ns, map[string]string{"app": kubernetes.AppWorker}, workerKeys(cfg)))
		}
	}
	out = append(out,
		&corev1.ConfigMap{TypeMeta: typeMeta("v1", "ConfigMap"), ObjectMeta: meta(Server, ns, serverLabels), Data: map[string]string{path.Base(ConfigFile): string(serverCfg)}},
		claim(cfg, opts))
	out = append(out, networkPolicies(ns)...)
	out = append(out,
		&corev1.Service{
			TypeMeta: typeMeta("v1", "Service"), ObjectMeta: meta(Server, ns, serverLabels),
			Spec: corev1.ServiceSpec{
				Type:     corev1.ServiceTypeClusterIP,
				Selector: serverLabels,
				Ports: []corev1.ServicePort{
					{Name: "http", Port: Port, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP},
					{Name: "egress", Port: EgressPort, TargetPort: intstr.FromString("egress"), Protocol: corev1.ProtocolTCP},
				},
			},
		},
		deployment(cfg, opts, serverCfg))
	if opts.Replicas > 1 {
		// A drain takes one replica at a time: the others adopt its tasks.
		out = append(out, &policyv1.PodDisruptionBudget{
			TypeMeta: typeMeta("policy/v1", "PodDisruptionBudget"), ObjectMeta: meta(Server, ns, serverLabels),
			Spec: policyv1.PodDisruptionBudgetSpec{
				MaxUnavailable: new(intstr.FromInt32(1)),
				Selector:       &metav1.LabelSelector{MatchLabels: serverLabels},
			},
		})
	}
	return out
}

// NodeReader names the ClusterRole, and its binding, that lets the server
// of namespace ns list nodes (kubernetes.warm_pool only): cluster-wide
// objects, so named after the namespace.
func NodeReader(ns string) string { return Server + "-" + ns + "-nodes" }

// Rules are the server's rights in its namespace: exactly what the
// kubernetes runtime calls (internal/sandbox/kubernetes), nothing more.
func Rules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		// Create makes a Job, job() gets it, the informer lists and
		// watches them, Destroy deletes it; a warm pod's claim patches
		// its Job's labels and deadline.
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create", "get", "list", "watch", "delete", "patch"}},
		// The informer lists and watches pods, Destroy lists what is left;
		// Stop deletes one, Destroy deletes a sandbox's by label. The Job
		// controller makes them: the server never creates a pod.
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch", "delete", "deletecollection"}},
		// Each sandbox's environment Secret: made, then updated to be
		// owned by its Job, deleted by Destroy. No get or list: the server
		// cannot read the workers' API keys.
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create", "update", "delete"}},
	}
}

// secret is a Secret template: every key's value is the placeholder.
func secret(name, ns string, labels map[string]string, keys []string) *corev1.Secret {
	data := map[string]string{}
	for _, k := range keys {
		data[k] = config.Placeholder
	}
	return &corev1.Secret{TypeMeta: typeMeta("v1", "Secret"), ObjectMeta: meta(name, ns, labels), Type: corev1.SecretTypeOpaque, StringData: data}
}

// claim is the volume that holds the data root.
func claim(cfg *config.Config, opts Options) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{
		TypeMeta: typeMeta("v1", "PersistentVolumeClaim"), ObjectMeta: meta(cfg.AIWorker.WorkspacePVC, cfg.AIWorker.Namespace, nil),
		Spec: corev1.PersistentVolumeClaimSpec{
			// The server and every worker pod, on any node, mount it.
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(opts.Storage)}},
		},
	}
	if opts.StorageClass != "" {
		pvc.Spec.StorageClassName = new(opts.StorageClass)
	}
	return pvc
}

// networkPolicies keep worker pods to DNS and the server (seed 000's
// policy less its open port 443: the server's egress proxy is the way
// out), and let nothing reach them.
func networkPolicies(ns string) []object {
	workers := metav1.LabelSelector{MatchLabels: map[string]string{"app": kubernetes.AppWorker}}
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	dns, server, proxy := intstr.FromInt32(53), intstr.FromInt32(Port), intstr.FromInt32(EgressPort)
	return []object{
		&networkingv1.NetworkPolicy{
			TypeMeta: typeMeta("networking.k8s.io/v1", "NetworkPolicy"), ObjectMeta: meta(WorkerEgress, ns, nil),
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: workers,
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Egress: []networkingv1.NetworkPolicyEgressRule{
					{
						// The cluster's DNS, in kube-system only: a pod
						// labelled k8s-app=kube-dns elsewhere is anyone's.
						To: []networkingv1.NetworkPolicyPeer{{
							NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
							PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
						}},
						Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns}},
					},
					{
						// The server: workers' webhooks, and their egress
						// through its proxies.
						To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": Server}}}},
						Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &server}, {Protocol: &tcp, Port: &proxy}},
					},
				},
			},
		},
		&networkingv1.NetworkPolicy{
			TypeMeta: typeMeta("networking.k8s.io/v1", "NetworkPolicy"), ObjectMeta: meta(WorkerIngress, ns, nil),
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: workers,
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			},
		},
	}
}

// deployment is the server, non-root, its data root on the claim: on
// SQLite one replica, replaced by Recreate (never two servers on one
// SQLite file); on PostgreSQL opts.Replicas of them, replaced one at a
// time, each ready only while it holds its lease on the database
// (/healthz).
func deployment(cfg *config.Config, opts Options, serverCfg []byte) *appsv1.Deployment {
	labels := map[string]string{"app": Server}
	mount := cfg.AIWorker.WorkspaceMountPath
	id := int64(uid)
	sum := sha256.Sum256(serverCfg)
	fromSecret := func(name, key string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: Server}, Key: key}}}
	}
	probe := func(period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}},
			PeriodSeconds:    period,
			FailureThreshold: failures,
			TimeoutSeconds:   5,
		}
	}
	env := []corev1.EnvVar{fromSecret("CORRAL_API_TOKEN", TokenKey), fromSecret("AI_WORKER_WEBHOOK_SECRET", WebhookKey)}
	strategy := appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	if cfg.Store.Driver == config.StorePostgres {
		env = append(env, fromSecret("CORRAL_STORE_DSN", StoreDSNKey))
		// A new replica is ready before an old one goes: the others adopt
		// what the old one ran.
		strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
			MaxUnavailable: new(intstr.FromInt32(0)), MaxSurge: new(intstr.FromInt32(1)),
		}}
	}
	restricted := &corev1.SecurityContext{
		AllowPrivilegeEscalation: new(false),
		Privileged:               new(false),
		ReadOnlyRootFilesystem:   new(true),
		RunAsNonRoot:             new(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	pod := corev1.PodSpec{
		// A stop ends what the server runs within limits.stop_grace and
		// 10 s (shutdown: stop); Kubernetes waits that long, and 5 s of
		// margin, before it kills the server.
		TerminationGracePeriodSeconds: new(int64(max(30*time.Second, time.Duration(cfg.Limits.StopGrace)+15*time.Second) / time.Second)),
		ServiceAccountName:            Server,
		AutomountServiceAccountToken:  new(true), // it creates the workers' Jobs
		EnableServiceLinks:            new(false),
		SecurityContext: &corev1.PodSecurityContext{
			RunAsUser: &id, RunAsGroup: &id, FSGroup: &id, RunAsNonRoot: new(true),
			FSGroupChangePolicy: new(corev1.FSGroupChangeOnRootMismatch),
			SeccompProfile:      &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		// The server closes its data root to other users (mode 0710),
		// which only the directory's owner may do, and a new volume's
		// root is usually root's: this gives it to uid 1000, with the
		// one capability that takes, before the server starts.
		InitContainers: []corev1.Container{{
			Name:         "own-data-root",
			Image:        opts.ServerImage,
			Command:      []string{"chown", fmt.Sprintf("%d:%d", uid, uid), mount},
			VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: mount}},
			SecurityContext: &corev1.SecurityContext{
				RunAsUser: new(int64(0)), RunAsGroup: new(int64(0)), RunAsNonRoot: new(false),
				AllowPrivilegeEscalation: new(false),
				Privileged:               new(false),
				ReadOnlyRootFilesystem:   new(true),
				Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"CHOWN"}},
			},
		}},
		Containers: []corev1.Container{{
			Name:  Server,
			Image: opts.ServerImage,
			Args:  []string{"serve", "--config", ConfigFile, "--config.expand-env"},
			Ports: []corev1.ContainerPort{
				{Name: "http", ContainerPort: Port, Protocol: corev1.ProtocolTCP},
				{Name: "egress", ContainerPort: EgressPort, Protocol: corev1.ProtocolTCP},
			},
			Env:     env,
			EnvFrom: agentSecret(cfg),
			VolumeMounts: []corev1.VolumeMount{
				{Name: "data", MountPath: mount},
				{Name: "config", MountPath: ConfigDir, ReadOnly: true},
				{Name: "tmp", MountPath: "/tmp"},
			},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
			},
			// Start-up rebuilds the projections from the event store:
			// up to 5 minutes before liveness counts.
			StartupProbe:    probe(5, 60),
			LivenessProbe:   probe(10, 3),
			ReadinessProbe:  probe(5, 3),
			SecurityContext: restricted,
		}},
		Volumes: []corev1.Volume{
			{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: cfg.AIWorker.WorkspacePVC}}},
			{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: Server}}}},
			{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: new(resource.MustParse("1Gi"))}}},
		},
	}
	return &appsv1.Deployment{
		TypeMeta: typeMeta("apps/v1", "Deployment"), ObjectMeta: meta(Server, cfg.AIWorker.Namespace, labels),
		Spec: appsv1.DeploymentSpec{
			Replicas: new(int32(opts.Replicas)),
			Strategy: strategy,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels: labels,
					// A changed configuration restarts the server.
					Annotations: map[string]string{"corral.dev/config-sha256": hex.EncodeToString(sum[:])},
				},
				Spec: pod,
			},
		},
	}
}

// agentSecret gives the server the agents' Secret (kubernetes.secret_name),
// its keys prefixed (AgentEnvPrefix): the server adds the API keys at the
// egress, and no worker pod gets them. Optional: an agent without a key
// still starts, and says what it lacks.
func agentSecret(cfg *config.Config) []corev1.EnvFromSource {
	name := cfg.Kubernetes.SecretName
	if name == "" {
		return nil
	}
	return []corev1.EnvFromSource{{Prefix: AgentEnvPrefix, SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Optional: new(true)}}}
}

// toYAML is obj as a YAML document, without the empty status and
// creationTimestamp a typed object always carries.
func toYAML(obj object) ([]byte, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("convert %s %s: %w", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
	}
	delete(m, "status")
	if md, ok := m["metadata"].(map[string]any); ok {
		delete(md, "creationTimestamp")
	}
	if spec, ok := m["spec"].(map[string]any); ok {
		if tmpl, ok := spec["template"].(map[string]any); ok {
			if md, ok := tmpl["metadata"].(map[string]any); ok {
				delete(md, "creationTimestamp")
			}
		}
	}
	return sigsyaml.Marshal(m)
}

// header is the comment that opens the stream: what to edit before
// applying, and what is not done yet.
func header(cfg *config.Config, opts Options) string {
	w, k := cfg.AIWorker, cfg.Kubernetes
	src := opts.Source
	if src == "" {
		src = "the default configuration"
	}
	var b strings.Builder
	p := func(format string, args ...any) {
		fmt.Fprintln(&b, strings.TrimSpace("# "+fmt.Sprintf(format, args...)))
	}
	p("Corral on Kubernetes, rendered by `corral k8s render` from %s.", src)
	p("Namespace %s; server %s (Deployment, Service, ServiceAccount, Role, Secret and", w.Namespace, Server)
	p("ConfigMap %s); workers run image %s.", Server, w.AICoderImage)
	p("")
	p("Before applying:")
	if opts.NoSecrets {
		p("- Secrets: left out (--no-secrets); Secret %s (keys %s, %s) must exist.", Server, TokenKey, WebhookKey)
	} else {
		p("- Secrets: replace every %s. Secret %s: %s is the API's bearer token,", config.Placeholder, Server, TokenKey)
		p("  %s signs workers' completions (e.g. `openssl rand -hex 32` each); the", WebhookKey)
		p("  server refuses to start while either is %s.", config.Placeholder)
		if cfg.Store.Driver == config.StorePostgres {
			p("  %s is the PostgreSQL connection string (a secret: it may hold a password).", StoreDSNKey)
		}
		if k.SecretName != "" {
			p("  Secret %s: the agents' API keys, which the server reads (as %sKEY) and", k.SecretName, AgentEnvPrefix)
			p("  adds to the agents' model requests at the egress: no worker gets them.")
			p("  Set a key you do not use to \"\" (its configuration names every key, and")
			p("  the server will not start without one).")
		}
		p("  Applying this file again puts %s back: render with --no-secrets", config.Placeholder)
		p("  once the Secrets are filled in, or leave them out.")
	}
	p("- Images: the nodes must be able to pull (or have loaded) %s and %s.", opts.ServerImage, w.AICoderImage)
	p("- Storage: claim %s (%s, ReadWriteMany) needs a storage class that offers", w.WorkspacePVC, opts.Storage)
	if opts.StorageClass != "" {
		p("  ReadWriteMany: %s.", opts.StorageClass)
	} else {
		p("  ReadWriteMany; none named (--storage-class), so the cluster's default.")
	}
	if w.RuntimeClass != "" {
		p("- RuntimeClass %s uses the nodes' runtime handler %q; change the handler", w.RuntimeClass, w.RuntimeClass)
		p("  to the name your nodes give it (gVisor's is often runsc), or delete the")
		p("  RuntimeClass if the cluster has one.")
	}
	if sp := cfg.Kubernetes.SeccompProfile; sp != "" {
		p("- Seccomp: worker pods run under the Localhost profile %s, which must be on", sp)
		p("  every node first: `corral k8s seccomp > /var/lib/kubelet/seccomp/%s`", sp)
		p("  (`corral k8s seccomp --gvisor` for a gVisor RuntimeClass whose runsc runs")
		p("  with oci-seccomp; --arch amd64 or arm64 for the nodes' architecture, if not")
		p("  this machine's). A node without it cannot start a worker.")
	} else {
		p("- Seccomp: worker pods run under the runtime's default profile, which allows")
		p("  ptrace and io_uring; kubernetes.seccomp_profile names Corral's stricter one.")
	}
	p("")
	p("NetworkPolicies: worker pods (app=%s) may reach only the cluster DNS and", kubernetes.AppWorker)
	p("the server's ports %d (webhooks) and %d (the egress proxies, which allow", Port, EgressPort)
	p("what egress.mode and egress.allow say), and nothing may reach them. Only a")
	p("CNI that enforces NetworkPolicies applies them; with one that does not,")
	p("workers reach any address directly, past the proxies.")
	p("")
	p("The ConfigMap holds the configuration as rendered, with these set for the")
	p("cluster: listen 0.0.0.0:%d, kubernetes.egress_listen 0.0.0.0:%d,", Port, EgressPort)
	p("data %s (the claim), runtime kubernetes,", w.WorkspaceMountPath)
	p("kubernetes.server_url %s, the Service's names in http.allowed_hosts,", ServerURL(w.Namespace))
	p("no kubeconfig (the pod's ServiceAccount), no secret files, no kubernetes.secret_name,")
	p("and agents.*.env as references to the agents' Secret's keys (--config.expand-env).")
	p("")
	if opts.Replicas > 1 {
		p("Servers: %d replicas on one PostgreSQL database (docs/replicas.md), each ready", opts.Replicas)
		p("only while it holds its lease on the database; a PodDisruptionBudget lets a")
		p("drain take one at a time, and the others adopt what it ran.")
	} else {
		p("Server: one replica (--replicas; more need store.driver postgres).")
	}
	p("")
	p("Apply: kubectl apply -f FILE. `kubectl delete -f FILE` deletes the claim too,")
	p("and everything on it.")
	return b.String()
}
