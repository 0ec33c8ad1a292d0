package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/admission"
)

// TestSchedulerPresetNodeNameRefused: a GPU pod created with spec.nodeName
// set would skip kube-scheduler, and so the pool, and the lease controller
// would then take its lease on that node over the pool's policy.
// kube-apiserver refuses it with the webhook's reason, naming the field
// and the node, and no lease is taken; the same pod without the node is
// placed there by the pool.
func TestSchedulerPresetNodeNameRefused(t *testing.T) {
	gpupoolKubeScheduler(t) // built (a minute or more) before the test's clock starts
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	pool := startKubePool(t, ctx, kubePoolOptions{Namespaces: []string{"training"}})
	pool.addNodes(t, ctx, 1, nil, "gpu-0")
	pods := pool.CP.Client.CoreV1().Pods("training")

	preset := bfkPod("preset", 1, 50)
	preset.Spec.NodeName = "gpu-0"
	want := fmt.Sprintf(`admission webhook %q denied the request: spec.nodeName: Invalid value: "gpu-0": `+
		`the pool places GPU pods, on the server that holds their lease: leave spec.nodeName empty (a nodeSelector or node affinity narrows where)`,
		admission.MutatingWebhookName)
	if _, err := pods.Create(ctx, preset, metav1.CreateOptions{}); err == nil || err.Error() != want {
		t.Fatalf("creating a GPU pod with spec.nodeName set: %v\nwant %s", err, want)
	}

	placed, err := pods.Create(ctx, bfkPod("placed", 1, 50), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bound := pool.waitBound(t, ctx, placed)
	leases, err := pool.Admin.Leases(ctx, client.LeaseFilter{Namespace: "training"})
	if err != nil {
		t.Fatal(err)
	}
	if len(leases) != 1 || leases[0].Owner.UID != string(bound.UID) || bound.Annotations[kube.AnnotationLease] != leases[0].ID {
		t.Errorf("leases %+v: want the placed pod's alone, named on it (%s)", leases, bound.Annotations[kube.AnnotationLease])
	}
}

// TestSchedulerKilledBeforeBind: a reserved pod waiting in PreBind (a
// volume provisioned late: here never) keeps its lease past the plugin's
// wait for a bind; kube-scheduler, killed with SIGKILL before the bind,
// leaves that lease to no process's memory, and gpupool-scheduler's
// periodic resync releases it by its grant time, the pod still unbound.
func TestSchedulerKilledBeforeBind(t *testing.T) {
	gpupoolKubeScheduler(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	// The plugin's wait for a bind is gpupool-scheduler's
	// --unbound-lease-timeout in this harness.
	const pluginWait, resyncWait = 3 * time.Second, 30 * time.Second
	pool := startKubePool(t, ctx, kubePoolOptions{Namespaces: []string{"training"}, SchedulerArgs: []string{
		"--unbound-lease-timeout", pluginWait.String(), "--resync", "2s", "--resync-unbound-lease-timeout", resyncWait.String()}})
	pool.addNodes(t, ctx, 1, nil, "gpu-0")
	c := pool.CP.Client

	// A claim bound once its pod's node is chosen, by a provisioner that
	// never comes: kube-scheduler's VolumeBinding PreBind names the node
	// on the claim and waits for the volume, up to its 10 minutes.
	late := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "late"}, Provisioner: "example.com/never",
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)}
	if _, err := c.StorageV1().StorageClasses().Create(ctx, late, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "training"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr.To(late.Name), AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if _, err := c.CoreV1().PersistentVolumeClaims("training").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := bfkPod("trainer", 1, 50)
	pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim.Name}}}}
	pod, err := c.CoreV1().Pods("training").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitForUpTo(t, time.Minute, func() bool {
		cl, err := c.CoreV1().PersistentVolumeClaims("training").Get(ctx, claim.Name, metav1.GetOptions{})
		return err == nil && cl.Annotations["volume.kubernetes.io/selected-node"] == "gpu-0"
	})
	held := pool.leasesOf(t, ctx, pod)
	if len(held) != 1 || held[0].Server != "gpu-0" {
		t.Fatalf("leases %+v of the pod in PreBind: want one on gpu-0", held)
	}
	granted := held[0]

	time.Sleep(2 * pluginWait)
	if held := pool.leasesOf(t, ctx, pod); len(held) != 1 || held[0].ID != granted.ID {
		t.Fatalf("leases %+v after %v in PreBind: want %s kept, past the plugin's wait for a bind", held, 2*pluginWait, granted.ID)
	}

	pool.killKubeScheduler()
	killed := time.Now()
	waitForUpTo(t, resyncWait+time.Minute, func() bool { return len(pool.leasesOf(t, ctx, pod)) == 0 })
	released := time.Now()
	if age := released.Sub(granted.GrantedAt); age < resyncWait {
		t.Errorf("the lease was released %v after its grant, before --resync-unbound-lease-timeout %v", age, resyncWait)
	}
	unbound, err := c.CoreV1().Pods("training").Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if unbound.Spec.NodeName != "" {
		t.Errorf("the pod is bound to %s with kube-scheduler killed", unbound.Spec.NodeName)
	}
	t.Logf("kube-scheduler killed in PreBind; the pod's lease released %v after, %v after its grant",
		released.Sub(killed).Round(time.Second), released.Sub(granted.GrantedAt).Round(time.Second))
}
