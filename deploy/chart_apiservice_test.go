package deploy_test

import (
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

// cluster is what the chart's lookup sees: a fake cluster of objs.
type cluster struct {
	client *dynamicfake.FakeDynamicClient
}

func (c cluster) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return nil, false, err
	}
	resource := strings.ToLower(kind) + "s"
	return c.client.Resource(gv.WithResource(resource)), kind != "APIService" && kind != "Namespace", nil
}

func newCluster(objs ...runtime.Object) cluster {
	gvr := schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}
	lists := map[schema.GroupVersionResource]string{gvr: "APIServiceList", {Version: "v1", Resource: "namespaces"}: "NamespaceList"}
	return cluster{dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), lists, objs...)}
}

func apiService(namespace, service string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": "v1beta1.external.metrics.k8s.io"},
		"spec":     map[string]any{"group": "external.metrics.k8s.io", "version": "v1beta1", "service": map[string]any{"namespace": namespace, "name": service}},
	}}
}

// TestChartRegistersTheAPIServiceWhenFree: adapter.apiService auto, the
// default, registers gpupool-adapter as v1beta1.external.metrics.k8s.io
// on a cluster where no APIService holds it, keeps it where its own
// does, and leaves it to KEDA's metrics server where that holds it;
// true takes it, false never; NOTES.txt says which and why.
func TestChartRegistersTheAPIServiceWhenFree(t *testing.T) {
	ch, err := loader.Load("helm/gpupool")
	if err != nil {
		t.Fatal(err)
	}
	keda := apiService("keda", "keda-operator-metrics-apiserver")
	for _, tc := range []struct {
		name       string
		mode       any
		cluster    cluster
		registered bool
		notes      string
	}{
		{"auto, nothing there", "auto", newCluster(), true,
			"registered as v1beta1.external.metrics.k8s.io for the HPA (adapter.apiService: auto, and no other service held it)"},
		{"auto, its own", "auto", newCluster(apiService("gpupool", "gpupool-adapter")), true,
			"registered as v1beta1.external.metrics.k8s.io for the HPA (adapter.apiService: auto, and no other service held it)"},
		{"auto, KEDA's", "auto", newCluster(keda), false,
			"not registered as v1beta1.external.metrics.k8s.io: keda/keda-operator-metrics-apiserver holds it (KEDA's metrics server, or prometheus-adapter), and adapter.apiService is auto"},
		{"true, KEDA's", true, newCluster(keda), true, "registered as v1beta1.external.metrics.k8s.io for the HPA;"},
		{"false, nothing there", false, newCluster(), false, "not registered as v1beta1.external.metrics.k8s.io (adapter.apiService: false)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			caps := chartutil.DefaultCapabilities.Copy()
			caps.KubeVersion = chartutil.KubeVersion{Version: "v1.37.2", Major: "1", Minor: "37"}
			values, err := chartutil.ToRenderValues(ch, map[string]any{"adapter": map[string]any{"apiService": tc.mode}},
				chartutil.ReleaseOptions{Name: "bf-cluster", Namespace: "gpupool", IsInstall: true}, caps)
			if err != nil {
				t.Fatal(err)
			}
			files, err := engine.RenderWithClientProvider(ch, values, tc.cluster)
			if err != nil {
				t.Fatal(err)
			}
			rendered := strings.Contains(files["gpupool/templates/apiservice.yaml"], "kind: APIService")
			job := files["gpupool/templates/secrets.yaml"]
			if rendered != tc.registered || strings.Contains(job, "--apiservice=v1beta1.external.metrics.k8s.io") != tc.registered {
				t.Errorf("the APIService rendered %v, the Job sets its caBundle %v; want %v", rendered, !rendered, tc.registered)
			}
			if notes := files["gpupool/templates/NOTES.txt"]; !strings.Contains(notes, "the external-metrics adapter, "+tc.notes) {
				t.Errorf("NOTES.txt:\n%s\nwant %q", notes, tc.notes)
			}
		})
	}
}
