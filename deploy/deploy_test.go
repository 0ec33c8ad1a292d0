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
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	schedulerconfigv1 "k8s.io/kube-scheduler/config/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/gpupool/gpupool/allocator/service"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/scheduler"
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

// kustomizations are what users apply: the overlays and the examples.
func kustomizations(t *testing.T) []string {
	t.Helper()
	var dirs []string
	for _, pattern := range []string{"overlays/*", "examples/*"} {
		found, err := filepath.Glob(pattern)
		if err != nil || len(found) == 0 {
			t.Fatalf("nothing in %s: %v", pattern, err)
		}
		dirs = append(dirs, found...)
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

// podSpec is the pod template's spec of a workload o; false when o has
// none.
func podSpec(t *testing.T, o *unstructured.Unstructured) (corev1.PodSpec, bool) {
	t.Helper()
	var pod corev1.PodSpec
	spec, found, err := unstructured.NestedMap(o.Object, "spec", "template", "spec")
	if err != nil || !found {
		return pod, false
	}
	b, _ := json.Marshal(spec)
	if err := json.Unmarshal(b, &pod); err != nil {
		t.Fatal(err)
	}
	return pod, true
}

// clusterScoped are the kinds the overlays and examples hold that live in
// no namespace.
var clusterScoped = []string{"Namespace", "ClusterRole", "ClusterRoleBinding", "APIService", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
	"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterTriggerAuthentication", "DeviceClass"}

func TestOverlaysBuild(t *testing.T) {
	for _, dir := range kustomizations(t) {
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

// callTheAPI are the workloads that call the Kubernetes API, and so mount
// a ServiceAccount token.
var callTheAPI = []string{"gpupool-adapter", "gpupool-scheduler", "gpupool-kube-scheduler", "gpupool-device-plugin"}

// hostPaths are the host paths each workload mounts, and whether it may
// write there: the daemon reads the host's /sys; the device plugin makes
// its socket beside the kubelet's and asks the kubelet's pod-resources API.
var hostPaths = map[string]map[string]bool{
	"gpupool-server": {"/sys": false},
	"gpupool-device-plugin": {"/var/lib/kubelet/device-plugins": true, "/var/lib/kubelet/pod-resources": false,
		// DRA's kubelet plugin: its registration, its socket, the CDI specs.
		"/var/lib/kubelet/plugins_registry": true, "/var/lib/kubelet/plugins": true, "/var/run/cdi": true},
}

// TestPodPrivileges checks every gpupool pod: no privilege, no capability,
// a read-only root; only the daemon shares the host's PID namespace; only
// the workloads of hostPaths mount a host path, those and as they say;
// only the device plugin runs as root, whose the kubelet's sockets are;
// only the workloads of callTheAPI have a Kubernetes token; no token is on
// a command line.
func TestPodPrivileges(t *testing.T) {
	for _, dir := range kustomizations(t) {
		for _, o := range build(t, dir) {
			if o.GetLabels()["app.kubernetes.io/part-of"] != "gpupool" {
				continue // the example workload is the user's
			}
			pod, ok := podSpec(t, o)
			if !ok {
				continue
			}
			what := dir + ": " + o.GetKind() + " " + o.GetName()
			daemon := o.GetName() == "gpupool-server"
			if pod.HostPID != daemon || pod.HostNetwork || pod.HostIPC {
				t.Errorf("%s: hostPID %v, hostNetwork %v, hostIPC %v", what, pod.HostPID, pod.HostNetwork, pod.HostIPC)
			}
			if token := pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken; token != slices.Contains(callTheAPI, o.GetName()) {
				t.Errorf("%s: mounts a ServiceAccount token: %v", what, token)
			}
			root := o.GetName() == "gpupool-device-plugin"
			if sc := pod.SecurityContext; sc == nil || root != (sc.RunAsUser != nil && *sc.RunAsUser == 0) || !root && (sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot) {
				t.Errorf("%s: securityContext %+v, want root %v", what, sc, root)
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
					if a == "--token" || strings.HasPrefix(a, "--token=") {
						t.Errorf("%s: a token on the command line: %s", what, a)
					}
				}
			}
			for _, v := range pod.Volumes {
				if v.HostPath == nil {
					continue
				}
				writable, allowed := hostPaths[o.GetName()][v.HostPath.Path]
				if !allowed || readOnly[v.Name] == writable {
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
		want = append(want, "https://gpupool-allocator-"+strconv.Itoa(int(i))+"."+sts.Spec.ServiceName+".gpupool.svc:8470")
	}
	if got := strings.Split(cm.Data["allocator"], ","); !slices.Equal(got, want) {
		t.Errorf("allocator endpoints %q, want %q", got, want)
	}
}

// userOverlay writes the kustomization.yaml of a user's overlay and the
// files beside it into a new directory, which it returns. $DEPLOY in the
// kustomization stands for this directory: kustomize takes relative paths
// only, as a user's overlay would use.
func userOverlay(t *testing.T, kustomization string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	abs, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	deploy, err := filepath.Rel(dir, abs)
	if err != nil {
		t.Fatal(err)
	}
	files["kustomization.yaml"] = strings.ReplaceAll(kustomization, "$DEPLOY", deploy)
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestTokens checks the placeholders keep the allocator from starting, and
// that the README's way of replacing them reaches every pod that reads
// them.
func TestTokens(t *testing.T) {
	if _, err := service.LoadConfig("base/config/allocator-config.yaml"); err == nil || !strings.Contains(err.Error(), "shorter than 16") {
		t.Errorf("the placeholder config loads: %v", err)
	}

	config := "admin: {tokens: [admin-0123456789abcdef]}\nreaders: {tokens: [reader-0123456789abcdef]}\nservers: {tokens: [server-0123456789abcdef]}\n"
	dir := userOverlay(t, `resources:
  - $DEPLOY/overlays/full
secretGenerator:
  - name: gpupool-allocator-config
    namespace: gpupool
    behavior: replace
    files: [config.yaml]
  - name: gpupool-tokens
    namespace: gpupool
    behavior: replace
    envs: [tokens.env]
`, map[string]string{
		"config.yaml": config,
		"tokens.env":  "admin-token=admin-0123456789abcdef\nserver-token=server-0123456789abcdef\nreader-token=reader-0123456789abcdef\n",
	})
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
	replaced := map[string]string{"gpupool-allocator-config": configSecret.Name, "gpupool-tokens": tokens.Name}
	readers := map[string]bool{}
	for _, o := range objs {
		pod, ok := podSpec(t, o)
		if !ok {
			continue
		}
		var names []string
		keys := map[string][]string{}
		for _, v := range pod.Volumes {
			if v.Secret != nil {
				names = append(names, v.Secret.SecretName)
				for _, item := range v.Secret.Items {
					keys[v.Secret.SecretName] = append(keys[v.Secret.SecretName], item.Key)
				}
			}
		}
		for _, c := range pod.Containers {
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					names = append(names, e.ValueFrom.SecretKeyRef.Name)
					keys[e.ValueFrom.SecretKeyRef.Name] = append(keys[e.ValueFrom.SecretKeyRef.Name], e.ValueFrom.SecretKeyRef.Key)
				}
			}
		}
		// Each key a pod reads is one the README's Secrets hold.
		for _, key := range keys[tokens.Name] {
			if _, ok := tokens.Data[key]; !ok {
				t.Errorf("%s %s reads %s of %s, which the README's tokens.env does not make", o.GetKind(), o.GetName(), key, tokens.Name)
			}
		}
		for _, name := range names {
			for placeholder, secret := range replaced {
				if strings.HasPrefix(name, placeholder) {
					readers[o.GetName()] = true
					if name != secret {
						t.Errorf("%s %s reads %s, not %s", o.GetKind(), o.GetName(), name, secret)
					}
				}
			}
		}
	}
	for _, want := range []string{"gpupool-allocator", "gpupool-server", "gpupool-adapter", "gpupool-scheduler", "gpupool-device-plugin"} {
		if !readers[want] {
			t.Errorf("%s reads neither Secret", want)
		}
	}
}

// TestArgsNameDefinedVariables: every $(VAR) in a container's args is one of
// its env variables; Kubernetes passes an undefined one on as the literal
// text "$(VAR)".
func TestArgsNameDefinedVariables(t *testing.T) {
	reference := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, dir := range kustomizations(t) {
		for _, o := range build(t, dir) {
			pod, ok := podSpec(t, o)
			if !ok {
				continue
			}
			for _, c := range pod.Containers {
				defined := map[string]bool{}
				for _, e := range c.Env {
					defined[e.Name] = true
				}
				for _, a := range c.Args {
					for _, m := range reference.FindAllStringSubmatch(a, -1) {
						if !defined[m[1]] {
							t.Errorf("%s: %s %s, container %s: %s names $(%s), which its env does not define", dir, o.GetKind(), o.GetName(), c.Name, a, m[1])
						}
					}
				}
			}
		}
	}
}

// TestWebhookReachable follows kube-apiserver's way to the webhook in the
// full overlay: each webhook names a Service and port that reach the
// webhook's HTTPS port, and the cert-manager Certificate whose CA is
// injected is the one the webhook serves, issued for the name
// kube-apiserver checks.
func TestWebhookReachable(t *testing.T) {
	objs := build(t, "overlays/full")
	var mutating admissionregistrationv1.MutatingWebhookConfiguration
	find(t, objs, "MutatingWebhookConfiguration", "gpupool", &mutating)
	injectCA := mutating.Annotations["cert-manager.io/inject-ca-from"]
	for _, w := range mutating.Webhooks {
		ref := w.ClientConfig.Service
		if ref == nil || ref.Port == nil {
			t.Fatalf("%s: clientConfig %+v names no Service and port", w.Name, w.ClientConfig)
		}
		certNamespace, certName, _ := strings.Cut(injectCA, "/")
		if certNamespace != ref.Namespace {
			t.Errorf("%s: the CA comes from %s, not from namespace %s", w.Name, injectCA, ref.Namespace)
		}
		served := serving(t, objs, ref.Namespace, ref.Name, *ref.Port, "gpupool-webhook")
		checkCertificate(t, objs, certName, served, "server auth", ref.Name+"."+ref.Namespace+".svc")
	}
}

// TestKubeSchedulerReachesAllocator follows gpupool-kube-scheduler's way to
// the allocator: the GPUPool plugin's args, with the environment its
// Deployment sets, name the address of the ConfigMap gpupool-endpoints,
// the CA of the allocator's Secret and the admin token of the tokens'
// Secret, each in a volume the container mounts, as gpupool-scheduler has
// them.
func TestKubeSchedulerReachesAllocator(t *testing.T) {
	objs := build(t, "overlays/full")
	config := kubeSchedulerConfig(t, objs)
	var sched, controller appsv1.Deployment
	find(t, objs, "Deployment", "gpupool-kube-scheduler", &sched)
	find(t, objs, "Deployment", "gpupool-scheduler", &controller)
	c := sched.Spec.Template.Spec.Containers[0]
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			t.Setenv(e.Name, e.Value)
		case e.ValueFrom.ConfigMapKeyRef != nil:
			var cm corev1.ConfigMap
			find(t, objs, "ConfigMap", e.ValueFrom.ConfigMapKeyRef.Name, &cm)
			t.Setenv(e.Name, cm.Data[e.ValueFrom.ConfigMapKeyRef.Key])
		}
	}
	var pluginConfig *schedulerconfigv1.PluginConfig
	for i, pc := range config.Profiles[0].PluginConfig {
		if pc.Name == scheduler.PluginName {
			pluginConfig = &config.Profiles[0].PluginConfig[i]
		}
	}
	if pluginConfig == nil {
		t.Fatalf("pluginConfig %+v: no args for %s", config.Profiles[0].PluginConfig, scheduler.PluginName)
	}
	args, err := scheduler.DecodePluginArgs(&runtime.Unknown{Raw: pluginConfig.Args.Raw})
	if err != nil {
		t.Fatal(err)
	}
	var endpoints corev1.ConfigMap
	find(t, objs, "ConfigMap", "gpupool-endpoints", &endpoints)
	if args.Allocator != endpoints.Data["allocator"] {
		t.Errorf("the plugin reaches the allocator at %q, the endpoints ConfigMap says %q", args.Allocator, endpoints.Data["allocator"])
	}
	mountedFile := func(pod corev1.PodSpec, path string) (secret, key string) {
		t.Helper()
		s := mountedSecret(t, pod, filepath.Dir(path))
		i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == s.secret })
		for _, item := range pod.Volumes[i].Secret.Items {
			if item.Path == filepath.Base(path) {
				return s.secret, item.Key
			}
		}
		return s.secret, filepath.Base(path)
	}
	controllerArgs := strings.Join(controller.Spec.Template.Spec.Containers[0].Args, " ")
	tokenFile := regexp.MustCompile(`--token-file=(\S+)`).FindStringSubmatch(controllerArgs)
	if tokenFile == nil {
		t.Fatalf("gpupool-scheduler's args %q name no --token-file", controllerArgs)
	}
	controllerEnv := controller.Spec.Template.Spec.Containers[0].Env
	i := slices.IndexFunc(controllerEnv, func(e corev1.EnvVar) bool { return e.Name == cli.AllocatorCAEnv })
	if i < 0 {
		t.Fatalf("gpupool-scheduler's env %+v sets no %s", controllerEnv, cli.AllocatorCAEnv)
	}
	for _, tc := range []struct{ what, path, controllerPath string }{
		{"token", args.TokenFile, tokenFile[1]},
		{"allocator's CA", args.AllocatorCAFile, controllerEnv[i].Value},
	} {
		secret, key := mountedFile(sched.Spec.Template.Spec, tc.path)
		wantSecret, wantKey := mountedFile(controller.Spec.Template.Spec, tc.controllerPath)
		if secret != wantSecret || key != wantKey {
			t.Errorf("the plugin's %s %s is %s/%s, gpupool-scheduler's %s/%s", tc.what, tc.path, secret, key, wantSecret, wantKey)
		}
	}
}

// TestKubeSchedulerConfig checks gpupool-kube-scheduler's configuration
// against what the rest of gpupool expects of it: the profile the webhook
// names, the GPUPool plugin at every point it serves (first of the
// PreFilter plugins) and no other scorer,
// binder or preemption, bitfusion.io left to the pool, every node a
// candidate, a leader lease its Role lets it hold, and gpupool's image.
func TestKubeSchedulerConfig(t *testing.T) {
	objs := build(t, "overlays/full")
	config := kubeSchedulerConfig(t, objs)
	if len(config.Profiles) != 1 || config.Profiles[0].SchedulerName == nil || *config.Profiles[0].SchedulerName != kube.SchedulerName {
		t.Fatalf("profiles %+v: want the one the webhook names, %s", config.Profiles, kube.SchedulerName)
	}
	if p := config.PercentageOfNodesToScore; p == nil || *p != 100 {
		t.Errorf("percentageOfNodesToScore %v: want 100, every feasible node a candidate", p)
	}
	if i, m := config.PodInitialBackoffSeconds, config.PodMaxBackoffSeconds; i == nil || *i != 10 || m == nil || *m != 10 {
		t.Errorf("podInitialBackoffSeconds %v, podMaxBackoffSeconds %v: want 10 and 10, a refused pod tried again after 10 s", i, m)
	}
	p := config.Profiles[0].Plugins
	if p == nil {
		t.Fatal("the profile names no plugins")
	}
	gpupool := []schedulerconfigv1.Plugin{{Name: scheduler.PluginName}}
	all := []schedulerconfigv1.Plugin{{Name: "*"}}
	// PreFilter: GPUPool first, before DynamicResources, the defaults in
	// their order after it.
	var preFilter []string
	for _, pl := range p.PreFilter.Enabled {
		preFilter = append(preFilter, pl.Name)
	}
	if !slices.Equal(preFilter, scheduler.PreFilterPlugins) || !slices.Equal(p.PreFilter.Disabled, all) {
		t.Errorf("preFilter %+v: want %v alone, in that order", p.PreFilter, scheduler.PreFilterPlugins)
	}
	for _, tc := range []struct {
		point          string
		set            schedulerconfigv1.PluginSet
		othersDisabled bool
	}{
		// No preemption: it frees no GPU share.
		{"postFilter", p.PostFilter, true},
		{"preScore", p.PreScore, true},
		{"score", p.Score, true},
		{"reserve", p.Reserve, false},
		{"bind", p.Bind, true},
	} {
		if !slices.Equal(tc.set.Enabled, gpupool) || tc.othersDisabled != slices.Equal(tc.set.Disabled, all) {
			t.Errorf("%s %+v: want %s enabled, and the others disabled: %v", tc.point, tc.set, scheduler.PluginName, tc.othersDisabled)
		}
	}
	var fit *schedulerconfigv1.NodeResourcesFitArgs
	for _, pc := range config.Profiles[0].PluginConfig {
		if pc.Name == "NodeResourcesFit" {
			fit = &schedulerconfigv1.NodeResourcesFitArgs{}
			if err := json.Unmarshal(pc.Args.Raw, fit); err != nil {
				t.Fatal(err)
			}
		}
	}
	if fit == nil || !slices.Equal(fit.IgnoredResourceGroups, []string{"bitfusion.io"}) {
		t.Errorf("NodeResourcesFit args %+v: want bitfusion.io ignored, the pool's to count", fit)
	}

	le := config.LeaderElection
	if le.LeaderElect == nil || !*le.LeaderElect || le.ResourceLock != "leases" {
		t.Fatalf("leaderElection %+v: want leases", le)
	}
	var role rbacv1.Role
	find(t, objs, "Role", "gpupool-kube-scheduler-leader", &role)
	if role.Namespace != le.ResourceNamespace || len(role.Rules) != 1 || !slices.Equal(role.Rules[0].ResourceNames, []string{le.ResourceName}) {
		t.Errorf("the leader Role %s/%s %+v does not name the lease %s/%s", role.Namespace, role.Name, role.Rules, le.ResourceNamespace, le.ResourceName)
	}

	// gpupool's image, which `make image` builds gpupool-kube-scheduler into.
	var sched, controller appsv1.Deployment
	find(t, objs, "Deployment", "gpupool-kube-scheduler", &sched)
	find(t, objs, "Deployment", "gpupool-scheduler", &controller)
	c := sched.Spec.Template.Spec.Containers[0]
	if c.Image != controller.Spec.Template.Spec.Containers[0].Image || c.Command[0] != "gpupool-kube-scheduler" {
		t.Errorf("kube-scheduler runs %s of %s, want gpupool-kube-scheduler of gpupool-scheduler's image, %s",
			c.Command[0], c.Image, controller.Spec.Template.Spec.Containers[0].Image)
	}
}

// kubeSchedulerConfig reads the second kube-scheduler's configuration from
// the ConfigMap its Deployment mounts at the directory of its --config,
// refusing fields kube-scheduler does not know.
func kubeSchedulerConfig(t *testing.T, objs []*unstructured.Unstructured) schedulerconfigv1.KubeSchedulerConfiguration {
	t.Helper()
	var sched appsv1.Deployment
	find(t, objs, "Deployment", "gpupool-kube-scheduler", &sched)
	pod := sched.Spec.Template.Spec
	var file string
	for _, a := range pod.Containers[0].Command {
		if f, ok := strings.CutPrefix(a, "--config="); ok {
			file = f
		}
	}
	var mounted *corev1.ConfigMapVolumeSource
	for _, m := range pod.Containers[0].VolumeMounts {
		for _, v := range pod.Volumes {
			if m.Name == v.Name && m.MountPath == filepath.Dir(file) && v.ConfigMap != nil {
				mounted = v.ConfigMap
			}
		}
	}
	if mounted == nil {
		t.Fatalf("kube-scheduler's --config %q is in no mounted ConfigMap", file)
	}
	var cm corev1.ConfigMap
	find(t, objs, "ConfigMap", mounted.Name, &cm)
	var config schedulerconfigv1.KubeSchedulerConfiguration
	if err := yaml.UnmarshalStrict([]byte(cm.Data[filepath.Base(file)]), &config); err != nil {
		t.Fatalf("ConfigMap %s, %s: %v", cm.Name, filepath.Base(file), err)
	}
	if config.APIVersion != schedulerconfigv1.SchemeGroupVersion.String() || config.Kind != "KubeSchedulerConfiguration" {
		t.Fatalf("ConfigMap %s, %s: %s %s", cm.Name, filepath.Base(file), config.APIVersion, config.Kind)
	}
	return config
}

// servedSecret is a Secret mounted into a workload's first container, and
// that container's args.
type servedSecret struct {
	secret, mountPath string
	args              []string
}

// serving checks that the Service namespace/name selects deployment's pods
// and that its port reaches a port of their container, which serves TLS
// with the key pair of a Secret it mounts; it returns that Secret.
func serving(t *testing.T, objs []*unstructured.Unstructured, namespace, name string, port int32, deployment string) servedSecret {
	t.Helper()
	var d appsv1.Deployment
	find(t, objs, "Deployment", deployment, &d)
	pod := d.Spec.Template
	var svc corev1.Service
	find(t, objs, "Service", name, &svc)
	if svc.Namespace != namespace || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) {
		t.Errorf("Service %s/%s (selector %v) does not select %s's pods %v", svc.Namespace, svc.Name, svc.Spec.Selector, deployment, pod.Labels)
	}
	i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == port })
	if i < 0 || !slices.ContainsFunc(pod.Spec.Containers[0].Ports, func(p corev1.ContainerPort) bool { return p.Name == svc.Spec.Ports[i].TargetPort.StrVal }) {
		t.Errorf("port %d of Service %s reaches no port of %s's container", port, svc.Name, deployment)
	}
	args := pod.Spec.Containers[0].Args
	for _, a := range args {
		if f, ok := strings.CutPrefix(a, "--tls-cert-file="); ok {
			s := mountedSecret(t, pod.Spec, filepath.Dir(f))
			if !slices.Contains(args, "--tls-private-key-file="+s.mountPath+"/tls.key") {
				t.Errorf("%s serves %s without its key: %q", deployment, f, args)
			}
			s.args = args
			return s
		}
	}
	t.Fatalf("%s serves no --tls-cert-file: %q", deployment, args)
	return servedSecret{}
}

// mountedSecret is the Secret mounted at dir in pod's first container.
func mountedSecret(t *testing.T, pod corev1.PodSpec, dir string) servedSecret {
	t.Helper()
	for _, m := range pod.Containers[0].VolumeMounts {
		for _, v := range pod.Volumes {
			if m.Name == v.Name && m.MountPath == dir && v.Secret != nil {
				return servedSecret{secret: v.Secret.SecretName, mountPath: dir}
			}
		}
	}
	t.Fatalf("no Secret is mounted at %s", dir)
	return servedSecret{}
}

// checkCertificate checks that the cert-manager Certificate name issues
// the Secret s for usage and, for a server, each of dnsNames.
func checkCertificate(t *testing.T, objs []*unstructured.Unstructured, name string, s servedSecret, usage string, dnsNames ...string) {
	t.Helper()
	var cert struct {
		Spec struct {
			SecretName string
			DNSNames   []string
			Usages     []string
		}
	}
	find(t, objs, "Certificate", name, &cert)
	if cert.Spec.SecretName != s.secret || !slices.Contains(cert.Spec.Usages, usage) {
		t.Errorf("Certificate %s issues %s for %q, want %s for %s", name, cert.Spec.SecretName, cert.Spec.Usages, s.secret, usage)
	}
	for _, n := range dnsNames {
		if !slices.Contains(cert.Spec.DNSNames, n) {
			t.Errorf("Certificate %s is issued for %q, not %s", name, cert.Spec.DNSNames, n)
		}
	}
}

// unitReaders are the workloads of components/kubernetes that read the
// cluster's unit of bitfusion.io/gpu.
var unitReaders = []string{"gpupool-device-plugin", "gpupool-scheduler", "gpupool-webhook"}

// TestOneUnit checks that every binary that reads the unit reads it from
// the one ConfigMap, and that an overlay which changes it there, as
// docs/kubernetes.md says, changes it for all of them.
func TestOneUnit(t *testing.T) {
	dir := userOverlay(t, `resources:
  - $DEPLOY/overlays/full
configMapGenerator:
  - {name: gpupool-kubernetes, namespace: gpupool, behavior: merge, literals: [unit=gpus]}
`, map[string]string{})
	for dir, want := range map[string]string{"overlays/full": "percent", dir: "gpus"} {
		objs := build(t, dir)
		var settings corev1.ConfigMap
		find(t, objs, "ConfigMap", "gpupool-kubernetes", &settings)
		if settings.Data["unit"] != want {
			t.Errorf("%s: unit %q, want %q", dir, settings.Data["unit"], want)
		}
		var readers []string
		for _, o := range objs {
			pod, ok := podSpec(t, o)
			if !ok {
				continue
			}
			for _, c := range pod.Containers {
				if !slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--unit=") }) {
					continue
				}
				readers = append(readers, o.GetName())
				if !slices.Contains(c.Args, "--unit=$(GPUPOOL_UNIT)") {
					t.Errorf("%s: %s reads the unit from elsewhere: %q", dir, o.GetName(), c.Args)
				}
				for _, e := range c.Env {
					if ref := e.ValueFrom; e.Name == "GPUPOOL_UNIT" && (ref == nil || ref.ConfigMapKeyRef == nil || ref.ConfigMapKeyRef.Name != settings.Name || ref.ConfigMapKeyRef.Key != "unit") {
						t.Errorf("%s: %s's GPUPOOL_UNIT is not the unit of ConfigMap %s: %+v", dir, o.GetName(), settings.Name, e)
					}
				}
			}
		}
		if slices.Sort(readers); !slices.Equal(readers, unitReaders) {
			t.Errorf("%s: the unit is read by %q, want %q", dir, readers, unitReaders)
		}
	}
}

// TestOneImage checks that every gpupool container runs the one image, at
// the tag `make image` builds, and that an overlay that points it elsewhere,
// as deploy/README.md says, does so for all of them.
func TestOneImage(t *testing.T) {
	version, err := os.ReadFile("../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	dir := userOverlay(t, `resources:
  - $DEPLOY/overlays/full
images:
  - {name: gpupool/gpupool, newName: registry.example.com/team/gpupool, newTag: v1.2.3}
`, map[string]string{})
	ours := "gpupool/gpupool:" + strings.TrimSpace(string(version))
	for dir, want := range map[string]string{
		"overlays/embedded": ours,
		"overlays/etcd":     ours,
		"overlays/full":     ours,
		dir:                 "registry.example.com/team/gpupool:v1.2.3",
	} {
		n := 0
		for _, o := range build(t, dir) {
			containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			for _, c := range containers {
				command, _, _ := unstructured.NestedStringSlice(c.(map[string]any), "command")
				image, _, _ := unstructured.NestedString(c.(map[string]any), "image")
				if len(command) == 0 || !strings.HasPrefix(command[0], "gpupool") {
					continue
				}
				n++
				if image != want {
					t.Errorf("%s: %s %s runs %s, not %s", dir, o.GetKind(), o.GetName(), image, want)
				}
			}
		}
		if n == 0 {
			t.Errorf("%s: no gpupool container", dir)
		}
	}
}

// TestAllocatorOnTLS: in every overlay the allocator serves HTTPS from
// its Secret, every address of it is https://, and every container that
// calls it verifies it against the Secret's ca.crt, mounted alone (never
// the allocator's key).
func TestAllocatorOnTLS(t *testing.T) {
	for _, dir := range []string{"overlays/embedded", "overlays/etcd", "overlays/full"} {
		objs := build(t, dir)
		var cm corev1.ConfigMap
		find(t, objs, "ConfigMap", "gpupool-endpoints", &cm)
		for _, u := range strings.Split(cm.Data["allocator"], ",") {
			if !strings.HasPrefix(u, "https://") {
				t.Errorf("%s: the allocator at %s, want https", dir, u)
			}
		}
		for _, o := range objs {
			pod, ok := podSpec(t, o)
			if !ok {
				continue
			}
			volumes := map[string]corev1.Volume{}
			for _, v := range pod.Volumes {
				volumes[v.Name] = v
			}
			for _, c := range pod.Containers {
				what := dir + ": " + o.GetName() + "/" + c.Name
				if slices.Contains(c.Command, "gpupool-allocator") && (!slices.Contains(c.Args, "--tls-cert-file=/etc/gpupool/tls/tls.crt") ||
					volumes["tls"].Secret == nil || volumes["tls"].Secret.SecretName != "gpupool-allocator-tls") {
					t.Errorf("%s: serves no TLS from gpupool-allocator-tls: %v", what, c.Args)
				}
				env := map[string]corev1.EnvVar{}
				for _, e := range c.Env {
					env[e.Name] = e
				}
				if _, calls := env["GPUPOOL_ALLOCATOR"]; !calls {
					continue
				}
				caFile := env["GPUPOOL_ALLOCATOR_CA_FILE"].Value
				var mounted *corev1.VolumeMount
				for i, m := range c.VolumeMounts {
					if caFile != "" && strings.HasPrefix(caFile, m.MountPath+"/") {
						mounted = &c.VolumeMounts[i]
					}
				}
				if mounted == nil {
					t.Errorf("%s calls the allocator and trusts no CA file (%q)", what, caFile)
					continue
				}
				v := volumes[mounted.Name].Secret
				if v == nil || v.SecretName != "gpupool-allocator-tls" || len(v.Items) != 1 || v.Items[0].Key != "ca.crt" {
					t.Errorf("%s: volume %s is %+v, want ca.crt of gpupool-allocator-tls alone", what, mounted.Name, v)
				}
			}
		}
	}
}
