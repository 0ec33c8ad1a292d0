package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/kube"
	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
)

// seedFlags are the articles' `helm install` flags, as they print them.
var seedFlags = []string{"--set", "controller.replicas=3", "--set", "scheduler.enabled=true", "--set", "devicePlugin.nodeSelector.gpu=true"}

// chartNamespace is where TestHelmChart installs the chart: not the
// manifests' gpupool, so that a name the chart left at gpupool shows.
const chartNamespace = "gpu-system"

// inChartNamespace are helm's flags for the release's namespace.
var inChartNamespace = []string{"-n", chartNamespace}

// TestHelmChart installs deploy/helm/gpupool with the helm CLI and the
// articles' three --set flags, into the namespace gpu-system (-n
// gpu-system --create-namespace), on the one-node cluster of
// TestOverlayRunsAsPods, and waits until every component is Ready, run
// from the image built here: 3 allocators on the chart's 3-member etcd, 3
// of each controller, the daemon and the device plugin on the node
// labelled gpu=true, certificates and tokens made in the cluster by the
// chart's hook Job, which no revision of the release holds. A BFK pod
// and the articles' TFJob are placed and get their leases; `helm upgrade` changes the policy, which
// rolls the allocators, and no lease is lost, nor a token or the CA;
// `helm rollback` goes back; `helm test` asks the pool for its status
// with the adapter's token, which only reads;
// `helm uninstall` leaves no cluster-wide object of the pool behind.
//
// What differs from a GPU cluster is what differs for TestOverlayRunsAsPods
// (simulated GPUs, applied as a kustomize post-renderer, as platform teams
// patch a chart; images imported; volumes on this host), and etcd's image:
// registry.k8s.io's name for this machine's etcd binary.
func TestHelmChart(t *testing.T) {
	skipWithoutNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	cp, _ := startControlPlaneWith(ctx, t, nil, e2ekube.Options{PodNetwork: true})
	h := newHelm(t, cp.Kubeconfig)
	if out, err := h.run(ctx, "lint", "--strict", chartPath, "--kube-version", "v1.37.2"); err != nil {
		t.Fatalf("helm lint --strict: %v\n%s", err, out)
	}
	if err := cp.StartScheduler(ctx, e2ekube.SchedulerOptions{DefaultOnly: true}); err != nil {
		t.Fatal(err)
	}
	node := startNode(ctx, t, cp, e2ekube.NodeOptions{Name: "gpu-0", Services: true})
	if _, err := cp.Client.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"gpu":"true"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	hostDir(t, simulatedGPUDir)
	renderer := h.postRenderer(t, node.PodResourcesSocket())

	objs := h.template(ctx, t, slices.Concat(inChartNamespace, seedFlags, renderer)...)
	gpuload, err := e2ekube.BuildProgramImage(ctx, t.TempDir(), gpuloadImage, gpuloadPackage)
	if err != nil {
		t.Fatal(err)
	}
	for _, images := range []string{buildImages(ctx, t), buildEtcdImage(t, objs), gpuload} {
		if err := node.ImportImages(ctx, images); err != nil {
			t.Fatal(err)
		}
	}
	for _, claim := range volumeClaims(t, objs) {
		createVolumeFor(ctx, t, cp.Client, claim)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the pods of namespace %s:\n%s", chartNamespace, describePods(cp.Client, chartNamespace))
		}
	})

	start := time.Now()
	install := slices.Concat([]string{"install", "bf-cluster", chartPath, "--create-namespace"}, inChartNamespace, seedFlags)
	out, err := h.run(ctx, append(install, append(renderer, "--wait", "--timeout", "6m")...)...)
	if err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	// No other service holds external metrics here: adapter.apiService's
	// default, auto, registers gpupool-adapter, and NOTES.txt says why.
	if want := "the external-metrics adapter, registered as v1beta1.external.metrics.k8s.io for the HPA (adapter.apiService: auto, and no other service held it)"; !strings.Contains(out, want) {
		t.Errorf("helm install's notes do not say %q:\n%s", want, out)
	}
	if err := workloadsReady(ctx, cp.Client, objs); err != nil {
		t.Fatalf("helm install returned, but: %v", err)
	}
	t.Logf("helm install with the seed's flags: every component Ready in %v", time.Since(start).Round(100*time.Millisecond))
	checkSeedReplicas(t, ctx, cp.Client)
	// The tokens and keys were made in the cluster: the release holds none.
	checkReleaseHoldsNoSecret(t, ctx, cp.Client, 1)
	checkReaderOnlyReads(t, ctx, cp.Client)

	// A BFK pod placed through the chart's components gets its lease.
	waitNodeAllocatable(t, ctx, cp.Client, node.Name, 2*100)
	running := runBFKPod(t, ctx, cp.Client, "ml")
	admin := chartAdmin(t, ctx, cp.Client)
	lease := checkPodLeaseEnv(t, ctx, cp, admin, node.Name, running, 50)

	// The articles' TFJob, on the node labelled as Bitfusion's: its four
	// workers are placed with a lease each (under the chart's default
	// unit, the articles' bitfusion.io/gpu: 2 is 2% of a GPU, as the
	// webhook warns). Their image is not here: placed is what counts.
	if _, err := cp.Client.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"bitfusion-node":"enabled"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	const training = "training"
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: training}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	workers, deleteJob := submitTFJob(t, ctx, cp, training)
	for _, w := range workers {
		if leases := podLeases(t, ctx, admin, &w); len(leases) != 1 || leases[0].Server != node.Name || w.Annotations[kube.AnnotationLease] != leases[0].ID {
			t.Errorf("TFJob worker %s holds %+v, want one lease on %s", w.Name, leases, node.Name)
		}
	}
	deleteJob()
	if err := retry(ctx, time.Minute, func() error {
		leases, err := admin.Leases(ctx, client.LeaseFilter{Namespace: training})
		if err == nil && len(leases) > 0 {
			err = fmt.Errorf("the TFJob's leases are still held: %v", leases)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	kept := chartSecrets(t, ctx, cp.Client)

	// An upgrade that changes a value rolls the allocators; the lease, the
	// tokens and the CA stay.
	start = time.Now()
	before := podUIDs(t, ctx, cp.Client, "app.kubernetes.io/name=gpupool-allocator")
	upgrade := slices.Concat([]string{"upgrade", "bf-cluster", chartPath, "--reuse-values", "--set", "scheduling.binPacking=false"}, inChartNamespace, renderer)
	if out, err := h.run(ctx, append(upgrade, "--wait", "--timeout", "5m")...); err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	if err := retry(ctx, 3*time.Minute, func() error { return workloadsReady(ctx, cp.Client, objs) }); err != nil {
		t.Fatal(err)
	}
	t.Logf("helm upgrade (the policy): the allocators rolled and Ready in %v", time.Since(start).Round(100*time.Millisecond))
	after := podUIDs(t, ctx, cp.Client, "app.kubernetes.io/name=gpupool-allocator")
	for name, uid := range after {
		if before[name] == uid {
			t.Errorf("allocator %s did not roll on the upgrade", name)
		}
	}
	checkAllocatorArg(t, ctx, cp.Client, "--policy=spread")
	checkLeaseKept(t, ctx, cp.Client, lease.ID)
	if now := chartSecrets(t, ctx, cp.Client); !maps.EqualFunc(now, kept, bytes.Equal) {
		t.Error("helm upgrade changed the chart's tokens or certificates: clients of the old ones are cut off")
	}

	start = time.Now()
	if out, err := h.run(ctx, "rollback", "bf-cluster", "1", "-n", chartNamespace, "--wait", "--timeout", "5m"); err != nil {
		t.Fatalf("helm rollback: %v\n%s", err, out)
	}
	if err := retry(ctx, 3*time.Minute, func() error { return workloadsReady(ctx, cp.Client, objs) }); err != nil {
		t.Fatal(err)
	}
	t.Logf("helm rollback to the install: Ready in %v", time.Since(start).Round(100*time.Millisecond))
	checkAllocatorArg(t, ctx, cp.Client, "--policy=fgd-cpu")
	checkLeaseKept(t, ctx, cp.Client, lease.ID)

	// The test's pod is in the release's namespace, beside the token it
	// reads: `helm test --logs` prints its log, as NOTES.txt says.
	out, err = h.run(ctx, "test", "bf-cluster", "-n", chartNamespace, "--logs", "--timeout", "2m")
	if err != nil {
		t.Fatalf("helm test: %v\n%s", err, out)
	}
	if !strings.Contains(out, "gpu-0") {
		t.Errorf("helm test passed without listing the server gpu-0:\n%s", out)
	}

	checkReleaseHoldsNoSecret(t, ctx, cp.Client, 3)

	if out, err := h.run(ctx, "uninstall", "bf-cluster", "-n", chartNamespace, "--wait", "--timeout", "3m"); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	if left := clusterWideLeftovers(t, ctx, cp.Config); len(left) > 0 {
		t.Errorf("helm uninstall left %v", left)
	}
}

// chartPath is the chart, from test/e2e.
const chartPath = "../../deploy/helm/gpupool"

// helmCLI runs the helm CLI against one cluster, with its own config,
// cache and data directories.
type helmCLI struct {
	bin, kubeconfig string
	env             []string
}

// newHelm builds the helm CLI at the version of the Helm library that
// renders the chart in deploy's tests (go.mod names it as a tool): from
// this module's packages, most of them compiled already.
func newHelm(t *testing.T, kubeconfig string) *helmCLI {
	t.Helper()
	home := t.TempDir()
	bin := filepath.Join(home, "helm")
	if out, err := exec.Command("go", "build", "-o", bin, "helm.sh/helm/v3/cmd/helm").CombinedOutput(); err != nil {
		t.Fatalf("building the helm CLI: %v\n%s", err, out)
	}
	return &helmCLI{bin: bin, kubeconfig: kubeconfig, env: append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))}
}

func (h *helmCLI) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, h.bin, append(args, "--kubeconfig", h.kubeconfig)...)
	cmd.Env = h.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// template is `helm template` of the chart with args, as objects.
func (h *helmCLI) template(ctx context.Context, t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	cmd := exec.CommandContext(ctx, h.bin, append([]string{"template", "bf-cluster", chartPath, "--kube-version", "v1.37.2"}, args...)...)
	cmd.Env = h.env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(string(out), "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatal(err)
		}
		if u.Object != nil && u.GetKind() != "" {
			objs = append(objs, u)
		}
	}
	return objs
}

// postRenderer builds test/e2e/postrender and a kustomization that applies
// testdata/simulated-gpus and this node's pod-resources directory to the
// chart's manifests; it returns helm's flags for it.
func (h *helmCLI) postRenderer(t *testing.T, podResourcesSocket string) []string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "postrender")
	if out, err := exec.Command("go", "build", "-o", bin, "./postrender").CombinedOutput(); err != nil {
		t.Fatalf("building the post-renderer: %v\n%s", err, out)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	component, err := filepath.Rel(dir, filepath.Join(wd, "testdata", "simulated-gpus"))
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf(`resources: [helm.yaml]
components: [%s]
patches:
  - patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {name: gpupool-device-plugin, namespace: %s}
      spec:
        template:
          spec:
            volumes:
              - {name: pod-resources, hostPath: {path: %s}}
`, component, chartNamespace, filepath.Dir(podResourcesSocket))
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"--post-renderer", bin, "--post-renderer-args", dir}
}

// buildEtcdImage writes the image of the etcd StatefulSet of objs, this
// machine's etcd under the name the chart gives it, into a tarball.
func buildEtcdImage(t *testing.T, objs []*unstructured.Unstructured) string {
	t.Helper()
	c := statefulPodOf(t, objs, "gpupool-etcd").Spec.Containers[0]
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatal(err)
	}
	return binaryImage(t, c.Image, bin, "usr/local/bin/"+c.Command[0], []string{"PATH=/usr/local/bin:/usr/bin:/bin"})
}

// volumeClaims are the claims of objs' StatefulSets' pods.
func volumeClaims(t *testing.T, objs []*unstructured.Unstructured) []*corev1.PersistentVolumeClaim {
	t.Helper()
	var claims []*corev1.PersistentVolumeClaim
	for _, o := range objs {
		if o.GetKind() != "StatefulSet" {
			continue
		}
		replicas, _, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "replicas")
		templates, _, _ := unstructured.NestedSlice(o.Object, "spec", "volumeClaimTemplates")
		for _, tmpl := range templates {
			var pvc corev1.PersistentVolumeClaim
			decode(t, &unstructured.Unstructured{Object: tmpl.(map[string]any)}, &pvc)
			for i := range int(replicas.(float64)) {
				c := pvc.DeepCopy()
				c.Namespace, c.Name = o.GetNamespace(), fmt.Sprintf("%s-%s-%d", pvc.Name, o.GetName(), i)
				claims = append(claims, c)
			}
		}
		if replicas == nil {
			t.Fatalf("StatefulSet %s has no replicas", o.GetName())
		}
	}
	return claims
}

// checkSeedReplicas: controller.replicas=3 is 3 allocators on 3 etcd
// members, and 3 of each controller.
func checkSeedReplicas(t *testing.T, ctx context.Context, c kubernetes.Interface) {
	t.Helper()
	for _, name := range []string{"gpupool-allocator", "gpupool-etcd"} {
		s, err := c.AppsV1().StatefulSets(chartNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil || s.Status.ReadyReplicas != 3 {
			t.Errorf("StatefulSet %s: %v Ready (%v), want 3", name, s.Status.ReadyReplicas, err)
		}
	}
	for _, name := range []string{"gpupool-webhook", "gpupool-scheduler", "gpupool-kube-scheduler"} {
		d, err := c.AppsV1().Deployments(chartNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil || d.Status.ReadyReplicas != 3 {
			t.Errorf("Deployment %s: %v Ready (%v), want 3", name, d.Status.ReadyReplicas, err)
		}
	}
}

// chartAdmin is an admin client of the chart's allocators, each replica
// by its pod's address (a standby answers 503 and the client tries the
// next), with the chart's token, checking the chart's CA.
func chartAdmin(t *testing.T, ctx context.Context, c kubernetes.Interface) *client.Client {
	t.Helper()
	return chartClient(t, ctx, c, "admin-token")
}

// chartClient is chartAdmin with the token of key of gpupool-tokens.
func chartClient(t *testing.T, ctx context.Context, c kubernetes.Interface, key string) *client.Client {
	t.Helper()
	pods, err := c.CoreV1().Pods(chartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=gpupool-allocator"})
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for _, p := range pods.Items {
		urls = append(urls, fmt.Sprintf("https://%s:8470", p.Status.PodIP))
	}
	secrets := chartSecrets(t, ctx, c)
	admin, err := client.New(urls, string(secrets["gpupool-tokens/"+key]))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(secrets["gpupool-allocator-tls/ca.crt"]) {
		t.Fatal("no CA in the Secret gpupool-allocator-tls")
	}
	admin.SetTLS(&tls.Config{RootCAs: roots, ServerName: "gpupool-allocator." + chartNamespace + ".svc"})
	return admin
}

// chartSecrets are the tokens and certificates the chart made, by
// secret/key.
func chartSecrets(t *testing.T, ctx context.Context, c kubernetes.Interface) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, name := range []string{"gpupool-tokens", "gpupool-ca", "gpupool-allocator-tls", "gpupool-webhook-tls"} {
		s, err := c.CoreV1().Secrets(chartNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range s.Data {
			out[name+"/"+k] = v
		}
	}
	return out
}

func podUIDs(t *testing.T, ctx context.Context, c kubernetes.Interface, selector string) map[string]types.UID {
	t.Helper()
	pods, err := c.CoreV1().Pods(chartNamespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]types.UID{}
	for _, p := range pods.Items {
		out[p.Name] = p.UID
	}
	return out
}

// checkAllocatorArg: every allocator pod runs with arg.
func checkAllocatorArg(t *testing.T, ctx context.Context, c kubernetes.Interface, arg string) {
	t.Helper()
	pods, err := c.CoreV1().Pods(chartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=gpupool-allocator"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if !strings.Contains(strings.Join(p.Spec.Containers[0].Args, " "), arg) {
			t.Errorf("allocator %s runs %v, want %s", p.Name, p.Spec.Containers[0].Args, arg)
		}
	}
}

// checkLeaseKept: the allocators (whichever leads now) still hold lease id.
func checkLeaseKept(t *testing.T, ctx context.Context, c kubernetes.Interface, id string) {
	t.Helper()
	admin := chartAdmin(t, ctx, c)
	var leases []string
	if err := retry(ctx, time.Minute, func() error {
		ls, err := admin.Leases(ctx, client.LeaseFilter{})
		if err != nil {
			return err
		}
		leases = leases[:0]
		for _, l := range ls {
			leases = append(leases, l.ID)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(leases) != 1 || leases[0] != id {
		t.Errorf("the allocators hold %v, want the pod's lease %s alone", leases, id)
	}
}

// clusterWideLeftovers are the pool's cluster-scoped objects (named
// gpupool...) still there: a stale webhook configuration blocks every new
// pod that asks for GPUs.
func clusterWideLeftovers(t *testing.T, ctx context.Context, cfg *rest.Config) []string {
	t.Helper()
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, r := range []schema.GroupVersionResource{
		admissionregistrationv1.SchemeGroupVersion.WithResource("mutatingwebhookconfigurations"),
		admissionregistrationv1.SchemeGroupVersion.WithResource("validatingadmissionpolicies"),
		admissionregistrationv1.SchemeGroupVersion.WithResource("validatingadmissionpolicybindings"),
		rbacv1.SchemeGroupVersion.WithResource("clusterroles"),
		rbacv1.SchemeGroupVersion.WithResource("clusterrolebindings"),
	} {
		list, err := meta.Resource(r).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range list.Items {
			if strings.HasPrefix(o.Name, "gpupool") {
				left = append(left, r.Resource+"/"+o.Name)
			}
		}
	}
	return left
}

// checkReleaseHoldsNoSecret: Helm's release Secrets of bf-cluster, each
// revision up to revisions (sh.helm.release.v1.bf-cluster.v<n>, in the
// release's namespace: base64 of gzip of the release as JSON, its
// manifest, its hooks and its values), hold no token of gpupool-tokens, no
// key of the chart's certificates and no PEM private key: whoever reads
// Secrets in the release's namespace reads no more of the pool than that.
func checkReleaseHoldsNoSecret(t *testing.T, ctx context.Context, c kubernetes.Interface, revisions int) {
	t.Helper()
	secrets := chartSecrets(t, ctx, c)
	var held []string // secret/key whose value must not be in the release
	for name, v := range secrets {
		if strings.HasSuffix(name, "-token") || strings.HasSuffix(name, ".key") {
			held = append(held, name)
			if len(v) < 16 {
				t.Fatalf("%s is %d bytes", name, len(v))
			}
		}
	}
	if len(held) < 5 {
		t.Fatalf("the chart made %d tokens and keys, want 3 tokens and the keys of the CA and the certificates", len(held))
	}
	for n := 1; n <= revisions; n++ {
		name := fmt.Sprintf("sh.helm.release.v1.bf-cluster.v%d", n)
		s, err := c.CoreV1().Secrets(chartNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		zipped, err := base64.StdEncoding.DecodeString(string(s.Data["release"]))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		zr, err := gzip.NewReader(bytes.NewReader(zipped))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		release, err := io.ReadAll(zr)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		type hook struct {
			Name     string `json:"name"`
			Manifest string `json:"manifest"`
		}
		var r struct {
			Manifest string `json:"manifest"`
			Hooks    []hook `json:"hooks"`
		}
		if err := json.Unmarshal(release, &r); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !strings.Contains(r.Manifest, "kind: StatefulSet") {
			t.Fatalf("%s: not the release it should be (manifest of %d bytes)", name, len(r.Manifest))
		}
		if !slices.ContainsFunc(r.Hooks, func(h hook) bool { return strings.Contains(h.Manifest, "kind: Job") && h.Name == "gpupool-secrets" }) {
			t.Errorf("%s: no hook Job gpupool-secrets among its %d hooks", name, len(r.Hooks))
		}
		for _, text := range []struct{ what, text string }{{"manifest", r.Manifest}, {"release", string(release)}} {
			if strings.Contains(text.text, "PRIVATE KEY") {
				t.Errorf("%s: its %s holds a private key", name, text.what)
			}
			for _, key := range held {
				v := secrets[key]
				if strings.Contains(text.text, string(v)) || strings.Contains(text.text, base64.StdEncoding.EncodeToString(v)) {
					t.Errorf("%s: its %s holds %s", name, text.what, key)
				}
			}
		}
	}
}

// checkReaderOnlyReads: the adapter's token (reader-token) reads the pool
// and every namespace's leases, as the adapter does, and may take no
// lease.
func checkReaderOnlyReads(t *testing.T, ctx context.Context, c kubernetes.Interface) {
	t.Helper()
	admin := chartAdmin(t, ctx, c)
	reader := chartClient(t, ctx, c, "reader-token")
	if _, err := reader.Pool(ctx); err != nil {
		t.Errorf("the adapter's token cannot read the pool: %v", err)
	}
	all, err := admin.Leases(ctx, client.LeaseFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if ls, err := reader.Leases(ctx, client.LeaseFilter{}); err != nil || len(ls) != len(all) {
		t.Errorf("the adapter's token lists %d leases (%v), want every namespace's %d", len(ls), err, len(all))
	}
	if _, err := reader.Acquire(ctx, api.AcquireRequest{Namespace: "ml", GPUAmount: 1, GPUPercent: 10}); !client.IsReason(err, api.ReasonForbidden) {
		t.Errorf("the adapter's token acquired a lease: %v, want 403", err)
	}
}
