package e2e

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/leases"
)

// TestIdleReclaim: under namespace ml's idle policy (under 10% of the
// share for 1 minute, then 10 s of grace, reclaim), on kwok nodes whose
// daemon's use the test feeds every 5 s as gpupool-server does: a notebook
// (a bare pod) measured idle is evicted, and its twin the platform team
// exempted is not; a Job idle is suspended, and its GPUs come back when
// gpupool resume resumes it; a bursty Job and a bursty Deployment, busy
// 20 s of every 40 s, are never reclaimed. Each reclaimed pod gets the Warning
// Events IdleGPUs, then IdleGPUsReclaimed.
func TestIdleReclaim(t *testing.T) {
	gpupoolKubeScheduler(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	pool := startKubePool(t, ctx, kubePoolOptions{Namespaces: []string{"ml"},
		IdlePolicies: map[string]string{"ml": "{useBelow: 0.1, window: 1m, grace: 10s, action: reclaim}"}})
	pool.addNodes(t, ctx, idleTestGPUs, nil, "gpu-0")
	c := pool.CP.Client

	withLabel := func(pod *corev1.Pod, app string) *corev1.Pod {
		pod.Labels = map[string]string{"app": app}
		return pod
	}
	notebook, err := c.CoreV1().Pods("ml").Create(ctx, withLabel(bfkPod("notebook", 1, 0), "notebook"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The same, which the platform team exempted.
	lab := withLabel(bfkPod("lab", 1, 0), "lab")
	lab.Annotations = map[string]string{kube.AnnotationIdleExempt: "the lab's demo"}
	if lab, err = c.CoreV1().Pods("ml").Create(ctx, lab, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	template := func(app string, restart corev1.RestartPolicy) corev1.PodTemplateSpec {
		pod := withLabel(bfkPod("", 1, 0), app)
		pod.Spec.RestartPolicy = restart
		return corev1.PodTemplateSpec{ObjectMeta: pod.ObjectMeta, Spec: pod.Spec}
	}
	// A training Job runs until suspended: kwok completes Job pods at once
	// but those labelled runsUntilDeleted.
	train := template("train", corev1.RestartPolicyNever)
	train.Labels["runsUntilDeleted"] = "true"
	bursty := template("bursty-job", corev1.RestartPolicyNever)
	bursty.Labels["runsUntilDeleted"] = "true"
	for name, pod := range map[string]corev1.PodTemplateSpec{"train": train, "bursty-job": bursty} {
		job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: batchv1.JobSpec{Template: pod}}
		if _, err := c.BatchV1().Jobs("ml").Create(ctx, job, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	deployment := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "bursty"}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1),
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "bursty"}}, Template: template("bursty", corev1.RestartPolicyAlways)}}
	if _, err := c.AppsV1().Deployments("ml").Create(ctx, deployment, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, app := range []string{"notebook", "lab", "train", "bursty-job", "bursty"} {
		waitForUpTo(t, time.Minute, func() bool { return len(appPods(t, ctx, pool, app)) == 1 })
	}
	before := appPods(t, ctx, pool, "train")

	// What gpupool-server would report: the leases' SM use, by app.
	started := time.Now()
	feeding, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	wg.Go(func() { feedUse(feeding, t, pool, started) })

	// The notebook: evicted, its lease released.
	waitForUpTo(t, 3*time.Minute, func() bool {
		_, err := c.CoreV1().Pods("ml").Get(ctx, "notebook", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	t.Logf("notebook evicted %v after its use was first reported", time.Since(started).Round(time.Second))
	waitFor(t, func() bool { return len(pool.leasesOf(t, ctx, notebook)) == 0 })
	wantIdleEvents(t, ctx, pool, notebook.UID)

	// The Job: suspended, its pod gone, then resumed: its new pod placed
	// and leased again.
	waitForUpTo(t, time.Minute, func() bool {
		j, err := c.BatchV1().Jobs("ml").Get(ctx, "train", metav1.GetOptions{})
		return err == nil && ptr.Deref(j.Spec.Suspend, false)
	})
	t.Logf("Job suspended %v after its use was first reported", time.Since(started).Round(time.Second))
	waitForUpTo(t, time.Minute, func() bool { return len(appPods(t, ctx, pool, "train")) == 0 })
	resumed := time.Now()
	if out, code := gpupool(t, []string{"KUBECONFIG=" + pool.CP.Kubeconfig}, "resume", "job/train", "-n", "ml"); code != 0 {
		t.Fatalf("gpupool resume job/train -n ml: exit %d, %s", code, out)
	}
	waitForUpTo(t, time.Minute, func() bool {
		pods := appPods(t, ctx, pool, "train")
		return len(pods) == 1 && pods[0].UID != before[0].UID && len(pool.leasesOf(t, ctx, &pods[0])) == 1
	})
	t.Logf("the resumed Job's new pod held its GPU %v after the resume", time.Since(resumed).Round(time.Millisecond))

	// The exempt notebook, idle as long as the other: warned, never
	// reclaimed, its lease held.
	if got, err := c.CoreV1().Pods("ml").Get(ctx, "lab", metav1.GetOptions{}); err != nil || got.DeletionTimestamp != nil || len(pool.leasesOf(t, ctx, lab)) != 1 {
		t.Errorf("the exempt notebook was reclaimed: %v", err)
	}

	// The bursty Job and Deployment: never reclaimed, each one's pod leased.
	j, err := c.BatchV1().Jobs("ml").Get(ctx, "bursty-job", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pods := appPods(t, ctx, pool, "bursty-job"); ptr.Deref(j.Spec.Suspend, false) || len(pods) != 1 || len(pool.leasesOf(t, ctx, &pods[0])) != 1 {
		t.Errorf("the bursty Job was reclaimed: suspended %v, %d pods bound", ptr.Deref(j.Spec.Suspend, false), len(pods))
	}
	d, err := c.AppsV1().Deployments("ml").Get(ctx, "bursty", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pods := appPods(t, ctx, pool, "bursty"); ptr.Deref(d.Spec.Replicas, 0) != 1 || len(pods) != 1 || len(pool.leasesOf(t, ctx, &pods[0])) != 1 {
		t.Errorf("the bursty Deployment was reclaimed: %d replicas, %d pods bound", ptr.Deref(d.Spec.Replicas, 0), len(pods))
	}
}

// appPods are ml's pods of app bound to a node and not terminating.
func appPods(t *testing.T, ctx context.Context, pool *kubePool, app string) []corev1.Pod {
	t.Helper()
	list, err := pool.CP.Client.CoreV1().Pods("ml").List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// idleTestGPUs: gpu-0's, enough for the test's five pods and the resumed
// Job's new one while its old one ends.
const idleTestGPUs = 8

// feedUse heart-beats gpu-0 every 5 s with its leases' SM use, as its
// daemon would: none for the notebooks and the Job, all of a GPU for the
// bursty Job and Deployment 20 s of every 40 s.
func feedUse(ctx context.Context, t *testing.T, pool *kubePool, started time.Time) {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for ; ctx.Err() == nil; <-tick.C {
		ls, err := pool.Admin.Leases(ctx, client.LeaseFilter{Server: "gpu-0"})
		if err != nil {
			continue
		}
		use := &api.ServerUse{SampledAt: time.Now()}
		hb := api.Heartbeat{Use: use}
		for i := range idleTestGPUs {
			hb.GPUs = append(hb.GPUs, api.GPUHealth{Index: i, Healthy: true})
			use.GPUs = append(use.GPUs, api.GPUUse{Index: i, Utilization: ptr.To(0.0)})
		}
		busy := int(time.Since(started)/(20*time.Second))%2 == 0
		for _, l := range ls {
			sm := 0.0
			if app := l.Owner.Labels["app"]; (app == "bursty" || app == "bursty-job") && busy {
				sm = 1
			}
			for _, g := range l.GPUs {
				use.Leases = append(use.Leases, api.LeaseUse{Lease: l.ID, GPU: g.Index, SMUtilization: ptr.To(sm)})
			}
		}
		if err := pool.Servers.Heartbeat(ctx, "gpu-0", hb); err != nil && ctx.Err() == nil {
			t.Errorf("heartbeat: %v", err)
		}
	}
}

// wantIdleEvents checks the pod's Warning Events: IdleGPUs, then
// IdleGPUsReclaimed.
func wantIdleEvents(t *testing.T, ctx context.Context, pool *kubePool, uid types.UID) {
	t.Helper()
	var reasons []string
	waitFor(t, func() bool {
		list, err := pool.CP.Client.CoreV1().Events("ml").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(uid)})
		if err != nil {
			return false
		}
		reasons = reasons[:0]
		for _, e := range list.Items {
			reasons = append(reasons, e.Reason)
		}
		joined := strings.Join(reasons, ",")
		return strings.Contains(joined, leases.EventIdle) && strings.Contains(joined, leases.EventIdleReclaimed)
	})
}
