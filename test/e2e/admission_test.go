package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpupool/gpupool/internal/golden"
	"github.com/gpupool/gpupool/internal/procstat"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/admission"
	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
)

// admissionExamples are the webhook's own examples, as users write them.
const admissionExamples = "../../kube/admission/testdata"

// unitNamespace is where each unit's webhook admits pods: one control
// plane, one webhook per unit, each registered for its namespace.
func unitNamespace(u kube.Unit) string { return "bfk-" + unitName(u) }

// unitName is u as an object's name: memory:8Gi is memory-8gi.
func unitName(u kube.Unit) string { return strings.ToLower(strings.ReplaceAll(string(u), ":", "-")) }

// webhookUnits are the units a webhook runs in: the named ones, and the
// articles' slices of 8Gi, whose refusals testdata/refusals.yaml holds.
var webhookUnits = append(slices.Clone(kube.Units), kube.MemoryUnit(8<<30))

// quotaNamespace holds the quota test's pods, admitted in percent.
const quotaNamespace = "bfk-quota"

// TestAdmission runs gpupool-webhook, once per unit, registered with a real
// kube-apiserver as users deploy it, and checks what the apiserver stores
// and refuses: the examples' pods (created directly, and by the Deployment
// and Job controllers) against golden files, every refusal with its
// message, an update of an admitted pod's request, the namespace quota
// counting bitfusion.io/gpu, and which pods wait on a webhook that is down.
// No scheduler runs: the pods stay Pending, which is all admission needs.
func TestAdmission(t *testing.T) {
	ctx := context.Background()
	logs := &syncBuffer{}
	cp, _ := startControlPlane(ctx, t, logs)
	dir := t.TempDir()

	certFile, keyFile := writeServingCert(t, cp, dir)
	c := cp.Client
	createPodPolicy(ctx, t, cp)
	webhooks := map[kube.Unit]*exec.Cmd{}
	addrs := map[kube.Unit]string{}
	for _, unit := range webhookUnits {
		namespaces := []string{unitNamespace(unit)}
		if unit == kube.UnitPercent {
			namespaces = append(namespaces, quotaNamespace)
		}
		addr := "127.0.0.1:" + freePort(t)
		addrs[unit] = addr
		webhooks[unit] = startBinary(t, logs, "gpupool-webhook", regexp.MustCompile(`webhook serving`), "--listen", addr, "--unit", string(unit),
			"--tls-cert-file", certFile, "--tls-private-key-file", keyFile)
		registerWebhook(t, c, "gpupool-"+unitName(unit), "https://"+addr, cp.CA, namespaces)
		for _, ns := range namespaces {
			if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitForWebhook(t, c, ns)
		}
	}

	t.Run("examples", func(t *testing.T) {
		for _, unit := range kube.Units {
			for _, name := range []string{"pod-percent.yaml", "pod-memory.yaml", "deployment.yaml", "job.yaml", "pod-gpu.yaml"} {
				t.Run(string(unit)+"/"+name, func(t *testing.T) {
					golden.Check(t, filepath.Join("testdata", "admission", string(unit), name), storedExample(t, c, unitNamespace(unit), name))
				})
			}
		}
	})
	t.Run("refusals", func(t *testing.T) { checkRefusals(t, c) })
	t.Run("update", func(t *testing.T) { checkUpdateRefused(t, c) })
	t.Run("warning", func(t *testing.T) { checkWarning(t, cp.Config) })
	t.Run("quota", func(t *testing.T) { checkQuota(t, c, quotaNamespace) })
	t.Run("largest reviews", func(t *testing.T) {
		checkLargestReviews(t, webhooks[kube.UnitPercent], addrs[kube.UnitPercent], cp.CA)
	})
	t.Run("webhook down", func(t *testing.T) {
		if err := webhooks[kube.UnitGPUs].Process.Kill(); err != nil {
			t.Fatal(err)
		}
		checkWebhookDown(t, c, unitNamespace(kube.UnitGPUs))
	})
}

// registerWebhook registers the webhook at url with kube-apiserver for pods in
// namespaces, as admission.Webhook builds the configuration.
func registerWebhook(t testing.TB, c kubernetes.Interface, name, url string, ca []byte, namespaces []string) {
	t.Helper()
	mutating := admission.Webhook(name, func(path string) admissionregistrationv1.WebhookClientConfig {
		return admissionregistrationv1.WebhookClientConfig{URL: ptr.To(url + path), CABundle: ca}
	})
	mutating.Webhooks[0].NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpIn, Values: namespaces}}}
	if _, err := c.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(context.Background(), mutating, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// createPodPolicy creates the full overlay's gpupool-pod-annotations
// policy and its binding, as users deploy them: what admission decided on
// a pod cannot change on update.
func createPodPolicy(ctx context.Context, t *testing.T, cp *e2ekube.ControlPlane) {
	t.Helper()
	objs, err := kustomizeBuild(filepath.Join(deployDir, "overlays", "full"))
	if err != nil {
		t.Fatal(err)
	}
	v := newValidator(t, cp.Config)
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if err := v.create(ctx, find(t, objs, kind, "gpupool-pod-annotations"), false); err != nil {
			t.Fatalf("%s gpupool-pod-annotations: %v", kind, err)
		}
	}
}

// waitForWebhook waits until kube-apiserver calls the webhook for pods in
// ns (it loads configurations asynchronously), asking with a dry run.
func waitForWebhook(t testing.TB, c kubernetes.Interface, ns string) {
	t.Helper()
	probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "probe", Image: "probe", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{kube.ResourceGPUAmount: resource.MustParse("0")}}}}}}
	var err error
	waitFor(t, func() bool {
		_, err = c.CoreV1().Pods(ns).Create(context.Background(), probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), admission.MutatingWebhookName)
	})
}

// storedExample creates an example in ns and returns, as YAML, the pod
// kube-apiserver stored for it (for a Deployment, each of its pods must be
// the same), or "denied: " and the refusal.
func storedExample(t *testing.T, c kubernetes.Interface, ns, name string) []byte {
	t.Helper()
	ctx := context.Background()
	b, err := os.ReadFile(filepath.Join(admissionExamples, name))
	if err != nil {
		t.Fatal(err)
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(b, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The controller's pods, and the object its FailedCreate events are about.
	var selector, involved string
	replicas := 1
	switch o := obj.(type) {
	case *corev1.Pod:
		p, err := c.CoreV1().Pods(ns).Create(ctx, o, metav1.CreateOptions{})
		if err != nil {
			return denied(t, err)
		}
		return normalisedPod(t, p)
	case *appsv1.Deployment:
		if _, err := c.AppsV1().Deployments(ns).Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		selector, replicas = metav1.FormatLabelSelector(o.Spec.Selector), int(*o.Spec.Replicas)
		involved = "involvedObject.kind=ReplicaSet" // the Deployment's only one
	case *batchv1.Job:
		if _, err := c.BatchV1().Jobs(ns).Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		selector = batchv1.JobNameLabel + "=" + o.Name
		involved = "involvedObject.kind=Job,involvedObject.name=" + o.Name
	default:
		t.Fatalf("%s: a %T is no example", name, obj)
	}
	// The controller creates the pods, or reports why it cannot.
	var stored []byte
	waitFor(t, func() bool {
		pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) == replicas {
			stored = normalisedPod(t, &pods.Items[0])
			for _, p := range pods.Items[1:] {
				if other := normalisedPod(t, &p); !bytes.Equal(other, stored) {
					t.Errorf("the replicas differ:\n%s\n%s", stored, other)
				}
			}
		} else if message := failedCreate(t, c, ns, involved); message != "" {
			stored = []byte("denied: " + message + "\n")
		}
		return stored != nil
	})
	return stored
}

// failedCreate is the message of the first event in ns saying that the
// controller of the involved object could not create a pod.
func failedCreate(t *testing.T, c kubernetes.Interface, ns, involved string) string {
	t.Helper()
	events, err := c.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "reason=FailedCreate," + involved})
	if err != nil {
		t.Fatal(err)
	}
	if len(events.Items) == 0 {
		return ""
	}
	return events.Items[0].Message
}

// denied is a refusal as the golden files hold it; any other error fails
// the test.
func denied(t *testing.T, err error) []byte {
	t.Helper()
	if !apierrors.IsInvalid(err) {
		t.Fatalf("not a refusal: %v", err)
	}
	return []byte("denied: " + err.Error() + "\n")
}

// normalisedPod is p as YAML without what differs between runs: its UID,
// resource version, timestamps, managed fields, status, a generated name,
// the labels and owner UIDs that carry its controller's UID, and the
// ServiceAccount token volume, whose name is random. Defaults stay.
func normalisedPod(t *testing.T, p *corev1.Pod) []byte {
	t.Helper()
	p = p.DeepCopy()
	p.UID, p.ResourceVersion, p.CreationTimestamp, p.ManagedFields, p.Status = "", "", metav1.Time{}, nil, corev1.PodStatus{}
	if p.GenerateName != "" {
		p.Name = ""
	}
	delete(p.Labels, batchv1.ControllerUidLabel)
	delete(p.Labels, "controller-uid") // the Job controller's legacy label
	for i := range p.OwnerReferences {
		p.OwnerReferences[i].UID = ""
	}
	const tokenVolume = "kube-api-access-"
	p.Spec.Volumes = dropNamed(p.Spec.Volumes, func(v corev1.Volume) string { return v.Name }, tokenVolume)
	for _, list := range [][]corev1.Container{p.Spec.Containers, p.Spec.InitContainers} {
		for i := range list {
			list[i].VolumeMounts = dropNamed(list[i].VolumeMounts, func(m corev1.VolumeMount) string { return m.Name }, tokenVolume)
		}
	}
	b, err := yaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func dropNamed[T any](items []T, name func(T) string, prefix string) []T {
	var kept []T
	for _, it := range items {
		if !strings.HasPrefix(name(it), prefix) {
			kept = append(kept, it)
		}
	}
	return kept
}

// checkRefusals creates each pod of the webhook's refusals file in its
// unit's namespace: kube-apiserver refuses it with the webhook's message.
func checkRefusals(t *testing.T, c kubernetes.Interface) {
	b, err := os.ReadFile(filepath.Join(admissionExamples, "refusals.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var refusals []struct {
		Name   string     `json:"name"`
		Unit   kube.Unit  `json:"unit"`
		Pod    corev1.Pod `json:"pod"`
		Denied string     `json:"denied"`
	}
	if err := yaml.UnmarshalStrict(b, &refusals); err != nil {
		t.Fatal(err)
	}
	for i, r := range refusals {
		want := fmt.Sprintf("admission webhook %q denied the request: %s", admission.MutatingWebhookName, r.Denied)
		r.Pod.Name = fmt.Sprintf("refused-%d", i)
		_, err := c.CoreV1().Pods(unitNamespace(r.Unit)).Create(context.Background(), &r.Pod, metav1.CreateOptions{})
		if err == nil || err.Error() != want {
			t.Errorf("%s: %v\nwant %s", r.Name, err, want)
		}
	}
}

// checkUpdateRefused: the request an admitted pod records cannot change.
func checkUpdateRefused(t *testing.T, c kubernetes.Interface) {
	ctx := context.Background()
	pods := c.CoreV1().Pods(unitNamespace(kube.UnitPercent))
	p, err := pods.Get(ctx, "resnet-half-gpu", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	was := p.Annotations[kube.AnnotationRequest]
	p.Annotations[kube.AnnotationRequest] = `{"gpuAmount":8}`
	want := fmt.Sprintf(`pods "resnet-half-gpu" is forbidden: ValidatingAdmissionPolicy 'gpupool-pod-annotations' with binding 'gpupool-pod-annotations' denied request: `+
		`metadata.annotations[gpupool.io/request]: cannot change once the pod is admitted (was "%s")`, was)
	// kube-apiserver loads a policy a moment after it is created.
	waitForUpTo(t, 30*time.Second, func() bool {
		_, err = pods.Update(ctx, p, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil
	})
	if err == nil || err.Error() != want {
		t.Errorf("updating the request: %v\nwant %s", err, want)
	}
	if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err == nil || err.Error() != want {
		t.Errorf("updating the request: %v\nwant %s", err, want)
	}
	p.Annotations[kube.AnnotationRequest] = was
	p.Labels["team"] = "vision"
	if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Errorf("updating a label: %v", err)
	}
}

// checkWarning: the articles' bitfusion.io/gpu: 2, two GPUs, under the
// percent unit is admitted as 2% of one GPU, with the webhook's warning,
// which kube-apiserver passes to the client as kubectl prints it.
func checkWarning(t *testing.T, cfg *rest.Config) {
	cfg = rest.CopyConfig(cfg)
	warnings := &warningRecorder{}
	cfg.WarningHandler = warnings
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns := unitNamespace(kube.UnitPercent)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "articles-two-gpus", Namespace: ns}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "trainer", Image: "trainer:1", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{kube.ResourceGPU: resource.MustParse("2")}}}}}}
	if _, err := c.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatal(err)
	}
	want := "spec.containers[0].resources.limits[bitfusion.io/gpu]: 2 is 2% of one GPU: this cluster counts bitfusion.io/gpu in percent (100 is one GPU); for 2 whole GPUs ask 200, or bitfusion.io/gpu-amount: 2"
	if got := warnings.all(); !slices.Contains(got, want) {
		t.Errorf("warnings %q, want %q", got, want)
	}
}

// warningRecorder keeps the warnings kube-apiserver sends a client: its
// rest.Config's WarningHandler.
type warningRecorder struct {
	mu   sync.Mutex
	seen []string
}

// HandleWarningHeader implements rest.WarningHandler.
func (w *warningRecorder) HandleWarningHeader(_ int, _, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

func (w *warningRecorder) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.seen)
}

// checkQuota: under requests.bitfusion.io/gpu: 100 in ns (in percent), two
// pods of half a GPU are admitted and kube-apiserver refuses the third with
// its own message; deleting one lets a new one in.
func checkQuota(t *testing.T, c kubernetes.Interface, ns string) {
	ctx := context.Background()
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "bf-gpu"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"requests." + kube.ResourceGPU: resource.MustParse("100")}}}
	if _, err := c.CoreV1().ResourceQuotas(ns).Create(ctx, quota, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Until kube-controller-manager has filled in the quota's status, the
	// apiserver refuses every pod that it counts.
	waitFor(t, func() bool {
		q, err := c.CoreV1().ResourceQuotas(ns).Get(ctx, quota.Name, metav1.GetOptions{})
		return err == nil && q.Status.Hard != nil
	})
	pods := c.CoreV1().Pods(ns)
	half := func(name string) *corev1.Pod { return bfkPod(name, 1, 50) }
	for _, name := range []string{"first", "second"} {
		if _, err := pods.Create(ctx, half(name), metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s pod: %v", name, err)
		}
	}
	_, err := pods.Create(ctx, half("third"), metav1.CreateOptions{})
	want := `pods "third" is forbidden: exceeded quota: bf-gpu, requested: requests.bitfusion.io/gpu=50, used: requests.bitfusion.io/gpu=100, limited: requests.bitfusion.io/gpu=100`
	if err == nil || err.Error() != want {
		t.Fatalf("third pod: %v\nwant %s", err, want)
	}
	if err := pods.Delete(ctx, "first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The quota's use falls when kube-controller-manager's quota controller
	// sees the pod go, which on a loaded machine takes more than 10 s.
	waitForUpTo(t, 30*time.Second, func() bool {
		_, err := pods.Create(ctx, half("third"), metav1.CreateOptions{})
		if err != nil && !strings.Contains(err.Error(), "exceeded quota") {
			t.Fatalf("third pod, after the first is deleted: %v", err)
		}
		return err == nil
	})
	// The recount after the delete may miss the pod created since, until
	// the next full recount (the control plane's: every 10 s).
	waitForUpTo(t, 30*time.Second, func() bool {
		q, err := c.CoreV1().ResourceQuotas(ns).Get(ctx, quota.Name, metav1.GetOptions{})
		used := q.Status.Used["requests."+kube.ResourceGPU]
		return err == nil && used.Value() == 100
	})
}

// checkWebhookDown, with ns's webhook stopped: a pod that asks for no GPU
// is admitted (the match conditions keep it from the webhook), and each
// pod that the conditions send to the webhook is refused (failurePolicy
// Fail): one asking in an init container, one carrying gpupool.io/request.
func checkWebhookDown(t *testing.T, c kubernetes.Interface, ns string) {
	ctx := context.Background()
	pod := func(name string, annotations map[string]string, limits corev1.ResourceList) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations}, Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "prepare", Image: "prepare", Resources: corev1.ResourceRequirements{Limits: limits}}},
			Containers:     []corev1.Container{{Name: "main", Image: "main"}}}}
	}
	cpu := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod("plain", nil, cpu), metav1.CreateOptions{}); err != nil {
		t.Errorf("a pod asking for no GPU, the webhook down: %v", err)
	}
	for _, p := range []*corev1.Pod{
		pod("init-gpu", nil, corev1.ResourceList{kube.ResourceGPUAmount: resource.MustParse("1")}),
		pod("forged", map[string]string{kube.AnnotationRequest: `{"gpuAmount":8}`}, cpu),
	} {
		_, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("failed calling webhook %q", admission.MutatingWebhookName)) {
			t.Errorf("pod %s, the webhook down: %v; want a failed call", p.Name, err)
		}
	}
}

// checkLargestReviews sends the webhook at addr 10 reviews at once, each of
// the largest size it takes (a pod asking for a GPU that carries megabytes
// in another tool's annotation), three times over: each is answered, and
// the webhook's peak RSS stays under the memory limit its manifest sets.
func checkLargestReviews(t *testing.T, webhook *exec.Cmd, addr string, ca []byte) {
	objs, err := kustomizeBuild(filepath.Join(deployDir, "overlays", "full"))
	if err != nil {
		t.Fatal(err)
	}
	limit := podOf(t, objs, "gpupool-webhook").Spec.Containers[0].Resources.Limits.Memory().Value()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: time.Minute}

	const maxReviewBytes = 7 << 20 // kube/admission's bound
	review := func(bulk int) []byte {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "large", Namespace: unitNamespace(kube.UnitPercent),
			Annotations: map[string]string{"other.tool/state": strings.Repeat("x", bulk)}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "main", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{kube.ResourceGPUAmount: resource.MustParse("1"), kube.ResourceGPUPercent: resource.MustParse("50")}}}}}}
		raw, err := json.Marshal(pod)
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request: &admissionv1.AdmissionRequest{UID: "large", Operation: admissionv1.Create, Namespace: pod.Namespace,
				Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
				Object: runtime.RawExtension{Raw: raw}}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	body := review(maxReviewBytes - len(review(0)))
	if len(body) != maxReviewBytes {
		t.Fatalf("a review of %d bytes, want %d", len(body), maxReviewBytes)
	}
	for range 3 {
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				resp, err := client.Post("https://"+addr+"/mutate", "application/json", bytes.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				defer resp.Body.Close()
				var out admissionv1.AdmissionReview
				if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK || out.Response == nil || !out.Response.Allowed {
					t.Errorf("a review of %d bytes: %s, %+v (%v); want allowed", len(body), resp.Status, out.Response, err)
				}
			})
		}
		wg.Wait()
	}
	usage, err := procstat.Read(webhook.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("30 reviews of %d MiB, 10 at a time: the webhook's peak RSS %d MiB, its manifest's limit %d MiB",
		len(body)>>20, usage.PeakRSS>>20, limit>>20)
	if usage.PeakRSS >= limit {
		t.Errorf("peak RSS %d MiB, over the manifest's memory limit of %d MiB", usage.PeakRSS>>20, limit>>20)
	}
}
