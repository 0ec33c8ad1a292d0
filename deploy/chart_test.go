package deploy_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint/support"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// The chart is rendered here with Helm's own engine and values checks, as
// `helm template` does; test/e2e installs it with the helm CLI.

// renderChart renders deploy/helm/gpupool with vals, released in the
// namespace gpupool (the manifests'), on a cluster that serves the extra
// API versions.
func renderChart(t *testing.T, vals map[string]any, apis ...string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	return renderChartIn(t, "gpupool", vals, apis...)
}

func renderChartIn(t *testing.T, namespace string, vals map[string]any, apis ...string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	return renderTemplates(t, namespace, vals, false, apis...)
}

// renderChartAndTests is renderChart with the pods `helm test` runs
// (templates/tests).
func renderChartAndTests(t *testing.T, vals map[string]any) ([]*unstructured.Unstructured, error) {
	t.Helper()
	return renderTemplates(t, "gpupool", vals, true)
}

func renderTemplates(t *testing.T, namespace string, vals map[string]any, tests bool, apis ...string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	ch, err := loader.Load("helm/gpupool")
	if err != nil {
		t.Fatal(err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.37.2", Major: "1", Minor: "37"}
	caps.APIVersions = append(caps.APIVersions, apis...)
	values, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "bf-cluster", Namespace: namespace, IsInstall: true}, caps)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, values)
	if err != nil {
		return nil, err
	}
	var objs []*unstructured.Unstructured
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if strings.HasSuffix(name, "NOTES.txt") || (strings.Contains(name, "/tests/") && !tests) {
			continue
		}
		for _, doc := range strings.Split(files[name], "\n---\n") {
			if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" {
				continue
			}
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
				t.Fatalf("%s does not parse: %v\n%s", name, err, doc)
			}
			if u.Object != nil {
				objs = append(objs, u)
			}
		}
	}
	return objs, nil
}

func mustRenderChart(t *testing.T, vals map[string]any, apis ...string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := renderChart(t, vals, apis...)
	if err != nil {
		t.Fatalf("rendering the chart with %v: %v", vals, err)
	}
	return objs
}

var kustomizeHash = regexp.MustCompile(`(gpupool-(?:endpoints|kubernetes|kube-scheduler-config|allocator-config|tokens))-[a-z0-9]{10}\b`)

// byID indexes objects by kind/namespace/name, with kustomize's hash
// suffixes dropped, without the chart's checksum annotations (the chart
// rolls pods by them where kustomize rolls them by the hashed names), and
// without the objects only one side makes.
func byID(t *testing.T, objs []*unstructured.Unstructured, skip func(id string) bool) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, o := range objs {
		b, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		var obj map[string]any
		if err := yaml.Unmarshal(kustomizeHash.ReplaceAll(b, []byte("$1")), &obj); err != nil {
			t.Fatal(err)
		}
		u := unstructured.Unstructured{Object: obj}
		id := u.GetKind() + "/" + u.GetNamespace() + "/" + u.GetName()
		if skip(id) {
			continue
		}
		// Helm's hook annotations (the namespace is one) say when helm
		// creates an object, not what it is.
		for k := range u.GetAnnotations() {
			if strings.HasPrefix(k, "helm.sh/hook") {
				unstructured.RemoveNestedField(obj, "metadata", "annotations", k)
			}
		}
		if ann, ok, _ := unstructured.NestedStringMap(obj, "spec", "template", "metadata", "annotations"); ok {
			for k := range ann {
				if strings.HasPrefix(k, "checksum/") {
					unstructured.RemoveNestedField(obj, "spec", "template", "metadata", "annotations", k)
				}
			}
			if ann, _, _ := unstructured.NestedMap(obj, "spec", "template", "metadata", "annotations"); len(ann) == 0 {
				unstructured.RemoveNestedField(obj, "spec", "template", "metadata", "annotations")
			}
		}
		if _, dup := out[id]; dup {
			t.Errorf("%s twice", id)
		}
		out[id] = obj
	}
	return out
}

// chartMade are the objects only the chart makes: the Secrets kustomize
// leaves to the user (tokens, certificates; deploy/README.md), and the
// hook Job that makes them in the cluster, with its ServiceAccount and
// roles.
func chartMade(id string) bool {
	return strings.HasPrefix(id, "Secret/") || strings.HasSuffix(id, "/gpupool-secrets")
}

// TestChartIsTheOverlays renders the chart as each overlay installs
// gpupool and compares the two object by object: the chart's templates are
// generated from the manifests, and this is what keeps them one.
func TestChartIsTheOverlays(t *testing.T) {
	const monitoring, certManager = "monitoring.coreos.com/v1", "cert-manager.io/v1"
	example := func(id string) bool { return strings.Contains(id, "/ml/") || id == "Namespace//ml" }
	for _, tc := range []struct {
		overlay string
		vals    map[string]any
		apis    []string
		// differs are the objects whose fields values set, where the
		// overlay keeps its own (the etcd overlay's two replicas).
		differs []string
	}{
		// The two without the APIService component: the chart's auto would
		// register it on a cluster where no other service holds it.
		{overlay: "overlays/embedded", vals: map[string]any{"dashboards": map[string]any{"enabled": false}, "adapter": map[string]any{"apiService": false}}},
		{
			overlay: "overlays/etcd",
			vals: map[string]any{"controller": map[string]any{"replicas": 2}, "dashboards": map[string]any{"enabled": false},
				"adapter": map[string]any{"apiService": false}},
		},
		{
			overlay: "overlays/full",
			vals: map[string]any{"scheduler": map[string]any{"enabled": true}, "adapter": map[string]any{"apiService": true},
				"certs": map[string]any{"certManager": true}},
			apis: []string{monitoring, certManager},
		},
	} {
		t.Run(tc.overlay, func(t *testing.T) {
			chart := byID(t, mustRenderChart(t, tc.vals, tc.apis...), chartMade)
			// The namespace is helm's (-n gpupool --create-namespace).
			kustomized := byID(t, build(t, tc.overlay), func(id string) bool { return chartMade(id) || example(id) || id == "Namespace//gpupool" })
			for id, want := range kustomized {
				have, ok := chart[id]
				if !ok {
					t.Errorf("%s: in the overlay, not in the chart", id)
					continue
				}
				if !reflect.DeepEqual(have, want) {
					hb, _ := yaml.Marshal(have)
					wb, _ := yaml.Marshal(want)
					t.Errorf("%s differs:\nchart:\n%s\noverlay:\n%s", id, hb, wb)
				}
			}
			for id := range chart {
				if _, ok := kustomized[id]; !ok {
					t.Errorf("%s: in the chart, not in the overlay", id)
				}
			}
		})
	}
}

func find1(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s", kind, name)
	return nil
}

// TestChartTakesTheSeedsFlags: the articles' `helm install ... --set
// controller.replicas=3 --set scheduler.enabled=true --set
// devicePlugin.nodeSelector.gpu=true`.
func TestChartTakesTheSeedsFlags(t *testing.T) {
	objs := mustRenderChart(t, map[string]any{
		"controller":   map[string]any{"replicas": 3},
		"scheduler":    map[string]any{"enabled": true},
		"devicePlugin": map[string]any{"nodeSelector": map[string]any{"gpu": true}},
	})
	for _, name := range []string{"gpupool-allocator", "gpupool-etcd"} {
		if n, _, _ := unstructured.NestedFieldNoCopy(find1(t, objs, "StatefulSet", name).Object, "spec", "replicas"); n != 3.0 {
			t.Errorf("StatefulSet %s: %v replicas, want 3", name, n)
		}
	}
	for _, name := range []string{"gpupool-webhook", "gpupool-scheduler", "gpupool-kube-scheduler"} {
		if n, _, _ := unstructured.NestedFieldNoCopy(find1(t, objs, "Deployment", name).Object, "spec", "replicas"); n != 3.0 {
			t.Errorf("Deployment %s: %v replicas, want 3", name, n)
		}
	}
	endpoints, _, _ := unstructured.NestedStringMap(find1(t, objs, "ConfigMap", "gpupool-endpoints").Object, "data")
	if got := strings.Split(endpoints["allocator"], ","); len(got) != 3 || got[2] != "https://gpupool-allocator-2.gpupool-allocator-peers.gpupool.svc:8470" {
		t.Errorf("the allocator's endpoints are %q, want its 3 replicas", got)
	}
	if endpoints["etcd"] != "http://gpupool-etcd.gpupool.svc:2379" {
		t.Errorf("etcd at %q, want the chart's", endpoints["etcd"])
	}
	for _, name := range []string{"gpupool-server", "gpupool-device-plugin"} {
		sel, _, _ := unstructured.NestedStringMap(find1(t, objs, "DaemonSet", name).Object, "spec", "template", "spec", "nodeSelector")
		if !maps.Equal(sel, map[string]string{"gpu": "true"}) {
			t.Errorf("DaemonSet %s on nodes %v, want gpu=true alone", name, sel)
		}
	}
	if _, err := renderChart(t, map[string]any{"controller": map[string]any{"replicas": 3}, "etcd": map[string]any{"endpoints": []any{"http://etcd.example:2379"}}}); err != nil {
		t.Fatal(err)
	}
}

// TestChartTakesTheSeedsValues: the articles' values.yaml, in the pool's
// terms: slices of 8Gi of GPU memory, 16 a node at most, packing, and the
// GPUs of a pod of several on one socket.
func TestChartTakesTheSeedsValues(t *testing.T) {
	objs := mustRenderChart(t, map[string]any{
		"scheduler":  map[string]any{"enabled": true},
		"resources":  map[string]any{"gpu": map[string]any{"allocatable": 16, "memoryPerUnit": "8Gi"}},
		"scheduling": map[string]any{"binPacking": true, "affinityRules": []any{map[string]any{"topologyKey": "gpu.socket"}}},
	})
	settings, _, _ := unstructured.NestedStringMap(find1(t, objs, "ConfigMap", "gpupool-kubernetes").Object, "data")
	want := map[string]string{"unit": "memory:8Gi", "max-devices": "16", "default-topology": "socket", "gpu-memory": "16000M"}
	if !maps.Equal(settings, want) {
		t.Errorf("the cluster's settings are %v, want %v", settings, want)
	}
}

// TestChartTakesTheSeedsScheduling: the articles' scheduling values, in
// the pool's terms.
func TestChartTakesTheSeedsScheduling(t *testing.T) {
	objs := mustRenderChart(t, map[string]any{
		"scheduler":  map[string]any{"enabled": true},
		"scheduling": map[string]any{"binPacking": false, "affinityRules": []any{map[string]any{"topologyKey": "gpu.socket"}}},
	})
	settings, _, _ := unstructured.NestedStringMap(find1(t, objs, "ConfigMap", "gpupool-kubernetes").Object, "data")
	if settings["default-topology"] != "socket" {
		t.Errorf("affinityRules on gpu.socket: default-topology %q, want socket", settings["default-topology"])
	}
	args, _, _ := unstructured.NestedSlice(find1(t, objs, "Deployment", "gpupool-allocator").Object, "spec", "template", "spec", "containers")
	if !strings.Contains(fmt.Sprint(args[0].(map[string]any)["args"]), "--policy=spread") {
		t.Errorf("binPacking false: the allocator runs %v, want --policy=spread", args[0].(map[string]any)["args"])
	}
}

// TestChartRefusesWhatItCannotHonour: a key the chart does not know, or a
// value of the wrong type, is refused naming the key (as a path, for the
// schema's refusals); never ignored.
func TestChartRefusesWhatItCannotHonour(t *testing.T) {
	for _, tc := range []struct {
		vals map[string]any
		want string
	}{
		{map[string]any{"controller": map[string]any{"replica": 3}}, "replica"},
		{map[string]any{"controller": map[string]any{"replicas": "three"}}, "/controller/replicas"},
		{map[string]any{"controller": map[string]any{"replicas": 0}}, "/controller/replicas"},
		{map[string]any{"schedulr": map[string]any{"enabled": true}}, "schedulr"},
		{map[string]any{"resources": map[string]any{"gpu": map[string]any{"unit": "slices"}}}, "/resources/gpu/unit"},
		{map[string]any{"etcd": map[string]any{"endpoints": []any{"etcd:2379"}}}, "/etcd/endpoints/0"},
		{map[string]any{"tokens": map[string]any{"admin": "short"}}, "tokens.admin: 5 characters is shorter than the 16"},
		{map[string]any{"scheduler": map[string]any{"enabled": true}, "resources": map[string]any{"gpu": map[string]any{"unit": "gpus", "memoryPerUnit": "8Gi"}}},
			"resources.gpu.unit gpus and resources.gpu.memoryPerUnit 8Gi: the unit is one or the other"},
		{map[string]any{"resources": map[string]any{"gpu": map[string]any{"memoryPerUnit": "8 gigs"}}}, "/resources/gpu/memoryPerUnit"},
		{map[string]any{"resources": map[string]any{"gpu": map[string]any{"allocatable": 0}}}, "/resources/gpu/allocatable"},
		{map[string]any{"scheduling": map[string]any{"affinityRules": []any{map[string]any{"topologyKey": "gpu.rack"}}}}, "/scheduling/affinityRules/0/topologyKey"},
		{map[string]any{"scheduling": map[string]any{"affinityRules": []any{map[string]any{"topologyKey": "gpu.socket"}, map[string]any{"topologyKey": "gpu.nvlink"}}}}, "/scheduling/affinityRules"},
	} {
		_, err := renderChart(t, tc.vals)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %v: %v, want an error naming %q", tc.vals, err, tc.want)
		}
	}
}

// TestChartRendersNoSecret: whatever the values, the chart renders no
// Secret, no private key and no token, so that Helm's release Secret holds
// none (test/e2e's TestHelmChart reads it); the hook Job gpupool-secrets
// makes them in the cluster, before each install, upgrade and rollback
// (the Secrets the pods mount) and after them (the caBundles), with
// certificates exactly when cert-manager makes none.
func TestChartRendersNoSecret(t *testing.T) {
	const certManager = "cert-manager.io/v1"
	for _, tc := range []struct {
		vals     map[string]any
		apis     []string
		certs    bool
		webhook  string
		apiSvc   string
		patching bool
	}{
		// adapter.apiService: auto, and helm template sees no other owner.
		{vals: nil, certs: true, apiSvc: "v1beta1.external.metrics.k8s.io", patching: true},
		{vals: map[string]any{"adapter": map[string]any{"apiService": false}}, certs: true},
		{vals: seedValues, certs: true, webhook: "gpupool", apiSvc: "v1beta1.external.metrics.k8s.io", patching: true},
		{vals: map[string]any{"scheduler": map[string]any{"enabled": true}, "adapter": map[string]any{"apiService": true}}, certs: true,
			webhook: "gpupool", apiSvc: "v1beta1.external.metrics.k8s.io", patching: true},
		{vals: map[string]any{"scheduler": map[string]any{"enabled": true}, "adapter": map[string]any{"apiService": true}}, apis: []string{certManager}},
	} {
		what := fmt.Sprintf("values %v, APIs %v", tc.vals, tc.apis)
		objs, err := renderChart(t, tc.vals, tc.apis...)
		if err != nil {
			t.Fatal(err)
		}
		var jobs []*unstructured.Unstructured
		for _, o := range objs {
			b, _ := o.MarshalJSON()
			if o.GetKind() == "Secret" || strings.Contains(string(b), "PRIVATE KEY") {
				t.Errorf("%s: the chart renders %s %s, which the release would hold", what, o.GetKind(), o.GetName())
			}
			if o.GetKind() == "Job" {
				jobs = append(jobs, o)
			}
			if o.GetKind() == "MutatingWebhookConfiguration" || o.GetKind() == "APIService" {
				if strings.Contains(string(b), "caBundle") {
					t.Errorf("%s: %s %s renders a caBundle: the Job sets it, and a rollback to a release without one would take it away", what, o.GetKind(), o.GetName())
				}
			}
		}
		if len(jobs) != 1 || jobs[0].GetName() != "gpupool-secrets" {
			t.Errorf("%s: Jobs %v, want gpupool-secrets", what, jobs)
			continue
		}
		if hooks := jobs[0].GetAnnotations()["helm.sh/hook"]; hooks != "pre-install,pre-upgrade,pre-rollback,post-install,post-upgrade,post-rollback" {
			t.Errorf("%s: the Job runs at %q", what, hooks)
		}
		pod, _ := podSpec(t, jobs[0])
		args := strings.Join(pod.Containers[0].Args, " ")
		for arg, want := range map[string]bool{"--certs": tc.certs, "--webhook=gpupool": tc.webhook != "", "--apiservice=v1beta1.external.metrics.k8s.io": tc.apiSvc != ""} {
			if strings.Contains(args, arg) != want {
				t.Errorf("%s: the Job runs %s: %s wanted %v", what, args, arg, want)
			}
		}
		hasClusterRole := slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool {
			return o.GetKind() == "ClusterRole" && o.GetName() == "gpupool-secrets"
		})
		if hasClusterRole != tc.patching {
			t.Errorf("%s: a ClusterRole to set caBundles: %v, want %v", what, hasClusterRole, tc.patching)
		}
	}
	// Tokens the values set are the values' (the release holds them as
	// values): the Job takes them from its environment, never a file.
	objs := mustRenderChart(t, map[string]any{"tokens": map[string]any{"admin": "admin-0123456789abcdef"}})
	for _, o := range objs {
		b, _ := o.MarshalJSON()
		if strings.Contains(string(b), "admin-0123456789abcdef") && o.GetKind() != "Job" {
			t.Errorf("%s %s holds the admin token", o.GetKind(), o.GetName())
		}
	}
}

// TestChartInstallsWhereItIsTold: released in gpu-system, every object
// the chart makes is there (but the copy of KEDA's client certificate's
// role, in KEDA's namespace, and the bindings to kube-system's
// authentication reader), and nothing names the manifests' namespace
// gpupool: not a subject, a Service's DNS name, a flag, a service account
// in a policy's expression. The namespace itself is helm's
// (--create-namespace), never the chart's.
func TestChartInstallsWhereItIsTold(t *testing.T) {
	const ns = "gpu-system"
	gpupoolNamespace := regexp.MustCompile(`"namespace":"gpupool"|(?i:namespace): gpupool\b|\.gpupool\.svc|serviceaccount:gpupool:|=gpupool/|"gpupool/gpupool-|"kube-system","gpupool"|Namespace=gpupool`)
	for _, tc := range []struct {
		vals map[string]any
		apis []string
	}{
		{vals: nil},
		{vals: seedValues},
		{vals: map[string]any{"controller": map[string]any{"replicas": 3}, "scheduler": map[string]any{"enabled": true}, "adapter": map[string]any{"apiService": true}},
			apis: []string{"cert-manager.io/v1", "monitoring.coreos.com/v1"}},
	} {
		objs, err := renderChartIn(t, ns, tc.vals, tc.apis...)
		if err != nil {
			t.Fatal(err)
		}
		var text strings.Builder
		for _, o := range objs {
			if o.GetKind() == "Namespace" {
				t.Errorf("values %v: the chart makes the Namespace %s", tc.vals, o.GetName())
			}
			// Roles in KEDA's namespace (the copy of its client certificate)
			// and kube-system's (reading the cluster's authentication).
			got := o.GetNamespace()
			elsewhere := (got == "keda" || got == "kube-system") && strings.HasPrefix(o.GetKind(), "Role")
			if got != "" && got != ns && !elsewhere {
				t.Errorf("values %v: %s %s in namespace %s, want %s", tc.vals, o.GetKind(), o.GetName(), got, ns)
			}
			b, err := o.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			if m := gpupoolNamespace.FindString(string(b)); m != "" {
				t.Errorf("values %v: %s %s names the namespace gpupool (%s)", tc.vals, o.GetKind(), o.GetName(), m)
			}
			text.Write(b)
		}
		for _, want := range []string{`"--namespace=gpu-system"`, ".gpu-system.svc"} {
			if !strings.Contains(text.String(), want) {
				t.Errorf("values %v: nothing says %s", tc.vals, want)
			}
		}
	}
}

// TestChartLintsStrict: `helm lint --strict`, Helm's own lint action,
// passes with the defaults and with the articles' values, released in a
// namespace other than the manifests'; a warning fails it as an error
// does.
func TestChartLintsStrict(t *testing.T) {
	lint := action.NewLint()
	lint.Strict = true
	lint.Namespace = "gpu-system"
	lint.KubeVersion = &chartutil.KubeVersion{Version: "v1.37.2", Major: "1", Minor: "37"}
	for _, vals := range []map[string]any{nil, seedValues, {"controller": map[string]any{"replicas": 3}, "scheduler": map[string]any{"enabled": true}, "devicePlugin": map[string]any{"nodeSelector": map[string]any{"gpu": true}}}} {
		res := lint.Run([]string{"helm/gpupool"}, vals)
		if res.TotalChartsLinted != 1 {
			t.Fatalf("values %v: linted %d charts, want 1", vals, res.TotalChartsLinted)
		}
		for _, err := range res.Errors {
			t.Errorf("values %v: helm lint --strict: %v", vals, err)
		}
		for _, m := range res.Messages {
			if m.Severity > support.InfoSev {
				t.Errorf("values %v: helm lint: %v", vals, m)
			}
		}
	}
}

// TestChartTakesEachWorkloadsKnobs: every workload, the `helm test` pod
// too, takes each knob of values.schema.json's $defs.component from its
// own key, where Kubernetes reads it, in place of the manifest's; a knob
// the schema does not list is refused. The knobs are the schema's: one
// added there fails this test until it has a value below.
func TestChartTakesEachWorkloadsKnobs(t *testing.T) {
	workloads := map[string]string{ // kind/name: values key
		"Deployment/gpupool-allocator": "allocator", "StatefulSet/gpupool-allocator": "allocator",
		"DaemonSet/gpupool-server": "server", "Deployment/gpupool-adapter": "adapter", "StatefulSet/gpupool-etcd": "etcd",
		"Deployment/gpupool-webhook": "webhook", "Deployment/gpupool-scheduler": "scheduler",
		"Deployment/gpupool-kube-scheduler": "kubeScheduler", "DaemonSet/gpupool-device-plugin": "devicePlugin",
		"Job/gpupool-secrets": "secretsJob", "Pod/gpupool-test-pool-status": "tests",
	}
	// A value of each knob, its key's own. podDisruptionBudget, not the
	// pod's, is TestChartDisruptionBudgets'.
	samples := func(key string) map[string]any {
		return map[string]any{
			"resources":                 map[string]any{"requests": map[string]any{"cpu": "7m"}},
			"tolerations":               []any{map[string]any{"key": key, "operator": "Exists"}},
			"affinity":                  map[string]any{"nodeAffinity": map[string]any{"preferredDuringSchedulingIgnoredDuringExecution": []any{map[string]any{"weight": 1, "preference": map[string]any{"matchExpressions": []any{map[string]any{"key": key, "operator": "Exists"}}}}}}},
			"nodeSelector":              map[string]any{"pool": key},
			"priorityClassName":         key + "-priority",
			"podAnnotations":            map[string]any{"example.com/of": key},
			"imagePullSecrets":          []any{map[string]any{"name": key + "-pull"}},
			"topologySpreadConstraints": []any{map[string]any{"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}},
		}
	}
	var knobs []string
	for _, k := range schemaKnobs(t) {
		if k == "podDisruptionBudget" {
			continue
		}
		if _, ok := samples("")[k]; !ok {
			t.Fatalf("knob %s (values.schema.json) has no value here to render", k)
		}
		knobs = append(knobs, k)
	}
	for _, replicas := range []int{1, 3} {
		vals := map[string]any{"controller": map[string]any{"replicas": replicas}}
		for _, key := range workloads {
			m := map[string]any{}
			for _, k := range knobs {
				m[k] = samples(key)[k]
			}
			if old, ok := vals[key].(map[string]any); ok {
				maps.Copy(m, old)
			}
			vals[key] = m
		}
		vals["scheduler"].(map[string]any)["enabled"] = true
		objs, err := renderChartAndTests(t, vals)
		if err != nil {
			t.Fatalf("rendering the chart with %v: %v", vals, err)
		}
		seen := 0
		for _, o := range objs {
			id := o.GetKind() + "/" + o.GetName()
			pod, container, annotations, isPod := podParts(o)
			key, ok := workloads[id]
			if !ok {
				if isPod {
					t.Errorf("%s: a workload with no values key here", id)
				}
				continue
			}
			seen++
			what := fmt.Sprintf("%s (%s)", id, key)
			for _, k := range knobs {
				want := jsonValue(t, samples(key)[k])
				var have any
				switch k {
				case "resources": // the container's
					have = container[k]
				case "podAnnotations": // beside the chart's
					for a := range annotations {
						if _, ok := want.(map[string]any)[a]; !ok {
							delete(annotations, a)
						}
					}
					have = annotations
				default: // the pod spec's
					have = pod[k]
				}
				if !reflect.DeepEqual(have, want) {
					t.Errorf("%s: %s %v, want %s.%s (%v) alone", what, k, have, key, k, want)
				}
			}
		}
		if want := map[int]int{1: 9, 3: 10}[replicas]; seen != want { // etcd's with 3
			t.Errorf("controller.replicas %d: %d workloads, want %d", replicas, seen, want)
		}
	}
	// The chart's own annotations stay beside podAnnotations: the
	// checksums that roll the pods (but etcd's, whose pods mount none of
	// the chart's ConfigMaps and Secrets, and the hook Job's, which runs
	// anew at each install, upgrade and rollback), helm's on the test pod.
	vals := map[string]any{"scheduler": map[string]any{"enabled": true}}
	for _, key := range workloads {
		vals[key] = map[string]any{"podAnnotations": map[string]any{"example.com/of": key}}
	}
	objs, err := renderChartAndTests(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		key, ok := workloads[o.GetKind()+"/"+o.GetName()]
		if !ok {
			continue
		}
		_, _, annotations, _ := podParts(o)
		prefix := "checksum/"
		switch key {
		case "etcd", "secretsJob":
			continue
		case "tests":
			prefix = "helm.sh/hook"
		}
		if !slices.ContainsFunc(slices.Collect(maps.Keys(annotations)), func(k string) bool { return strings.HasPrefix(k, prefix) }) {
			t.Errorf("%s %s: podAnnotations took the chart's %s annotations away: %v", o.GetKind(), o.GetName(), prefix, annotations)
		}
	}
	if _, err := renderChart(t, map[string]any{"allocator": map[string]any{"toleration": []any{}}}); err == nil || !strings.Contains(err.Error(), "toleration") {
		t.Errorf("allocator.toleration: %v, want it refused", err)
	}
	// The GPU nodes: devicePlugin.nodeSelector for both DaemonSets, unless
	// server.nodeSelector names gpupool-server's own.
	objs = mustRenderChart(t, map[string]any{"devicePlugin": map[string]any{"nodeSelector": map[string]any{"gpu": true}}, "server": map[string]any{"nodeSelector": map[string]any{"gpu-server": "yes"}}, "scheduler": map[string]any{"enabled": true}})
	for name, want := range map[string]map[string]string{"gpupool-server": {"gpu-server": "yes"}, "gpupool-device-plugin": {"gpu": "true"}} {
		pod, _ := podSpec(t, find1(t, objs, "DaemonSet", name))
		if !maps.Equal(pod.NodeSelector, want) {
			t.Errorf("DaemonSet %s on %v, want %v", name, pod.NodeSelector, want)
		}
	}
}

// TestChartDisruptionBudgets: the replicated workloads have a
// PodDisruptionBudget, maxUnavailable 1 unless their podDisruptionBudget
// says minAvailable, maxUnavailable, or enabled false.
func TestChartDisruptionBudgets(t *testing.T) {
	objs := mustRenderChart(t, map[string]any{
		"controller": map[string]any{"replicas": 3}, "scheduler": map[string]any{"enabled": true},
		"etcd":    map[string]any{"podDisruptionBudget": map[string]any{"minAvailable": 2}},
		"adapter": map[string]any{"podDisruptionBudget": map[string]any{"enabled": false}},
		"webhook": map[string]any{"podDisruptionBudget": map[string]any{"maxUnavailable": "50%"}},
	})
	want := map[string]map[string]any{
		"gpupool-allocator": {"maxUnavailable": 1.0}, "gpupool-etcd": {"minAvailable": 2.0}, "gpupool-webhook": {"maxUnavailable": "50%"},
		"gpupool-scheduler": {"maxUnavailable": 1.0}, "gpupool-kube-scheduler": {"maxUnavailable": 1.0},
	}
	have := map[string]map[string]any{}
	for _, o := range objs {
		if o.GetKind() == "PodDisruptionBudget" {
			spec, _, _ := unstructured.NestedMap(o.Object, "spec")
			delete(spec, "selector")
			have[o.GetName()] = spec
		}
	}
	if !reflect.DeepEqual(have, want) {
		t.Errorf("PodDisruptionBudgets %v, want %v", have, want)
	}
	if _, err := renderChart(t, map[string]any{"etcd": map[string]any{"podDisruptionBudget": map[string]any{"minAvailable": 2, "maxUnavailable": 1}}}); err == nil {
		t.Error("minAvailable and maxUnavailable both: rendered, want refused")
	}
}

// schemaKnobs are the knobs of values.schema.json's $defs.component, the
// list deploy/gen writes into templates/_knobs.tpl.
func schemaKnobs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("helm/gpupool/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Defs struct {
			Component struct {
				Properties map[string]any `json:"properties"`
			} `json:"component"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	if len(schema.Defs.Component.Properties) == 0 {
		t.Fatal("values.schema.json: no $defs.component.properties")
	}
	return slices.Sorted(maps.Keys(schema.Defs.Component.Properties))
}

// podParts are a workload's pod spec, its (first) container, and its
// pod's annotations, as maps: a pod template's, or a bare Pod's.
func podParts(o *unstructured.Unstructured) (pod, container, annotations map[string]any, ok bool) {
	meta := []string{"spec", "template", "metadata", "annotations"}
	pod, ok, _ = unstructured.NestedMap(o.Object, "spec", "template", "spec")
	if o.GetKind() == "Pod" {
		meta = []string{"metadata", "annotations"}
		pod, ok, _ = unstructured.NestedMap(o.Object, "spec")
	}
	if !ok {
		return nil, nil, nil, false
	}
	if containers, _ := pod["containers"].([]any); len(containers) > 0 {
		container, _ = containers[0].(map[string]any)
	}
	annotations, _, _ = unstructured.NestedMap(o.Object, meta...)
	return pod, container, annotations, true
}

// jsonValue is v as it reads back from JSON (numbers float64).
func jsonValue(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
