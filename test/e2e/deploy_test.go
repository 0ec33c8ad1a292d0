package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// deployDir holds the kustomize overlays and components users apply.
const deployDir = "../../deploy"

// TestDeployManifestsValidate builds every overlay in deploy/overlays and
// every example in deploy/examples with kustomize and has a real
// kube-apiserver validate each object, as
// `kubectl apply --dry-run=server --validate=strict` does: a dry-run create
// with strict field validation, so an unknown or misplaced field, a bad
// quantity or a missing required field fails the test. Namespaces are
// created for real (namespaced objects need theirs), everything else only
// validated. The CRDs of prometheus-operator and cert-manager the full
// overlay uses are stood in for by deploy/testdata/crds.yaml.
func TestDeployManifestsValidate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cp, _ := startControlPlane(ctx, t, nil)
	v := newValidator(t, cp.Config)

	crds := readObjects(t, filepath.Join(deployDir, "testdata", "crds.yaml"))
	for _, crd := range crds {
		if err := v.create(ctx, crd, false); err != nil {
			t.Fatalf("CRD %s: %v", crd.GetName(), err)
		}
	}
	for _, crd := range crds {
		if err := v.waitEstablished(ctx, crd.GetName()); err != nil {
			t.Fatal(err)
		}
	}

	// The same path must refuse a misspelt field, or it proves nothing.
	broken := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1",
		"kind":       "Deployment",
		"metadata":   map[string]any{"name": "broken", "namespace": "default"},
		"spec": map[string]any{
			"replicaz": int64(1),
			"selector": map[string]any{"matchLabels": map[string]any{"app": "broken"}},
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{"app": "broken"}},
				"spec":     map[string]any{"containers": []any{map[string]any{"name": "c", "image": "busybox"}}},
			},
		},
	}}
	err := v.create(ctx, broken, true)
	if !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), "replicaz") {
		t.Fatalf("a Deployment with spec.replicaz: got %v, want BadRequest naming the field", err)
	}
	t.Logf("refused, as it should be: %v", err)

	var kustomizations []string
	for _, what := range []string{"overlays", "examples"} {
		dirs, err := filepath.Glob(filepath.Join(deployDir, what, "*"))
		if err != nil || len(dirs) == 0 {
			t.Fatalf("nothing in %s/%s: %v", deployDir, what, err)
		}
		kustomizations = append(kustomizations, dirs...)
	}
	for _, dir := range kustomizations {
		objs, err := kustomizeBuild(dir)
		if err != nil {
			t.Errorf("%s: %v", dir, err)
			continue
		}
		n := 0
		// Namespaces first, for real: the dry runs in them need them.
		for _, namespaces := range []bool{true, false} {
			for _, o := range objs {
				if (o.GetKind() == "Namespace") != namespaces {
					continue
				}
				if err := v.create(ctx, o, !namespaces); err != nil {
					t.Errorf("%s: %s %s/%s: %v", dir, o.GetKind(), o.GetNamespace(), o.GetName(), err)
					continue
				}
				n++
			}
		}
		t.Logf("%s: %d of %d objects validated", dir, n, len(objs))
	}
	if w := v.warnings.all(); len(w) > 0 {
		t.Errorf("the apiserver warned:\n%s", strings.Join(w, "\n"))
	}
}

// kustomizeBuild is `kustomize build dir`, with kustomize's Go API.
func kustomizeBuild(dir string) ([]*unstructured.Unstructured, error) {
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, r := range m.Resources() {
		b, err := r.MarshalJSON()
		if err != nil {
			return nil, err
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(b); err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

// readObjects decodes a multi-document YAML file.
func readObjects(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

// validator creates objects of any kind through the dynamic client, finding
// their resources by discovery, and keeps the apiserver's warnings.
type validator struct {
	dynamic  dynamic.Interface
	mapper   *restmapper.DeferredDiscoveryRESTMapper
	warnings warningRecorder
}

func newValidator(t *testing.T, config *rest.Config) *validator {
	t.Helper()
	v := &validator{}
	config = rest.CopyConfig(config)
	config.WarningHandler = &v.warnings
	dc, err := discovery.NewDiscoveryClientForConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	if v.dynamic, err = dynamic.NewForConfig(config); err != nil {
		t.Fatal(err)
	}
	v.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	return v
}

// resource finds the object's resource, reading discovery again while the
// kind is unknown: a CRD just created takes a moment to appear there.
func (v *validator) resource(ctx context.Context, o *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := o.GroupVersionKind()
	var mapping *meta.RESTMapping
	err := retry(ctx, 30*time.Second, func() error {
		var err error
		if mapping, err = v.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); meta.IsNoMatchError(err) {
			v.mapper.Reset()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		if o.GetNamespace() == "" {
			return nil, fmt.Errorf("%s %s is namespaced and names no namespace", gvk.Kind, o.GetName())
		}
		return v.dynamic.Resource(mapping.Resource).Namespace(o.GetNamespace()), nil
	}
	if o.GetNamespace() != "" {
		return nil, fmt.Errorf("%s %s is cluster-scoped and names namespace %s", gvk.Kind, o.GetName(), o.GetNamespace())
	}
	return v.dynamic.Resource(mapping.Resource), nil
}

// create creates o with strict field validation, as a dry run or for real.
// An object created for real that exists already (a namespace two overlays
// share) is validated by a dry-run update instead.
func (v *validator) create(ctx context.Context, o *unstructured.Unstructured, dryRun bool) error {
	r, err := v.resource(ctx, o)
	if err != nil {
		return err
	}
	opts := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = r.Create(ctx, o, opts)
	if dryRun || !apierrors.IsAlreadyExists(err) {
		return err
	}
	have, err := r.Get(ctx, o.GetName(), metav1.GetOptions{})
	if err != nil {
		return err
	}
	o = o.DeepCopy()
	o.SetResourceVersion(have.GetResourceVersion())
	_, err = r.Update(ctx, o, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict})
	return err
}

// waitEstablished waits until the CRD name serves its resource.
func (v *validator) waitEstablished(ctx context.Context, name string) error {
	crds := v.dynamic.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	return retry(ctx, 30*time.Second, func() error {
		crd, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		conditions, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, c := range conditions {
			if c, _ := c.(map[string]any); c["type"] == "Established" && c["status"] == "True" {
				return nil
			}
		}
		return fmt.Errorf("CRD %s is not established: %v", name, conditions)
	})
}

// retry calls f until it succeeds or the time is up, returning its last error.
func retry(ctx context.Context, limit time.Duration, f func() error) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}
