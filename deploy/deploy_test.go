// Package deploy_test checks the kustomize overlays without a cluster: they
// build, the pods hold no more privilege than deploy/README.md says, and the
// README's way of replacing the placeholder tokens works.
// test/e2e/deploy_test.go validates the same objects against a real
// kube-apiserver.
package deploy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/gpupool/gpupool/allocator/service"
)

// build runs `kustomize build dir`.
func build(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, r := range m.Resources() {
		b, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(b); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		out = append(out, u)
	}
	return out
}

func overlays(t *testing.T) []string {
	t.Helper()
	dirs, err := filepath.Glob("overlays/*")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no overlays: %v", err)
	}
	return dirs
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string, into any) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && (o.GetName() == name || strings.HasPrefix(o.GetName(), name+"-")) {
			b, err := o.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, into); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no %s %s", kind, name)
}

// clusterScoped are the kinds the overlays hold that live in no namespace.
var clusterScoped = []string{"Namespace", "ClusterRoleBinding", "APIService"}

func TestOverlaysBuild(t *testing.T) {
	for _, dir := range overlays(t) {
		objs := build(t, dir)
		for _, o := range objs {
			scoped := slices.Contains(clusterScoped, o.GetKind())
			if scoped != (o.GetNamespace() == "") {
				t.Errorf("%s: %s %s has namespace %q", dir, o.GetKind(), o.GetName(), o.GetNamespace())
			}
		}
		t.Logf("%s: %d objects", dir, len(objs))
	}
}

// TestPodPrivileges checks every gpupool pod: no privilege, no capability,
// a read-only root; only the daemon shares the host's PID namespace and
// mounts a host path, read-only; only the adapter has a Kubernetes token.
func TestPodPrivileges(t *testing.T) {
	for _, dir := range overlays(t) {
		for _, o := range build(t, dir) {
			if o.GetLabels()["app.kubernetes.io/part-of"] != "gpupool" {
				continue // the example workload is the user's
			}
			spec, found, err := unstructured.NestedMap(o.Object, "spec", "template", "spec")
			if err != nil || !found {
				continue
			}
			var pod corev1.PodSpec
			b, _ := json.Marshal(spec)
			if err := json.Unmarshal(b, &pod); err != nil {
				t.Fatal(err)
			}
			what := dir + ": " + o.GetKind() + " " + o.GetName()
			daemon := o.GetName() == "gpupool-server"
			if pod.HostPID != daemon || pod.HostNetwork || pod.HostIPC {
				t.Errorf("%s: hostPID %v, hostNetwork %v, hostIPC %v", what, pod.HostPID, pod.HostNetwork, pod.HostIPC)
			}
			if token := pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken; token != (o.GetName() == "gpupool-adapter") {
				t.Errorf("%s: mounts a ServiceAccount token: %v", what, token)
			}
			if sc := pod.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
				t.Errorf("%s: may run as root", what)
			}
			readOnly := map[string]bool{}
			for _, c := range pod.Containers {
				sc := c.SecurityContext
				if sc == nil || sc.Privileged != nil && *sc.Privileged || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
					sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
					sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
					t.Errorf("%s: container %s: securityContext %+v", what, c.Name, sc)
				}
				for _, m := range c.VolumeMounts {
					readOnly[m.Name] = readOnly[m.Name] || m.ReadOnly
				}
				for _, a := range c.Args {
					if strings.HasPrefix(a, "--token") {
						t.Errorf("%s: a token on the command line: %s", what, a)
					}
				}
			}
			for _, v := range pod.Volumes {
				if v.HostPath != nil && (!daemon || !readOnly[v.Name]) {
					t.Errorf("%s: host path %s (read-only: %v)", what, v.HostPath.Path, readOnly[v.Name])
				}
			}
		}
	}
}

func TestDaemon(t *testing.T) {
	var ds appsv1.DaemonSet
	find(t, build(t, "overlays/embedded"), "DaemonSet", "gpupool-server", &ds)
	c := ds.Spec.Template.Spec.Containers[0]
	for _, want := range []string{"--source=nvml", "--advertise-host=$(POD_IP)", "--sysfs=/host/sys", "--metric-labels-allowlist=app"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %q lack %s", c.Args, want)
		}
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if e := env["POD_IP"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Errorf("POD_IP: %+v", e)
	}
	if e := env["GPUPOOL_TOKEN"]; e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
		t.Errorf("GPUPOOL_TOKEN not from a Secret: %+v", e)
	}
	if env["NVIDIA_DRIVER_CAPABILITIES"].Value != "utility" {
		t.Errorf("NVIDIA_DRIVER_CAPABILITIES: %+v", env["NVIDIA_DRIVER_CAPABILITIES"])
	}
}

// TestEtcdEndpoints checks that the etcd overlay's address list names every
// replica of the StatefulSet.
func TestEtcdEndpoints(t *testing.T) {
	objs := build(t, "overlays/etcd")
	var sts appsv1.StatefulSet
	find(t, objs, "StatefulSet", "gpupool-allocator", &sts)
	var cm corev1.ConfigMap
	find(t, objs, "ConfigMap", "gpupool-endpoints", &cm)
	var want []string
	for i := range *sts.Spec.Replicas {
		want = append(want, "http://gpupool-allocator-"+strconv.Itoa(int(i))+"."+sts.Spec.ServiceName+".gpupool.svc:8470")
	}
	if got := strings.Split(cm.Data["allocator"], ","); !slices.Equal(got, want) {
		t.Errorf("allocator endpoints %q, want %q", got, want)
	}
}

// TestTokens checks the placeholders keep the allocator from starting, and
// that the README's way of replacing them reaches the pods.
func TestTokens(t *testing.T) {
	if _, err := service.LoadConfig("base/config/allocator-config.yaml"); err == nil || !strings.Contains(err.Error(), "shorter than 16") {
		t.Errorf("the placeholder config loads: %v", err)
	}

	dir := t.TempDir()
	// kustomize takes relative paths only, as a user's overlay would use.
	abs, err := filepath.Abs("overlays/embedded")
	if err != nil {
		t.Fatal(err)
	}
	embedded, err := filepath.Rel(dir, abs)
	if err != nil {
		t.Fatal(err)
	}
	config := "admin: {tokens: [admin-0123456789abcdef]}\nservers: {tokens: [server-0123456789abcdef]}\n"
	files := map[string]string{
		"config.yaml": config,
		"tokens.env":  "admin-token=admin-0123456789abcdef\nserver-token=server-0123456789abcdef\n",
		"kustomization.yaml": `resources:
  - ` + embedded + `
secretGenerator:
  - name: gpupool-allocator-config
    namespace: gpupool
    behavior: replace
    files: [config.yaml]
  - name: gpupool-tokens
    namespace: gpupool
    behavior: replace
    envs: [tokens.env]
`,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := service.LoadConfig(filepath.Join(dir, "config.yaml")); err != nil {
		t.Fatal(err)
	}
	objs := build(t, dir)
	var configSecret, tokens corev1.Secret
	find(t, objs, "Secret", "gpupool-allocator-config", &configSecret)
	find(t, objs, "Secret", "gpupool-tokens", &tokens)
	if string(configSecret.Data["config.yaml"]) != config {
		t.Errorf("config.yaml: %q", configSecret.Data["config.yaml"])
	}
	if string(tokens.Data["server-token"]) != "server-0123456789abcdef" || string(tokens.Data["admin-token"]) != "admin-0123456789abcdef" {
		t.Errorf("tokens: %q", tokens.Data)
	}
	var alloc appsv1.Deployment
	find(t, objs, "Deployment", "gpupool-allocator", &alloc)
	for _, v := range alloc.Spec.Template.Spec.Volumes {
		if v.Name == "config" && v.Secret.SecretName != configSecret.Name {
			t.Errorf("the allocator mounts %s, not %s", v.Secret.SecretName, configSecret.Name)
		}
	}
	var ds appsv1.DaemonSet
	find(t, objs, "DaemonSet", "gpupool-server", &ds)
	for _, e := range ds.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "GPUPOOL_TOKEN" && e.ValueFrom.SecretKeyRef.Name != tokens.Name {
			t.Errorf("the daemon reads %s, not %s", e.ValueFrom.SecretKeyRef.Name, tokens.Name)
		}
	}
}
