package e2e

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/testcert"
	"github.com/gpupool/gpupool/test/e2e/kube"
)

// The KEDA tests need KEDA built beside the control plane
// (test/e2e/kube/build.sh keda; make e2e does, KUBE_EXTRAS=keda).

// kedaIdlePolicy is namespace ml's idle policy under KEDA: a lease is idle
// after a minute (the shortest window, six samples) under 10% of its share,
// reported, not reclaimed: KEDA gives the GPUs back by scaling to zero.
const kedaIdlePolicy = "{useBelow: 0.1, window: 1m}"

// kedaCooldown is the ScaledObject's cooldownPeriod in seconds: how long
// KEDA waits, the workload inactive, before scaling it to zero.
const kedaCooldown = 5

// startKEDA runs gpupool-adapter with its KEDA external scaler (mutual
// TLS: a client certificate signed by --keda-client-ca), then KEDA as the
// owner of external metrics (no gpupool APIService), and creates what
// deploy/examples/tf-training-keda has a platform team create: the
// ClusterTriggerAuthentication gpupool-adapter and its Secret in KEDA's
// namespace.
func (r *hpaRig) startKEDA(t testing.TB, promURL string) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	kedaCA := testcert.NewCA(t, "KEDA client CA")
	r.scaler, r.promURL = "127.0.0.1:"+freePort(t), promURL
	_, r.adapter = startClusterAdapter(t, r.cp, r.logs, r.allocURL, r.config.adminTokenFile(t), "", 0,
		"--keda-scaler-listen", r.scaler, "--keda-client-ca", kedaCA.WriteFile(t, dir))
	if err := r.cp.StartKEDA(ctx); err != nil {
		t.Fatal(err)
	}
	r.kedaCert = kedaCA.Issue(t, "keda-operator", x509.ExtKeyUsageClientAuth)
	certFile, keyFile := testcert.WritePair(t, dir, r.kedaCert)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gpupool-keda-client", Namespace: kube.KEDANamespace},
		Data: map[string][]byte{"ca.crt": r.cp.CA, "tls.crt": readFile(t, certFile), "tls.key": readFile(t, keyFile)}}
	if _, err := r.cp.Client.CoreV1().Secrets(kube.KEDANamespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	param := func(parameter, key string) any {
		return map[string]any{"parameter": parameter, "name": secret.Name, "key": key}
	}
	auth := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "keda.sh/v1alpha1", "kind": "ClusterTriggerAuthentication",
		"metadata": map[string]any{"name": "gpupool-adapter"},
		"spec": map[string]any{"secretTargetRef": []any{
			param("caCert", "ca.crt"), param("tlsClientCert", "tls.crt"), param("tlsClientKey", "tls.key"),
		}},
	}}
	if _, err := r.dynamic(t).Resource(kube.ClusterTriggerAuthentications).Create(ctx, auth, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (r *hpaRig) dynamic(t testing.TB) dynamic.Interface {
	t.Helper()
	d, err := dynamic.NewForConfig(r.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// createScaledObject creates tf-training's ScaledObject with trigger as
// deploy/examples/tf-training-keda writes it, from zero to six replicas,
// polled every polling (KEDA's default when 0); its HPA reacts as
// tfTrainingHPA does, at once both ways, so that the tests need not wait
// out stabilization.
func (r *hpaRig) createScaledObject(t testing.TB, trigger string, polling time.Duration) {
	t.Helper()
	behavior, err := runtime.DefaultUnstructuredConverter.ToUnstructured(tfTrainingHPA().Spec.Behavior)
	if err != nil {
		t.Fatal(err)
	}
	spec := map[string]any{
		"scaleTargetRef":  map[string]any{"apiVersion": "apps/v1", "kind": "Deployment", "name": hpaApp},
		"minReplicaCount": int64(0),
		"maxReplicaCount": int64(6),
		"cooldownPeriod":  int64(kedaCooldown),
		"advanced":        map[string]any{"horizontalPodAutoscalerConfig": map[string]any{"behavior": behavior}},
		"triggers":        []any{r.kedaTrigger(t, trigger)},
	}
	if polling > 0 {
		spec["pollingInterval"] = int64(polling / time.Second)
	}
	so := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
		"metadata": map[string]any{"name": hpaApp, "namespace": hpaNamespace},
		"spec":     spec,
	}}
	if _, err := r.dynamic(t).Resource(kube.ScaledObjects).Namespace(hpaNamespace).Create(context.Background(), so, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// kedaTrigger is tf-training's trigger of type typ on
// bitfusion_gpu_utilization, at the HPA's target: gpupool's external
// scaler (external or external-push), or KEDA's prometheus trigger on the
// PromQL the adapter's Prometheus backend runs for it (adapter/prometheus.yaml),
// what docs/adapter.md offered a cluster with KEDA before the scaler,
// active above 10% as ml's idle policy counts use.
func (r *hpaRig) kedaTrigger(t testing.TB, typ string) map[string]any {
	t.Helper()
	switch typ {
	case "prometheus":
		leases := fmt.Sprintf(`{namespace=%q,label_app=%q}`, hpaNamespace, hpaApp)
		return map[string]any{
			"type": typ, "metricType": string(autoscalingv2.ValueMetricType),
			"metadata": map[string]any{"serverAddress": r.promURL,
				"query":     "sum(lease:bitfusion_lease_busy_gpus" + leases + ") / sum(lease:bitfusion_lease_held_gpus" + leases + ")",
				"threshold": kedaTarget(), "activationThreshold": "0.1"},
		}
	case "external", "external-push":
		return map[string]any{
			"type": typ, "metricType": string(autoscalingv2.ValueMetricType),
			"metadata": map[string]any{"scalerAddress": r.scaler, "metric": "bitfusion_gpu_utilization",
				"selector": "app=" + hpaApp, "target": kedaTarget()},
			"authenticationRef": map[string]any{"kind": "ClusterTriggerAuthentication", "name": "gpupool-adapter"},
		}
	}
	t.Fatalf("no KEDA trigger %q", typ)
	return nil
}

// kedaTarget is the HPA's target, hpaTarget, as a trigger's metadata
// writes it.
func kedaTarget() string {
	q := resource.MustParse(hpaTarget)
	return strconv.FormatFloat(q.AsApproximateFloat64(), 'g', -1, 64)
}

// waitDeployment waits until tf-training's Deployment asks n replicas and
// has n Ready, and returns how long until it asked them.
func (r *hpaRig) waitDeployment(t testing.TB, n int32, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var asked time.Duration
	for deadline := start.Add(within); ; time.Sleep(100 * time.Millisecond) {
		dep, err := r.cp.Client.AppsV1().Deployments(hpaNamespace).Get(context.Background(), hpaApp, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if asked == 0 && dep.Spec.Replicas != nil && *dep.Spec.Replicas == n {
			asked = time.Since(start)
		}
		if asked > 0 && dep.Status.ReadyReplicas == n && dep.Status.Replicas == n {
			return asked
		}
		if time.Now().After(deadline) {
			so, _ := r.dynamic(t).Resource(kube.ScaledObjects).Namespace(hpaNamespace).Get(context.Background(), hpaApp, metav1.GetOptions{})
			var conditions any
			if so != nil {
				conditions, _, _ = unstructured.NestedSlice(so.Object, "status", "conditions")
			}
			t.Fatalf("after %v tf-training asks %d replicas, %d ready; want %d. ScaledObject conditions: %v",
				within, *dep.Spec.Replicas, dep.Status.ReadyReplicas, n, conditions)
		}
	}
}

// replicaLeases are the leases of tf-training's pods, whose owners
// followReplicas names by pod.
func (r *hpaRig) replicaLeases(t testing.TB) []api.Lease {
	t.Helper()
	all, err := r.client.Leases(context.Background(), client.LeaseFilter{Namespace: hpaNamespace, Selector: "app=" + hpaApp})
	if err != nil {
		t.Fatal(err)
	}
	var ls []api.Lease
	for _, l := range all {
		if strings.HasPrefix(l.Owner.Pod, hpaApp+"-") {
			ls = append(ls, l)
		}
	}
	return ls
}

// TestKEDAScalesToZeroAndBack: the real KEDA, on gpupool's external
// scaler (external-push, over mutual TLS, with no gpupool APIService),
// scales tf-training from zero to one when a notebook of its team uses a
// GPU under its label (demand, which the stream pushes), from one to five
// when its work rises, and back to zero once its leases have been idle
// for namespace ml's window; its pods' leases are granted and released
// through the pool as any others.
func TestKEDAScalesToZeroAndBack(t *testing.T) {
	r := startHPARig(t, rigOptions{syncPeriod: 2 * time.Second, backend: "direct", keda: "external-push", kedaPolling: 2 * time.Second})
	ctx := context.Background()

	// No lease, no request: inactive, so KEDA leaves it at zero.
	r.checkBadTriggerNamed(t)
	r.waitDeployment(t, 0, 10*time.Second)

	// Demand: a notebook labelled app=tf-training runs `gpupool run`, and
	// uses its GPU (the workload file's work is shared among the selected
	// leases).
	demanded := time.Now()
	notebook, err := r.client.Acquire(ctx, api.AcquireRequest{Namespace: hpaNamespace, GPUAmount: 1, GPUPercent: replicaPercent, TTL: "1h",
		Owner: api.Owner{Pod: "notebook", UID: "notebook-uid", Labels: map[string]string{"app": hpaApp}}})
	if err != nil {
		t.Fatal(err)
	}
	asked := r.waitDeployment(t, 1, 60*time.Second)
	waitForUpTo(t, 30*time.Second, func() bool { return len(r.replicaLeases(t)) == 1 })
	t.Logf("demand -> 1 replica asked %v, its GPU granted %v after the notebook's lease", asked.Round(100*time.Millisecond),
		time.Since(demanded).Round(100*time.Millisecond))
	if err := r.client.Release(ctx, notebook.ID); err != nil {
		t.Fatal(err)
	}

	const high = 1.5
	r.setLoad(t, high)
	want := int32(expectedReplicas(high))
	asked = r.waitDeployment(t, want, 2*time.Minute)
	waitForUpTo(t, 30*time.Second, func() bool { return len(r.replicaLeases(t)) == int(want) })
	t.Logf("load %g GPUs: KEDA's HPA asked %d replicas %v after the step; each holds a lease", high, want, asked.Round(100*time.Millisecond))

	// Idle: no work. KEDA's HPA brings it to one replica, and once that
	// one's lease has been idle for ml's minute, the scaler turns
	// inactive, the stream says so, and KEDA scales to zero after its
	// cooldown; the pod's lease is released, its GPU the pool's again.
	r.setLoad(t, 0)
	idle := time.Now()
	r.waitDeployment(t, 0, 3*time.Minute)
	t.Logf("idle -> zero replicas %v after the work stopped (ml's window 1m, KEDA's cooldown %ds)", time.Since(idle).Round(time.Second), kedaCooldown)
	waitForUpTo(t, 30*time.Second, func() bool { return len(r.replicaLeases(t)) == 0 })

	// And back: demand again wakes it.
	notebook, err = r.client.Acquire(ctx, api.AcquireRequest{Namespace: hpaNamespace, GPUAmount: 1, GPUPercent: replicaPercent, TTL: "1h",
		Owner: api.Owner{Pod: "notebook", UID: "notebook-uid-2", Labels: map[string]string{"app": hpaApp}}})
	if err != nil {
		t.Fatal(err)
	}
	r.setLoad(t, 0.25)
	asked = r.waitDeployment(t, 1, 60*time.Second)
	t.Logf("demand again -> 1 replica asked %v after", asked.Round(100*time.Millisecond))
}

// checkBadTriggerNamed: a ScaledObject whose trigger names a metric the
// scaler does not serve, or that has no authenticationRef (KEDA then dials
// in cleartext), is not scaled, and the scaler's error saying what to
// change reaches KEDA's log, where its Event (ScaledObjectCheckFailed, "no
// metric specs returned") sends the reader.
func (r *hpaRig) checkBadTriggerNamed(t *testing.T) {
	t.Helper()
	for _, tc := range []struct {
		name   string
		change func(trigger map[string]any)
		want   string
	}{
		{"typo", func(trigger map[string]any) {
			trigger["metadata"].(map[string]any)["metric"] = "bitfusion_gpu_utilisation"
		},
			`code = InvalidArgument desc = scalerMetadata.metric \"bitfusion_gpu_utilisation\" is not one of bitfusion_gpu_utilization`},
		{"noauth", func(trigger map[string]any) { delete(trigger, "authenticationRef") },
			`code = Unauthenticated desc = cleartext: the scaler takes TLS only; the trigger's authenticationRef must give caCert`},
	} {
		trigger := r.kedaTrigger(t, "external-push")
		tc.change(trigger)
		r.checkKEDALogs(t, tc.name, trigger, tc.want)
	}
}

// checkKEDALogs creates a ScaledObject named name of trigger, on a
// Deployment of its own, waits until KEDA's log has an error of it
// containing want, and deletes it.
func (r *hpaRig) checkKEDALogs(t *testing.T, name string, trigger map[string]any, want string) {
	t.Helper()
	ctx := context.Background()
	dep := deployment(name, 0, corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: name + ":fake"}}})
	if _, err := r.cp.Client.AppsV1().Deployments(hpaNamespace).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	so := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
		"metadata": map[string]any{"name": name, "namespace": hpaNamespace},
		"spec": map[string]any{
			"scaleTargetRef":  map[string]any{"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
			"minReplicaCount": int64(0), "pollingInterval": int64(2),
			"triggers": []any{trigger},
		},
	}}
	scaledObjects := r.dynamic(t).Resource(kube.ScaledObjects).Namespace(hpaNamespace)
	if _, err := scaledObjects.Create(ctx, so, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ofIt := fmt.Sprintf(`"name":%q`, name)
	var logged string
	defer func() {
		if logged != "" {
			return
		}
		log, _ := r.cp.Log("keda-operator")
		for line := range strings.Lines(string(log)) {
			if strings.Contains(line, ofIt) && strings.Contains(line, `"level":"error"`) {
				t.Log(line)
			}
		}
	}()
	waitForUpTo(t, time.Minute, func() bool {
		log, err := r.cp.Log("keda-operator")
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(log)) {
			if strings.Contains(line, ofIt) && strings.Contains(line, want) {
				logged = line
				return true
			}
		}
		return false
	})
	var entry struct{ Error string }
	_ = json.Unmarshal([]byte(logged), &entry)
	t.Logf("ScaledObject %s, in KEDA's log: %s", name, entry.Error)
	if err := scaledObjects.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}
