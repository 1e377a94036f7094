package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// client is the little of the API the runtime uses: Jobs, pods and
// Secrets in one namespace. It speaks REST with a scheme of batch/v1 and
// core/v1 alone, rather than through client-go's clientset, whose scheme
// registers every API group when the package loads: that would run in
// every corral process, each sandbox's worker included.
type client struct {
	batch, core rest.Interface
	ns          string
	params      runtime.ParameterCodec
}

func newClient(cfg *rest.Config, ns string) (*client, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{batchv1.AddToScheme, corev1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	codecs := serializer.NewCodecFactory(scheme).WithoutConversion()
	restFor := func(gv schema.GroupVersion, apiPath string) (rest.Interface, error) {
		c := rest.CopyConfig(cfg)
		c.GroupVersion, c.APIPath, c.NegotiatedSerializer = &gv, apiPath, codecs
		if c.UserAgent == "" {
			c.UserAgent = "corral"
		}
		// client-go's default, 5 requests a second, is a controller's:
		// a task's claim of a warm pod alone makes four, and tasks come
		// in bursts. The API server's priority and fairness bounds what
		// it takes.
		if c.QPS == 0 {
			c.QPS, c.Burst = 200, 400
		}
		return rest.RESTClientFor(c)
	}
	batch, err := restFor(batchv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, err
	}
	core, err := restFor(corev1.SchemeGroupVersion, "/api")
	if err != nil {
		return nil, err
	}
	return &client{batch: batch, core: core, ns: ns, params: runtime.NewParameterCodec(scheme)}, nil
}

// version is the API server's version (GET /version).
func (c *client) version(ctx context.Context) (string, error) {
	b, err := c.core.Get().AbsPath("/version").DoRaw(ctx)
	if err != nil {
		return "", err
	}
	var v struct {
		GitVersion string `json:"gitVersion"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return "", fmt.Errorf("read /version: %w", err)
	}
	return v.GitVersion, nil
}

// api is the REST client of resource's group.
func (c *client) api(resource string) rest.Interface {
	if resource == "jobs" {
		return c.batch
	}
	return c.core
}

func (c *client) get(ctx context.Context, resource, name string, into runtime.Object) error {
	return c.api(resource).Get().Namespace(c.ns).Resource(resource).Name(name).Do(ctx).Into(into)
}

func (c *client) create(ctx context.Context, resource string, obj, into runtime.Object) error {
	return c.api(resource).Post().Namespace(c.ns).Resource(resource).Body(obj).Do(ctx).Into(into)
}

func (c *client) update(ctx context.Context, resource, name string, obj, into runtime.Object) error {
	return c.api(resource).Put().Namespace(c.ns).Resource(resource).Name(name).Body(obj).Do(ctx).Into(into)
}

// patch merges the JSON merge patch body into the resource name.
func (c *client) patch(ctx context.Context, resource, name string, body []byte, into runtime.Object) error {
	return c.api(resource).Patch(types.MergePatchType).Namespace(c.ns).Resource(resource).Name(name).Body(body).Do(ctx).Into(into)
}

func (c *client) delete(ctx context.Context, resource, name string, opts metav1.DeleteOptions) error {
	return c.api(resource).Delete().Namespace(c.ns).Resource(resource).Name(name).Body(&opts).Do(ctx).Error()
}

// deleteAll deletes the resources selector picks.
func (c *client) deleteAll(ctx context.Context, resource, selector string, opts metav1.DeleteOptions) error {
	return c.api(resource).Delete().Namespace(c.ns).Resource(resource).
		VersionedParams(&metav1.ListOptions{LabelSelector: selector}, c.params).Body(&opts).Do(ctx).Error()
}

func (c *client) listJobs(ctx context.Context, selector string) (*batchv1.JobList, error) {
	var l batchv1.JobList
	err := c.batch.Get().Namespace(c.ns).Resource("jobs").
		VersionedParams(&metav1.ListOptions{LabelSelector: selector}, c.params).Do(ctx).Into(&l)
	return &l, err
}

func (c *client) listPods(ctx context.Context, selector string) (*corev1.PodList, error) {
	var l corev1.PodList
	err := c.core.Get().Namespace(c.ns).Resource("pods").
		VersionedParams(&metav1.ListOptions{LabelSelector: selector}, c.params).Do(ctx).Into(&l)
	return &l, err
}

// informer watches the resources selector picks.
func (c *client) informer(resource, selector string, obj runtime.Object) cache.SharedIndexInformer {
	lw := cache.NewFilteredListWatchFromClient(c.api(resource), resource, c.ns, func(o *metav1.ListOptions) { o.LabelSelector = selector })
	return cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

// nodes lists the cluster's nodes.
func (c *client) nodes(ctx context.Context) (*corev1.NodeList, error) {
	var l corev1.NodeList
	err := c.core.Get().AbsPath("/api/v1/nodes").Do(ctx).Into(&l)
	return &l, err
}

// exists reports whether the object at the API path p is there; an
// answer other than found or not found is the error.
func (c *client) exists(ctx context.Context, p string) (bool, error) {
	err := c.core.Get().AbsPath(p).Do(ctx).Error()
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, err
}

// allowed asks the API server whether this client may do verb on
// resource (of group) in its namespace.
func (c *client) allowed(ctx context.Context, verb, group, resource string) (bool, error) {
	review := map[string]any{
		"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
		"spec": map[string]any{"resourceAttributes": map[string]string{"namespace": c.ns, "verb": verb, "group": group, "resource": resource}},
	}
	body, _ := json.Marshal(review)
	b, err := c.core.Post().AbsPath("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews").SetHeader("Content-Type", "application/json").Body(body).DoRaw(ctx)
	if err != nil {
		return false, err
	}
	var res struct {
		Status struct {
			Allowed bool `json:"allowed"`
		} `json:"status"`
	}
	return res.Status.Allowed, json.Unmarshal(b, &res)
}

// claimPhase is the phase of claim name ("" if it is not there).
func (c *client) claimPhase(ctx context.Context, name string) (string, error) {
	var pvc corev1.PersistentVolumeClaim
	err := c.get(ctx, "persistentvolumeclaims", name, &pvc)
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	return string(pvc.Status.Phase), err
}
