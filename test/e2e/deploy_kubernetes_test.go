package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/kubeconfig"
	"github.com/gpupool/gpupool/internal/testcert"
	"github.com/gpupool/gpupool/kube"
	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
)

// TestDeployedKubernetesComponent runs deploy/components/kubernetes as the
// full overlay deploys it, against a real control plane: the webhook,
// gpupool-scheduler and gpupool-kube-scheduler each with its
// Deployment's command, arguments and settings, as its ServiceAccount, under
// the RBAC the overlay grants; the webhook configurations as generated;
// gpupool-kube-scheduler with its ConfigMap's configuration, leader
// election included, reaching the allocator at the ConfigMap
// gpupool-endpoints' address; the certificates made by deploy/certs.sh and
// put into Secrets as deploy/README.md says. Only addresses differ: each
// Service is a port on loopback. examples/bfk, applied as it is (with the toleration of the test's
// fake node), has its two pods normalised, placed on the GPU server and
// leased; the third half-GPU pod is refused by the namespace's quota, a pod
// asking for 101% by the webhook, as docs/kubernetes.md says; the
// allocator's quota for the namespace is its ResourceQuota's; a deleted
// pod's lease ends.
func TestDeployedKubernetesComponent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	logs := &syncBuffer{}
	cp, _ := startControlPlane(ctx, t, logs)
	objs, err := kustomizeBuild(filepath.Join(deployDir, "overlays", "full"))
	if err != nil {
		t.Fatal(err)
	}

	config := writePoolConfig(t, nil)
	// The allocator on HTTPS, as the overlay runs it, but a port on
	// loopback: its certificate names 127.0.0.1, from a CA of the test's,
	// in the Secret whose ca.crt the manifests mount into its clients.
	allocatorCA := testcert.NewCA(t, "gpupool-allocator-ca")
	allocatorCerts := t.TempDir()
	allocatorCAFile := allocatorCA.WriteFile(t, allocatorCerts)
	allocatorCert, allocatorKey := testcert.WritePair(t, allocatorCerts, allocatorCA.Issue(t, "gpupool-allocator", x509.ExtKeyUsageServerAuth))
	a := startAllocator(t, "--data-dir", t.TempDir(), "--config", config.Path, "--heartbeat-timeout", "1h",
		"--tls-cert-file", allocatorCert, "--tls-private-key-file", allocatorKey)
	trusting := func(c *client.Client) *client.Client {
		if err := c.TrustCAFile(allocatorCAFile); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// GPUs of the cluster's gpu-memory setting, where the pool counts a
	// gpu-memory request as the quota does (docs/kubernetes.md, "The unit").
	var settings corev1.ConfigMap
	decode(t, find(t, objs, "ConfigMap", "gpupool-kubernetes"), &settings)
	gpuMemory := resource.MustParse(settings.Data["gpu-memory"])
	server := gpuServer("gpu-0", 2)
	for i := range server.GPUs {
		server.GPUs[i].MemoryBytes = gpuMemory.Value()
	}
	register(t, trusting(newClient(t, a.URL, config.Servers)), server)
	if err := cp.AddKwokNode(ctx, "gpu-0", map[string]string{"cpu": "96", "memory": "512Gi", "pods": "110"}); err != nil {
		t.Fatal(err)
	}

	// What the cluster holds before the pods start: the component's
	// identities, their rights and its settings; the Secrets of
	// deploy/README.md, the admin token in the overlay's token Secret.
	v := newValidator(t, cp.Config)
	for _, o := range objs {
		if slices.Contains([]string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap",
			"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}, o.GetKind()) {
			if err := v.create(ctx, o, false); err != nil {
				t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
	}
	certs := makeCerts(t)
	createCertSecrets(ctx, t, cp.Client, certs)
	allocatorTLS := map[string][]byte{corev1.TLSCertKey: []byte(readString(t, allocatorCerts, "tls.crt")),
		corev1.TLSPrivateKeyKey: []byte(readString(t, allocatorCerts, "tls.key")), "ca.crt": []byte(readString(t, allocatorCerts, "ca.crt"))}
	if _, err := cp.Client.CoreV1().Secrets("gpupool").Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gpupool-allocator-tls", Namespace: "gpupool"},
		Data: allocatorTLS}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var tokens corev1.Secret
	decode(t, find(t, objs, "Secret", "gpupool-tokens"), &tokens)
	createSecret(ctx, t, cp.Client, tokens.Name, map[string]string{"admin-token": config.Admin, "server-token": config.Servers, "reader-token": config.Reader})

	// The webhook, behind its Service and configurations.
	webhookPort := freePort(t)
	pod := podOf(t, objs, "gpupool-webhook")
	startPod(ctx, t, cp.Client, logs, pod, binDir, regexp.MustCompile(`webhook serving`), map[string]string{"--listen": "127.0.0.1:" + webhookPort})
	n, err := strconv.Atoi(webhookPort)
	if err != nil {
		t.Fatal(err)
	}
	port := int32(n)
	if err := cp.LocalService(ctx, "gpupool", "gpupool-webhook", port); err != nil {
		t.Fatal(err)
	}
	ca := []byte(readString(t, certs, "ca.crt"))
	var mutating admissionregistrationv1.MutatingWebhookConfiguration
	decode(t, find(t, objs, "MutatingWebhookConfiguration", "gpupool"), &mutating)
	for i := range mutating.Webhooks {
		mutating.Webhooks[i].ClientConfig.Service.Port, mutating.Webhooks[i].ClientConfig.CABundle = &port, ca
	}
	if _, err := cp.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &mutating, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The allocator's Service is a port on loopback: the ConfigMap that
	// names it for every component says so.
	endpoints := find(t, objs, "ConfigMap", "gpupool-endpoints")
	if _, err := cp.Client.CoreV1().ConfigMaps("gpupool").Patch(ctx, endpoints.GetName(), types.MergePatchType,
		fmt.Appendf(nil, `{"data":{"allocator":%q}}`, a.URL), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	// gpupool-scheduler, as its ServiceAccount: the lease controller.
	schedulerKubeconfig, err := cp.ServiceAccountKubeconfig(ctx, "gpupool", "gpupool-scheduler")
	if err != nil {
		t.Fatal(err)
	}
	startPod(ctx, t, cp.Client, logs, podOf(t, objs, "gpupool-scheduler"), binDir, regexp.MustCompile(`the lease controller and /metrics only`), map[string]string{
		"--metrics-listen": "127.0.0.1:0", "--kubeconfig": schedulerKubeconfig})

	// gpupool-kube-scheduler, as its ServiceAccount, with the deployed
	// configuration.
	kubeSchedulerKubeconfig, err := cp.ServiceAccountKubeconfig(ctx, "gpupool", "gpupool-kube-scheduler")
	if err != nil {
		t.Fatal(err)
	}
	securePort := freePort(t)
	sched := podOf(t, objs, "gpupool-kube-scheduler")
	startPod(ctx, t, cp.Client, logs, sched, filepath.Dir(gpupoolKubeScheduler(t)), regexp.MustCompile(`Successfully acquired lease" lock="gpupool/gpupool-scheduler"`), map[string]string{
		"--secure-port": securePort, "--authentication-kubeconfig": kubeSchedulerKubeconfig, "--authorization-kubeconfig": kubeSchedulerKubeconfig},
		func(mounts map[string]string) {
			rewriteSchedulerConfig(t, mounts, kubeSchedulerKubeconfig)
		})
	// kube-scheduler serves a certificate it made itself, which a kubelet's
	// probe does not check either.
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	waitFor(t, func() bool {
		resp, err := insecure.Get("https://127.0.0.1:" + securePort + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	// examples/bfk, as a team applies it.
	example, err := kustomizeBuild(filepath.Join(deployDir, "examples", "bfk"))
	if err != nil {
		t.Fatal(err)
	}
	var examplePods []*corev1.Pod
	for _, o := range example {
		if o.GetKind() == "Pod" {
			p := &corev1.Pod{}
			decode(t, o, p)
			p.Spec.Tolerations = append(p.Spec.Tolerations, e2ekube.KwokToleration)
			examplePods = append(examplePods, p)
			continue
		}
		if err := v.create(ctx, o, false); err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	ns := examplePods[0].Namespace
	waitForWebhook(t, cp.Client, ns)
	pods := cp.Client.CoreV1().Pods(ns)
	// Quota admission refuses pods until kube-controller-manager has
	// counted the new ResourceQuota.
	if err := retry(ctx, 30*time.Second, func() error {
		_, err := pods.Create(ctx, examplePods[0], metav1.CreateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, p := range examplePods[1:] {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	admin := trusting(newClient(t, a.URL, config.Admin))
	leases := func() map[string]api.Lease {
		t.Helper()
		ls, err := admin.Leases(ctx, client.LeaseFilter{Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		byPod := map[string]api.Lease{}
		for _, l := range ls {
			byPod[l.Owner.Pod] = l
		}
		return byPod
	}
	bound := map[string]*corev1.Pod{}
	if err := retry(ctx, time.Minute, func() error {
		for _, p := range examplePods {
			got, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got.Spec.NodeName == "" {
				return fmt.Errorf("pod %s is not bound", p.Name)
			}
			bound[p.Name] = got
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	held := leases()
	half := resource.MustParse("50")
	for name, p := range bound {
		l, ok := held[name]
		c := p.Spec.Containers[0]
		gpu, limit := c.Resources.Requests[kube.ResourceGPU], c.Resources.Limits[kube.ResourceGPU]
		if !ok || l.Owner.UID != string(p.UID) || l.Server != "gpu-0" || p.Spec.NodeName != "gpu-0" || p.Annotations[kube.AnnotationLease] != l.ID {
			t.Errorf("pod %s on %q (annotations %v), its lease %+v: want both on gpu-0, the pod owning the lease it names", name, p.Spec.NodeName, p.Annotations, l)
		}
		if gpu.Cmp(half) != 0 || limit.Cmp(half) != 0 || p.Spec.SchedulerName != kube.SchedulerName || p.Annotations[kube.AnnotationStatus] != kube.StatusInjected {
			t.Errorf("pod %s: requests %v, limits %v, scheduler %s, annotations %v: want bitfusion.io/gpu 50, placed by %s, injected",
				name, c.Resources.Requests, c.Resources.Limits, p.Spec.SchedulerName, p.Annotations, kube.SchedulerName)
		}
	}
	if err := retry(ctx, 30*time.Second, func() error {
		quotas, err := admin.Quotas(ctx)
		if err != nil {
			return err
		}
		for _, q := range quotas {
			if q.Namespace == ns && q.Limited && q.HardPercent == 100 && q.UsedPercent == 100 {
				return nil
			}
		}
		return fmt.Errorf("the allocator's quotas %+v: want %s's 100%%, all used", quotas, ns)
	}); err != nil {
		t.Error(err)
	}

	third := examplePods[0].DeepCopy()
	third.Name += "-again"
	_, err = pods.Create(ctx, third, metav1.CreateOptions{})
	if want := "exceeded quota: gpu, requested: requests.bitfusion.io/gpu=50, used: requests.bitfusion.io/gpu=100, limited: requests.bitfusion.io/gpu=100"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a third half-GPU pod: %v; want refused with %q", err, want)
	}
	tooMuch := examplePods[0].DeepCopy()
	tooMuch.Name = "too-much"
	tooMuch.Spec.Containers[0].Resources.Limits[kube.ResourceGPUPercent] = resource.MustParse("101")
	_, err = pods.Create(ctx, tooMuch, metav1.CreateOptions{})
	if want := `admission webhook "mutate.pods.gpupool.io" denied the request: spec.containers[0].resources.limits[bitfusion.io/gpu-percent]: Invalid value: 101: must be 1..100 (percent of each GPU)`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a pod asking for 101%%: %v; want refused with %q", err, want)
	}

	checkPoolAnnotationsGuarded(ctx, t, cp, ns, bound[examplePods[1].Name], schedulerKubeconfig)

	gone := examplePods[0].Name
	if err := pods.Delete(ctx, gone, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	if err := retry(ctx, 30*time.Second, func() error {
		if l, ok := leases()[gone]; ok {
			return fmt.Errorf("pod %s is deleted and its lease %s is still held", gone, l.ID)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// checkPoolAnnotationsGuarded: under the overlay's policies, a user of
// namespace ns who may create and update pods can neither create a pod
// with gpupool.io/lease nor change the lease of the bound pod leased, but
// can still relabel it; gpupool-scheduler's ServiceAccount writes a lease
// on a pod, as its lease controller does when it acquires one again.
func checkPoolAnnotationsGuarded(ctx context.Context, t *testing.T, cp *e2ekube.ControlPlane, ns string, leased *corev1.Pod, schedulerKubeconfig string) {
	t.Helper()
	if _, err := cp.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "member"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "member"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "create", "update", "patch"}}}}
	if _, err := cp.Client.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "member"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "member"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "member", Namespace: ns}}}
	if _, err := cp.Client.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	as := func(kubeconfigPath string) kubernetes.Interface {
		cfg, err := kubeconfig.Load(kubeconfigPath)
		if err != nil {
			t.Fatal(err)
		}
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	memberKubeconfig, err := cp.ServiceAccountKubeconfig(ctx, ns, "member")
	if err != nil {
		t.Fatal(err)
	}
	member := as(memberKubeconfig).CoreV1().Pods(ns)

	forged := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "forged", Annotations: map[string]string{kube.AnnotationLease: leased.Annotations[kube.AnnotationLease]}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "main"}}}}
	// kube-apiserver loads a new policy in the background.
	want := "only gpupool sets gpupool.io/lease on a pod: create the pod without it"
	if err := retry(ctx, 30*time.Second, func() error {
		_, err := member.Create(ctx, forged, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case err == nil:
			return fmt.Errorf("a member's pod with another's lease was admitted; want refused with %q", want)
		case !strings.Contains(err.Error(), want):
			return fmt.Errorf("a member's pod with another's lease: %w; want refused with %q", err, want)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	patch := func(pods corev1client.PodInterface, name, field, key, value string) error {
		_, err := pods.Patch(ctx, name, types.MergePatchType,
			fmt.Appendf(nil, `{"metadata":{%q:{%q:%q}}}`, field, key, value), metav1.PatchOptions{})
		return err
	}
	if err := patch(member, leased.Name, "annotations", kube.AnnotationLease, "lease-999999"); err == nil ||
		!strings.Contains(err.Error(), "only gpupool sets gpupool.io/lease on a pod: an update may not add, change or remove it") {
		t.Errorf("a member changing pod %s's lease: %v; want refused", leased.Name, err)
	}
	if err := patch(member, leased.Name, "labels", "team", "vision"); err != nil {
		t.Errorf("a member relabelling pod %s: %v", leased.Name, err)
	}

	plain := forged.DeepCopy()
	plain.Name, plain.Annotations = "plain", nil
	if _, err := member.Create(ctx, plain, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := patch(as(schedulerKubeconfig).CoreV1().Pods(ns), plain.Name, "annotations", kube.AnnotationLease, "lease-000042"); err != nil {
		t.Errorf("gpupool-scheduler writing a lease on pod %s: %v", plain.Name, err)
	}
}

// makeCerts runs deploy/certs.sh into a new directory, which it returns.
func makeCerts(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("bash", filepath.Join(deployDir, "certs.sh"), dir).CombinedOutput(); err != nil {
		t.Fatalf("deploy/certs.sh: %v\n%s", err, out)
	}
	return dir
}

// createCertSecrets puts the certificates of deploy/certs.sh, written to
// certs, into the Secrets the components mount, as deploy/README.md says.
func createCertSecrets(ctx context.Context, t *testing.T, c kubernetes.Interface, certs string) {
	t.Helper()
	for _, name := range []string{"gpupool-allocator-tls", "gpupool-adapter-tls", "gpupool-webhook-tls"} {
		leaf := strings.TrimSuffix(name, "-tls")
		createSecret(ctx, t, c, name, map[string]string{
			corev1.TLSCertKey: readString(t, certs, leaf+".crt"), corev1.TLSPrivateKeyKey: readString(t, certs, leaf+".key"), "ca.crt": readString(t, certs, "ca.crt")})
	}
}

func readString(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// createSecret creates the Secret gpupool/name.
func createSecret(ctx context.Context, t *testing.T, c kubernetes.Interface, name string, data map[string]string) {
	t.Helper()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "gpupool"}, StringData: data}
	if _, err := c.CoreV1().Secrets("gpupool").Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// find returns the object of kind named name, or with kustomize's hash
// suffix after it.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && (o.GetName() == name || strings.HasPrefix(o.GetName(), name+"-")) {
			return o
		}
	}
	t.Fatalf("no %s %s", kind, name)
	return nil
}

func decode(t *testing.T, o *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
	}
}

// podOf is the pod template of the Deployment name.
func podOf(t *testing.T, objs []*unstructured.Unstructured, name string) corev1.PodTemplateSpec {
	t.Helper()
	var d appsv1.Deployment
	decode(t, find(t, objs, "Deployment", name), &d)
	return d.Spec.Template
}

// statefulPodOf is the pod template of the StatefulSet name of objs.
func statefulPodOf(t *testing.T, objs []*unstructured.Unstructured, name string) corev1.PodTemplateSpec {
	t.Helper()
	var s appsv1.StatefulSet
	decode(t, find(t, objs, "StatefulSet", name), &s)
	return s.Spec.Template
}

// startPod does for the first container of pod what a kubelet does: it
// writes the Secrets and ConfigMaps the container mounts into directories
// of the test, reads its environment from the cluster, and runs its command
// (the program of that name in dir) with that environment and its
// arguments, $(VAR) expanded and each mount path replaced by its directory. flags replace the values of
// those flags or are added: the addresses, and the kubeconfig a pod has by
// its ServiceAccount. edit, if given, sees the directories by mount path
// before the command starts.
func startPod(ctx context.Context, t *testing.T, c kubernetes.Interface, logs *syncBuffer, pod corev1.PodTemplateSpec, dir string,
	ready *regexp.Regexp, flags map[string]string, edit ...func(mounts map[string]string)) {
	t.Helper()
	ctr := pod.Spec.Containers[0]
	ns := "gpupool"
	mounts := map[string]string{}
	for _, m := range ctr.VolumeMounts {
		i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 {
			t.Fatalf("%s mounts the volume %s, which the pod lacks", ctr.Name, m.Name)
		}
		files := map[string]string{}
		var items []corev1.KeyToPath
		switch v := pod.Spec.Volumes[i]; {
		case v.Secret != nil:
			s, err := c.CoreV1().Secrets(ns).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for k, b := range s.Data {
				files[k] = string(b)
			}
			items = v.Secret.Items
		case v.ConfigMap != nil:
			cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			files, items = cm.Data, v.ConfigMap.Items
		case v.EmptyDir != nil:
		default:
			t.Fatalf("volume %s: only Secrets, ConfigMaps and emptyDirs are mounted here", v.Name)
		}
		if items != nil {
			picked := map[string]string{}
			for _, it := range items {
				picked[it.Path] = files[it.Key]
			}
			files = picked
		}
		mounts[m.MountPath] = t.TempDir()
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(mounts[m.MountPath], name), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	env := map[string]string{}
	for _, e := range ctr.Env {
		switch ref := e.ValueFrom; {
		case ref == nil:
			env[e.Name] = e.Value
		case ref.ConfigMapKeyRef != nil:
			cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, ref.ConfigMapKeyRef.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			env[e.Name] = cm.Data[ref.ConfigMapKeyRef.Key]
		default:
			t.Fatalf("env %s: only values and ConfigMap keys are read here", e.Name)
		}
	}
	variable := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	var args []string
	seen := map[string]bool{}
	for _, a := range append(ctr.Command[1:], ctr.Args...) {
		a = variable.ReplaceAllStringFunc(a, func(v string) string { return env[v[2:len(v)-1]] })
		for path, local := range mounts {
			a = strings.ReplaceAll(a, path, local)
		}
		if name, _, ok := strings.Cut(a, "="); ok && flags[name] != "" {
			a, seen[name] = name+"="+flags[name], true
		}
		args = append(args, a)
	}
	for name, value := range flags {
		if !seen[name] {
			args = append(args, name+"="+value)
		}
	}
	for _, f := range edit {
		f(mounts)
	}
	// The container's environment, as the kubelet sets it, its paths where
	// the mounts are here.
	var environ []string
	for name, value := range env {
		for path, local := range mounts {
			value = strings.ReplaceAll(value, path, local)
		}
		environ = append(environ, name+"="+value)
	}
	startCommand(t, logs, environ, filepath.Join(dir, filepath.Base(ctr.Command[0])), ready, args...)
}

// rewriteSchedulerConfig points kube-scheduler's configuration, mounted
// from its ConfigMap, at the cluster as a ServiceAccount's kubeconfig, and
// the files its plugin's args name where mounts put them.
func rewriteSchedulerConfig(t *testing.T, mounts map[string]string, kubeconfig string) {
	t.Helper()
	local := func(path string) string {
		for mounted, dir := range mounts {
			if rest, ok := strings.CutPrefix(path, mounted+"/"); ok {
				return filepath.Join(dir, rest)
			}
		}
		t.Fatalf("kube-scheduler's %s is in no volume it mounts", path)
		return ""
	}
	path := local("/etc/kubernetes/gpupool-scheduler/config.yaml")
	var config map[string]any
	if err := yaml.Unmarshal([]byte(readString(t, filepath.Dir(path), filepath.Base(path))), &config); err != nil {
		t.Fatal(err)
	}
	config["clientConnection"].(map[string]any)["kubeconfig"] = kubeconfig
	for _, pc := range config["profiles"].([]any)[0].(map[string]any)["pluginConfig"].([]any) {
		args := pc.(map[string]any)["args"].(map[string]any)
		if file, ok := args["tokenFile"].(string); ok {
			args["tokenFile"] = local(file)
		}
	}
	b, err := yaml.Marshal(config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
