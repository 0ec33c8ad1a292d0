package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/gpupool/gpupool/internal/ociimage"
	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
)

// simulatedGPUDir is the host directory of testdata/pods' simulated GPUs.
const simulatedGPUDir = "/run/gpupool-e2e-gpus"

// imageUser is the user the manifests run gpupool's non-root pods as.
const imageUser = 65532

// TestOverlayRunsAsPods applies testdata/pods, deploy/overlays/embedded with
// components/kubernetes and components/apiservice, to a cluster of one real
// node (a kubelet over containerd, kube-proxy and CoreDNS on the host), and
// waits until every Deployment's and DaemonSet's pods run the image built
// here and are Ready: the allocator, gpupool-server, the adapter, the
// webhook, gpupool-kube-scheduler, gpupool-scheduler's lease controller,
// and the device plugin. They reach each other, and the apiserver reaches the webhook and
// the adapter, through Services by ClusterIP and by name; in-cluster
// clients reach the apiserver through the Service "kubernetes", with their
// ServiceAccounts' tokens and the manifests' RBAC and securityContexts.
// Then a BFK pod is admitted by the webhook's pods, placed by the
// in-cluster gpupool-kube-scheduler's plugin, and started by the kubelet
// with the device plugin's answer: its lease's environment.
//
// What differs from a GPU cluster, and why: the overlay's patches
// simulate the GPUs (no GPU or NVIDIA runtime here); the tokens are
// random, in the Secrets the overlay generates, as deploy/README.md asks;
// the certificates are deploy/certs.sh's, each webhook's and the
// APIService's caBundle its CA, as deploy/README.md says without
// cert-manager; the node is labelled as the GPU Operator labels GPU nodes;
// the allocator's claim is bound to a hostPath volume (no storage
// provisioner); the device plugin mounts the kubelet's pod-resources
// directory where this kubelet keeps it (its root directory is the test's);
// images are imported, not pulled; the cluster's default scheduler runs on
// the host, as the control plane does. The NetworkPolicies are applied but not
// enforced: the node's CNI bridge does not implement them.
func TestOverlayRunsAsPods(t *testing.T) {
	skipWithoutNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	cp, _ := startControlPlaneWith(ctx, t, nil, e2ekube.Options{PodNetwork: true})
	// The cluster's own scheduler, for the components' pods.
	if err := cp.StartScheduler(ctx, e2ekube.SchedulerOptions{DefaultOnly: true}); err != nil {
		t.Fatal(err)
	}
	node := startNode(ctx, t, cp, e2ekube.NodeOptions{Name: "gpu-0", Services: true})
	objs, err := kustomizeBuild(filepath.Join("testdata", "pods"))
	if err != nil {
		t.Fatal(err)
	}
	gpuload, err := e2ekube.BuildProgramImage(ctx, t.TempDir(), gpuloadImage, gpuloadPackage)
	if err != nil {
		t.Fatal(err)
	}
	for _, images := range []string{buildImages(ctx, t), gpuload} {
		if err := node.ImportImages(ctx, images); err != nil {
			t.Fatal(err)
		}
	}
	gpuNode := []byte(`{"metadata":{"labels":{"nvidia.com/gpu.present":"true"}}}`)
	if _, err := cp.Client.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, gpuNode, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	devices := hostDir(t, simulatedGPUDir)

	config := writePoolConfig(t, nil)
	setSecret(t, find(t, objs, "Secret", "gpupool-allocator-config"), map[string]string{"config.yaml": readString(t, filepath.Dir(config.Path), filepath.Base(config.Path))})
	setSecret(t, find(t, objs, "Secret", "gpupool-tokens"), map[string]string{"admin-token": config.Admin, "server-token": config.Servers, "reader-token": config.Reader})
	setHostPath(t, find(t, objs, "DaemonSet", "gpupool-device-plugin"), "pod-resources", filepath.Dir(node.PodResourcesSocket()))
	certs := makeCerts(t)
	ca := []byte(readString(t, certs, "ca.crt"))
	setWebhooksCABundle(t, find(t, objs, "MutatingWebhookConfiguration", "gpupool"), ca)
	if err := unstructured.SetNestedField(find(t, objs, "APIService", "v1beta1.external.metrics.k8s.io").Object, base64.StdEncoding.EncodeToString(ca), "spec", "caBundle"); err != nil {
		t.Fatal(err)
	}

	v := newValidator(t, cp.Config)
	if err := v.create(ctx, find(t, objs, "Namespace", "gpupool"), false); err != nil {
		t.Fatal(err)
	}
	createCertSecrets(ctx, t, cp.Client, certs)
	createAllocatorVolume(ctx, t, cp.Client, find(t, objs, "PersistentVolumeClaim", "gpupool-allocator-data"))
	for _, o := range objs {
		if err := v.create(ctx, o, false); err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the pods of namespace gpupool:\n%s", describePods(cp.Client, "gpupool"))
		}
	})
	if err := retry(ctx, 3*time.Minute, func() error { return workloadsReady(ctx, cp.Client, objs) }); err != nil {
		t.Fatal(err)
	}
	t.Logf("every component Ready %v after the test started", time.Since(start).Round(100*time.Millisecond))
	if entries, err := os.ReadDir(devices); err != nil || len(entries) != 2 {
		t.Errorf("%s holds %d files (%v): want gpupool-server's two simulated GPUs", devices, len(entries), err)
	}
	// Ready is not yet in service: the device plugin reports the GPUs to
	// the kubelet once the allocator has them healthy, after the daemon
	// registered them; until then the kubelet would refuse a pod placed
	// on them.
	waitNodeAllocatable(t, ctx, cp.Client, node.Name, 2*100)

	// The test reads the BFK pod's lease from the allocator's Service, as
	// an operator's gpupool on a node would.
	running := runBFKPod(t, ctx, cp.Client, "ml")
	allocator, err := cp.Client.CoreV1().Services("gpupool").Get(ctx, "gpupool-allocator", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Over HTTPS by the Service's address, checking the name the
	// certificate has for it, against deploy/certs.sh's CA.
	admin := newClient(t, fmt.Sprintf("https://%s:%d", allocator.Spec.ClusterIP, allocator.Spec.Ports[0].Port), config.Admin)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	admin.SetTLS(&tls.Config{RootCAs: roots, ServerName: "gpupool-allocator.gpupool.svc"})
	checkPodLeaseEnv(t, ctx, cp, admin, node.Name, running, 50)
	t.Logf("the BFK pod Running with its lease %v after the test started", time.Since(start).Round(100*time.Millisecond))

	// The adapter, with its readers token, reads the pool: an external
	// metric through the aggregator.
	const path = "/apis/external.metrics.k8s.io/v1beta1/namespaces/ml/bitfusion_pool_unallocated_gpus"
	if err := retry(ctx, time.Minute, func() error {
		_, err := cp.Client.CoreV1().RESTClient().Get().AbsPath(path).DoRaw(ctx)
		return err
	}); err != nil {
		t.Errorf("GET %s: %v", path, err)
	}
}

// runBFKPod creates a pod as BFK's users write it (one GPU at 50%, the
// gpuload image) in a namespace of theirs, ns, and returns it Running:
// admitted by the webhook's pods, placed by gpupool-kube-scheduler with
// gpupool-scheduler's extender, which takes its lease from the allocator,
// and started by the kubelet with the device plugin's answer.
func runBFKPod(t *testing.T, ctx context.Context, c kubernetes.Interface, ns string) *corev1.Pod {
	t.Helper()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := bfkPod("bfk", 1, 50)
	pod.Spec.Tolerations = nil
	pod.Spec.Containers[0].Image, pod.Spec.Containers[0].ImagePullPolicy = gpuloadImage, corev1.PullIfNotPresent
	pod.Spec.Containers[0].Resources.Requests = nil
	// The apiserver calls the webhook once it has loaded its
	// configurations, and reaches the webhook's pods, Ready by now, once
	// kube-proxy has routed their Service to them: until then the pod is
	// refused, as in any cluster just installed.
	waitForWebhook(t, c, ns)
	if err := retry(ctx, 30*time.Second, func() error {
		_, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return waitPodRunning(t, ctx, c, ns, pod.Name)
}

// buildImages writes the images `make image` builds into a tarball, from
// the binaries TestMain built (every gpupool-* but the demo, as the
// Makefile's SERVER_COMMANDS), gpupool-kube-scheduler and the client built
// static, as `make image` requires, by deploy/image; it returns the
// tarball's path.
func buildImages(ctx context.Context, t *testing.T) string {
	t.Helper()
	gpupoolKubeScheduler(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	// With the Makefile's release flags, the build `make image` made
	// before, if any, is in the cache.
	client := exec.CommandContext(ctx, "go", "build", "-trimpath", "-tags", "grpcnotrace", "-ldflags=-s -w", "-o", bin+"/", "../../cmd/gpupool")
	client.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := client.CombinedOutput(); err != nil {
		t.Fatalf("building the client: %v\n%s", err, out)
	}
	servers, err := filepath.Glob(filepath.Join(binDir, "gpupool-*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, server := range servers {
		if filepath.Base(server) == "gpupool-demo" {
			continue
		}
		if err := os.Symlink(server, filepath.Join(bin, filepath.Base(server))); err != nil {
			t.Fatal(err)
		}
	}
	tarball := filepath.Join(dir, "gpupool-images.tar")
	version := strings.TrimSpace(readString(t, "../..", "VERSION"))
	if out, err := exec.CommandContext(ctx, "go", "run", "../../deploy/image", "-version", version, "-bin", bin, "-out", tarball).CombinedOutput(); err != nil {
		t.Fatalf("deploy/image: %v\n%s", err, out)
	}
	return tarball
}

// binaryImage writes an image ref of the one binary bin, at path (without
// its leading /), on this machine's glibc as deploy/image lays
// gpupool-server's, into a tarball, and returns its path.
func binaryImage(t *testing.T, ref, bin, path string, env []string) string {
	t.Helper()
	libc, err := ociimage.GlibcOf([]string{bin})
	if err != nil {
		t.Fatal(err)
	}
	image, err := ociimage.Build(ociimage.Image{
		Ref:    ref,
		Layers: [][]ociimage.File{libc.Files, {{Path: path, Mode: 0o755, Source: bin}}},
		Env:    env,
	})
	if err != nil {
		t.Fatal(err)
	}
	tarball := filepath.Join(t.TempDir(), "image.tar")
	if err := ociimage.WriteTarball(tarball, image); err != nil {
		t.Fatal(err)
	}
	return tarball
}

// hostDir makes path an empty directory of imageUser's, removed when the
// test ends.
func hostDir(t *testing.T, path string) string {
	t.Helper()
	if err := os.RemoveAll(path); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, imageUser, imageUser); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(path) })
	return path
}

// setSecret replaces the data of the Secret o.
func setSecret(t *testing.T, o *unstructured.Unstructured, data map[string]string) {
	t.Helper()
	encoded := map[string]any{}
	for k, v := range data {
		encoded[k] = base64.StdEncoding.EncodeToString([]byte(v))
	}
	if err := unstructured.SetNestedMap(o.Object, encoded, "data"); err != nil {
		t.Fatal(err)
	}
}

// setHostPath points the hostPath volume of the workload o's pods at path.
func setHostPath(t *testing.T, o *unstructured.Unstructured, volume, path string) {
	t.Helper()
	volumes, _, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "volumes")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range volumes {
		if v := v.(map[string]any); v["name"] == volume {
			if err := unstructured.SetNestedField(v, path, "hostPath", "path"); err != nil {
				t.Fatal(err)
			}
			if err := unstructured.SetNestedSlice(o.Object, volumes, "spec", "template", "spec", "volumes"); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("%s %s has no volume %s", o.GetKind(), o.GetName(), volume)
}

// setWebhooksCABundle sets the caBundle of each webhook of the webhook
// configuration o.
func setWebhooksCABundle(t *testing.T, o *unstructured.Unstructured, ca []byte) {
	t.Helper()
	webhooks, _, err := unstructured.NestedSlice(o.Object, "webhooks")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range webhooks {
		if err := unstructured.SetNestedField(w.(map[string]any), base64.StdEncoding.EncodeToString(ca), "clientConfig", "caBundle"); err != nil {
			t.Fatal(err)
		}
	}
	if err := unstructured.SetNestedSlice(o.Object, webhooks, "webhooks"); err != nil {
		t.Fatal(err)
	}
}

// createAllocatorVolume creates the volume the claim binds to: a directory
// of the allocator's user on this host, as an administrator (or a
// provisioner) provides one.
func createAllocatorVolume(ctx context.Context, t *testing.T, c kubernetes.Interface, claim *unstructured.Unstructured) {
	t.Helper()
	var pvc corev1.PersistentVolumeClaim
	decode(t, claim, &pvc)
	createVolumeFor(ctx, t, c, &pvc)
}

// createVolumeFor creates the volume pvc binds to, as createAllocatorVolume
// does, before or after the claim exists.
func createVolumeFor(ctx context.Context, t *testing.T, c kubernetes.Interface, pvc *corev1.PersistentVolumeClaim) {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chown(dir, imageUser, imageUser); err != nil {
		t.Fatal(err)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvc.Name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: pvc.Spec.Resources.Requests[corev1.ResourceStorage]},
			AccessModes:                   pvc.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
			ClaimRef:                      &corev1.ObjectReference{Namespace: pvc.Namespace, Name: pvc.Name},
		},
	}
	if _, err := c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// workloadsReady says which of the Deployments, StatefulSets and
// DaemonSets of objs do not yet have all their pods, of their current
// template, Ready.
func workloadsReady(ctx context.Context, c kubernetes.Interface, objs []*unstructured.Unstructured) error {
	var errs []error
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment":
			d, err := c.AppsV1().Deployments(o.GetNamespace()).Get(ctx, o.GetName(), metav1.GetOptions{})
			if err != nil {
				return err
			}
			if want := *d.Spec.Replicas; d.Status.UpdatedReplicas != want || d.Status.ReadyReplicas != want || d.Status.Replicas != want {
				errs = append(errs, fmt.Errorf("deployment %s: %d of %d replicas Ready", d.Name, d.Status.ReadyReplicas, want))
			}
		case "StatefulSet":
			s, err := c.AppsV1().StatefulSets(o.GetNamespace()).Get(ctx, o.GetName(), metav1.GetOptions{})
			if err != nil {
				return err
			}
			if want := *s.Spec.Replicas; s.Status.UpdatedReplicas != want || s.Status.ReadyReplicas != want || s.Status.CurrentRevision != s.Status.UpdateRevision {
				errs = append(errs, fmt.Errorf("statefulset %s: %d of %d replicas Ready, %d updated", s.Name, s.Status.ReadyReplicas, want, s.Status.UpdatedReplicas))
			}
		case "DaemonSet":
			d, err := c.AppsV1().DaemonSets(o.GetNamespace()).Get(ctx, o.GetName(), metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !daemonSetReady(d) {
				errs = append(errs, fmt.Errorf("daemonset %s: %d of %d pods Ready", d.Name, d.Status.NumberReady, d.Status.DesiredNumberScheduled))
			}
		}
	}
	return errors.Join(errs...)
}

func daemonSetReady(d *appsv1.DaemonSet) bool {
	s := d.Status
	return s.DesiredNumberScheduled > 0 && s.NumberReady == s.DesiredNumberScheduled && s.UpdatedNumberScheduled == s.DesiredNumberScheduled
}

// describePods says, for a failing test, each pod of ns's phase, node and
// containers' states, the namespace's events, and the logs of the
// containers not ready (their previous run's too, if they restarted).
func describePods(c kubernetes.Interface, ns string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s: %s on %q %s\n", p.Name, p.Status.Phase, p.Spec.NodeName, p.Status.Message)
		for _, s := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, "  %s: ready %t, %d restarts, state %+v, last %+v\n", s.Name, s.Ready, s.RestartCount, s.State, s.LastTerminationState)
			if s.Ready {
				continue
			}
			for _, previous := range []bool{false, true} {
				if previous && s.RestartCount == 0 {
					continue
				}
				lines := int64(30)
				log, err := c.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: s.Name, Previous: previous, TailLines: &lines}).DoRaw(ctx)
				if err != nil {
					log = []byte(err.Error())
				}
				fmt.Fprintf(&b, "  --- log of %s (previous %t):\n%s\n", s.Name, previous, log)
			}
		}
	}
	events, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return b.String() + err.Error()
	}
	for _, e := range events.Items {
		fmt.Fprintf(&b, "event %s %s: %s %s (x%d)\n", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message, e.Count)
	}
	return b.String()
}
