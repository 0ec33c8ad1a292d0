package leases

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/kube"
)

// TestWarnIdle: the pod of a lease measured idle for its whole window
// gets one Warning Event per run of idle samples, saying since when, under
// which bar and what the policy does; a lease short of its window, a
// lease with a TTL (no pod's) and a lease whose pod is gone get none; a
// new run warns again.
func TestWarnIdle(t *testing.T) {
	since := time.Date(2026, 11, 29, 13, 20, 0, 0, time.UTC)
	reclaim := since.Add(45 * time.Minute)
	idle := func(id, pod string, whole bool, from time.Time, reclaimAt time.Time) api.Lease {
		l := api.Lease{ID: id, Namespace: namespace, Server: "s1", UntilReleased: true, Owner: api.Owner{Pod: pod, UID: pod + "-uid"}}
		l.Idle = &api.LeaseIdle{Since: from, Seconds: 1800, UseBelow: 0.1, Window: api.Duration(30 * time.Minute), Whole: whole, Action: "report", ReclaimAt: reclaimAt}
		if !reclaimAt.IsZero() {
			l.Idle.Action = "reclaim"
		}
		return l
	}
	ttl := idle("lease-000004", "gpupool-run", true, since, time.Time{})
	ttl.UntilReleased = false
	var mu sync.Mutex
	leases := []api.Lease{
		idle("lease-000001", "notebook-0", true, since, reclaim),
		idle("lease-000002", "train-0", false, since, time.Time{}),
		idle("lease-000003", "serve-0", true, since, time.Time{}),
		ttl,
		idle("lease-000005", "deleted-0", true, since, time.Time{}),
		idle("lease-000006", "lab-0", true, since, reclaim),
	}
	alloc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/leases" || r.URL.Query().Get("idle") != "true" {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		_ = json.NewEncoder(w).Encode(api.LeaseList{Leases: leases})
	}))
	defer alloc.Close()
	cl, err := client.New([]string{alloc.URL}, "")
	if err != nil {
		t.Fatal(err)
	}
	k := fake.NewClientset()
	events := record.NewFakeRecorder(100)
	c, err := NewController(Config{Client: k, Allocator: cl, Recorder: events})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"notebook-0", "train-0", "serve-0", "gpupool-run", "lab-0"} {
		pod := gpuPod(name, "s1", 50)
		if name == "lab-0" { // the platform team exempted it
			pod.Annotations = map[string]string{kube.AnnotationIdleExempt: "the lab's demo"}
		}
		if _, err := k.CoreV1().Pods(namespace).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.actOnIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantOnly(t, events,
		"Warning IdleGPUs idle for 30m0s (use under 10% of its GPU share since 2026-11-29T13:20:00Z); its GPUs are reclaimed at 2026-11-29T14:05:00Z unless used",
		"Warning IdleGPUs idle for 30m0s (use under 10% of its GPU share since 2026-11-29T13:20:00Z); its namespace's idle policy reports it, and reclaims nothing",
		`Warning IdleGPUs idle for 30m0s (use under 10% of its GPU share since 2026-11-29T13:20:00Z); exempt from its namespace's idle reclaim (gpupool.io/idle-exempt on pod lab-0: "the lab's demo"): its GPUs stay`)
	// The same runs: no Event again. notebook-0 used its GPU, then went
	// idle again: a new run, a new warning.
	if err := c.actOnIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantOnly(t, events)
	mu.Lock()
	leases[0] = idle("lease-000001", "notebook-0", true, since.Add(time.Hour), reclaim.Add(time.Hour))
	mu.Unlock()
	if err := c.actOnIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantOnly(t, events, "Warning IdleGPUs idle for 30m0s (use under 10% of its GPU share since 2026-11-29T14:20:00Z); its GPUs are reclaimed at 2026-11-29T15:05:00Z unless used")
	// Its deadline passes (the allocator's clock: the run's start and
	// length): reclaimed, once; the exempt pod's passes too, and it stays.
	mu.Lock()
	leases[0].Idle.Seconds = 45 * 60
	leases[5].Idle.Seconds = 45 * 60
	mu.Unlock()
	k.ClearActions()
	for range 2 {
		if err := c.actOnIdle(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	wantOnly(t, events, "Warning IdleGPUsReclaimed evicted by its namespace's idle policy; create it again to resume")
	for _, a := range k.Actions() {
		if a.GetSubresource() == "eviction" && a.(clienttesting.CreateAction).GetObject().(*policyv1.Eviction).Name != "notebook-0" {
			t.Errorf("evicted %s", a.(clienttesting.CreateAction).GetObject().(*policyv1.Eviction).Name)
		}
	}
}

// wantOnly checks that the Events recorded since the last call are want,
// in order.
func wantOnly(t *testing.T, events *record.FakeRecorder, want ...string) {
	t.Helper()
	var got []string
	for len(events.Events) > 0 {
		got = append(got, <-events.Events)
	}
	if len(got) != len(want) {
		t.Fatalf("Events %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Event %d: %q, want %q", i, got[i], want[i])
		}
	}
}

// TestReclaimByOwner: past its deadline, an idle pod's GPUs are given back
// as its owner's controller ends pods: a bare pod evicted (its
// PodDisruptionBudget may make it wait), a Job suspended and marked, a
// Deployment (by its ReplicaSet), a StatefulSet and a ReplicaSet of its
// own scaled to zero with their replicas recorded, once; a Deployment
// under an HPA (KEDA's included) is left to it, with an Event. What a
// tenant could write to dodge the policy does not: a controller reference
// to an object that is not there, or is another of that name, or of a
// kind not scaled here, and an HPA pinned at one size: those pods are
// evicted or scaled as any other.
func TestReclaimByOwner(t *testing.T) {
	ctx := t.Context()
	ref := func(apiVersion, kind, name string) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID(name + "-uid"), Controller: ptr.To(true)}
	}
	ownedBy := func(pod *corev1.Pod, r metav1.OwnerReference) *corev1.Pod {
		pod.OwnerReferences = []metav1.OwnerReference{r}
		return pod
	}
	meta := func(name string, owners ...metav1.OwnerReference) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: namespace, UID: types.UID(name + "-uid"), ResourceVersion: "7", OwnerReferences: owners}
	}
	hpa := func(name, target string, minReplicas *int32, maxReplicas int32, owners ...metav1.OwnerReference) *autoscalingv2.HorizontalPodAutoscaler {
		return &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: meta(name, owners...), Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{Kind: "Deployment", Name: target}, MinReplicas: minReplicas, MaxReplicas: maxReplicas}}
	}
	objs := []runtime.Object{
		&batchv1.Job{ObjectMeta: meta("train")},
		&appsv1.Deployment{ObjectMeta: meta("notebook"), Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](3)}},
		&appsv1.ReplicaSet{ObjectMeta: meta("notebook-5d8f", ref("apps/v1", "Deployment", "notebook"))},
		&appsv1.StatefulSet{ObjectMeta: meta("lab"), Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2)}},
		&appsv1.ReplicaSet{ObjectMeta: meta("lone"), Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](4)}},
		&appsv1.Deployment{ObjectMeta: meta("serve"), Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2)}},
		&appsv1.ReplicaSet{ObjectMeta: meta("serve-7c9", ref("apps/v1", "Deployment", "serve"))},
		hpa("keda-hpa-serve", "serve", ptr.To[int32](1), 1, ref("keda.sh/v1alpha1", "ScaledObject", "serve")),
		&appsv1.Deployment{ObjectMeta: meta("web"), Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2)}},
		&appsv1.ReplicaSet{ObjectMeta: meta("web-6f1", ref("apps/v1", "Deployment", "web"))},
		hpa("web", "web", ptr.To[int32](1), 4),
		&appsv1.Deployment{ObjectMeta: meta("pinned"), Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1)}},
		&appsv1.ReplicaSet{ObjectMeta: meta("pinned-2b4", ref("apps/v1", "Deployment", "pinned"))},
		hpa("pinned", "pinned", nil, 1),
	}
	k := fake.NewClientset(objs...)
	pdbBlocks := true
	k.PrependReactor("create", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" || !pdbBlocks {
			return false, nil, nil
		}
		return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 10)
	})
	events := record.NewFakeRecorder(100)
	c, err := NewController(Config{Client: k, Allocator: mustClient(t), Recorder: events})
	if err != nil {
		t.Fatal(err)
	}
	bare := gpuPod("scratch", "s1", 50)
	if _, err := k.CoreV1().Pods(namespace).Create(ctx, bare, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	forged := ref("apps/v1", "ReplicaSet", "serve-7c9")
	forged.UID = "not-serve-7c9s"
	for _, tc := range []struct {
		pod  *corev1.Pod
		want string
	}{
		{bare, "Warning IdleGPUsLeftToOwner idle past its deadline; its eviction waits for its PodDisruptionBudget"},
		{ownedBy(gpuPod("train-0", "s1", 50), ref("batch/v1", "Job", "train")), "Warning IdleGPUsReclaimed Job train suspended by its namespace's idle policy; to resume: gpupool resume job/train -n team-a"},
		{ownedBy(gpuPod("notebook-0", "s1", 50), ref("apps/v1", "ReplicaSet", "notebook-5d8f")), "Warning IdleGPUsReclaimed Deployment notebook scaled from 3 to 0 replicas by its namespace's idle policy (gpupool.io/idle-replicas records it); to resume: gpupool resume deployment/notebook -n team-a"},
		{ownedBy(gpuPod("lab-0", "s1", 50), ref("apps/v1", "StatefulSet", "lab")), "Warning IdleGPUsReclaimed StatefulSet lab scaled from 2 to 0 replicas"},
		{ownedBy(gpuPod("lone-0", "s1", 50), ref("apps/v1", "ReplicaSet", "lone")), "Warning IdleGPUsReclaimed ReplicaSet lone scaled from 4 to 0 replicas"},
		{ownedBy(gpuPod("serve-0", "s1", 50), ref("apps/v1", "ReplicaSet", "serve-7c9")), "Normal IdleGPUsLeftToOwner idle past its deadline; Deployment serve is scaled by HorizontalPodAutoscaler keda-hpa-serve, which decides: nothing reclaimed"},
		{ownedBy(gpuPod("web-0", "s1", 50), ref("apps/v1", "ReplicaSet", "web-6f1")), "Normal IdleGPUsLeftToOwner idle past its deadline; Deployment web is scaled by HorizontalPodAutoscaler web"},
		{ownedBy(gpuPod("pinned-0", "s1", 50), ref("apps/v1", "ReplicaSet", "pinned-2b4")), "Warning IdleGPUsReclaimed Deployment pinned scaled from 1 to 0 replicas"},
		{ownedBy(gpuPod("worker-0", "s1", 50), ref("kubeflow.org/v1", "TFJob", "mnist")), "Warning IdleGPUsReclaimed evicted by its namespace's idle policy (its controller, TFJob mnist, is of a kind the idle policy does not scale: its pod is evicted, as a node drain does)"},
		{ownedBy(gpuPod("ghost-0", "s1", 50), ref("batch/v1", "Job", "ghost")), "Warning IdleGPUsReclaimed evicted by its namespace's idle policy (its controller reference names Job ghost, which does not exist: its pod is evicted)"},
		{ownedBy(gpuPod("forged-0", "s1", 50), forged), "Warning IdleGPUsReclaimed evicted by its namespace's idle policy (its controller reference names ReplicaSet serve-7c9 with UID not-serve-7c9s, not the one of that name: its pod is evicted)"},
	} {
		if tc.pod != bare {
			pdbBlocks = false
			if _, err := k.CoreV1().Pods(namespace).Create(ctx, tc.pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		w, err := c.workloadOf(ctx, tc.pod)
		if err != nil {
			t.Fatalf("%s: %v", tc.pod.Name, err)
		}
		done, err := c.reclaim(ctx, tc.pod, w)
		if err != nil || done != (tc.pod != bare) {
			t.Fatalf("%s: done %v, %v; want done but for the eviction its budget refuses", tc.pod.Name, done, err)
		}
		var got []string
		for len(events.Events) > 0 {
			got = append(got, <-events.Events)
		}
		if len(got) != 1 || !strings.HasPrefix(got[0], tc.want) {
			t.Errorf("%s: Events %q, want %q", tc.pod.Name, got, tc.want)
		}
	}
	// A second pod of the Deployment at zero: nothing more.
	w, err := c.workloadOf(ctx, ownedBy(gpuPod("notebook-1", "s1", 50), ref("apps/v1", "ReplicaSet", "notebook-5d8f")))
	if err != nil {
		t.Fatal(err)
	}
	if done, err := c.reclaim(ctx, gpuPod("notebook-1", "s1", 50), w); !done || err != nil {
		t.Fatalf("notebook-1: done %v, %v", done, err)
	}
	wantOnly(t, events)

	job, _ := k.BatchV1().Jobs(namespace).Get(ctx, "train", metav1.GetOptions{})
	replicas := func(get func() (*int32, map[string]string)) (int32, string) {
		r, a := get()
		return ptr.Deref(r, -1), a[kube.AnnotationIdleReplicas]
	}
	apps := k.AppsV1()
	for _, tc := range []struct {
		name     string
		get      func() (*int32, map[string]string)
		replicas int32
		recorded string
	}{
		{"Deployment notebook", func() (*int32, map[string]string) {
			d, _ := apps.Deployments(namespace).Get(ctx, "notebook", metav1.GetOptions{})
			return d.Spec.Replicas, d.Annotations
		}, 0, "3"},
		{"StatefulSet lab", func() (*int32, map[string]string) {
			s, _ := apps.StatefulSets(namespace).Get(ctx, "lab", metav1.GetOptions{})
			return s.Spec.Replicas, s.Annotations
		}, 0, "2"},
		{"ReplicaSet lone", func() (*int32, map[string]string) {
			r, _ := apps.ReplicaSets(namespace).Get(ctx, "lone", metav1.GetOptions{})
			return r.Spec.Replicas, r.Annotations
		}, 0, "4"},
		{"Deployment pinned", func() (*int32, map[string]string) {
			d, _ := apps.Deployments(namespace).Get(ctx, "pinned", metav1.GetOptions{})
			return d.Spec.Replicas, d.Annotations
		}, 0, "1"},
		{"Deployment serve (KEDA's)", func() (*int32, map[string]string) {
			d, _ := apps.Deployments(namespace).Get(ctx, "serve", metav1.GetOptions{})
			return d.Spec.Replicas, d.Annotations
		}, 2, ""},
		{"Deployment web (an HPA's)", func() (*int32, map[string]string) {
			d, _ := apps.Deployments(namespace).Get(ctx, "web", metav1.GetOptions{})
			return d.Spec.Replicas, d.Annotations
		}, 2, ""},
	} {
		if r, rec := replicas(tc.get); r != tc.replicas || rec != tc.recorded {
			t.Errorf("%s: %d replicas, %q recorded; want %d and %q", tc.name, r, rec, tc.replicas, tc.recorded)
		}
	}
	if !ptr.Deref(job.Spec.Suspend, false) || job.Annotations[kube.AnnotationIdleSuspended] == "" {
		t.Errorf("the Job: suspend %v, annotations %v; want suspended and marked", job.Spec.Suspend, job.Annotations)
	}

	// The budget allows it now: the bare pod is evicted, its UID checked.
	pdbBlocks = false
	k.ClearActions()
	if done, err := c.reclaim(ctx, bare, workload{}); !done || err != nil {
		t.Fatalf("the eviction the budget allows: done %v, %v", done, err)
	}
	var evicted bool
	for _, a := range k.Actions() {
		if create, ok := a.(clienttesting.CreateAction); ok && a.GetSubresource() == "eviction" {
			e := create.GetObject().(*policyv1.Eviction)
			evicted = e.Name == bare.Name && *e.DeleteOptions.Preconditions.UID == bare.UID
		}
	}
	if !evicted {
		t.Errorf("no eviction of %s with its UID: %v", bare.Name, k.Actions())
	}
	wantOnly(t, events, "Warning IdleGPUsReclaimed evicted by its namespace's idle policy; create it again to resume")
}

// TestExemption: the platform team's annotation on the pod or on its
// workload exempts it, and the Event says where.
func TestExemption(t *testing.T) {
	pod := gpuPod("lab-0", "s1", 50)
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "lab", Annotations: map[string]string{kube.AnnotationIdleExempt: "demo day"}}}
	for _, tc := range []struct {
		pod  map[string]string
		w    workload
		want string
	}{
		{nil, workload{}, ""},
		{nil, workload{kind: "Deployment", name: "lab", meta: &appsv1.Deployment{}}, ""},
		{map[string]string{kube.AnnotationIdleExempt: ""}, workload{}, `gpupool.io/idle-exempt on pod lab-0: ""`},
		{nil, workload{kind: "Deployment", name: "lab", meta: d}, `gpupool.io/idle-exempt on Deployment lab: "demo day"`},
	} {
		pod.Annotations = tc.pod
		if got := tc.w.exemption(pod); got != tc.want {
			t.Errorf("pod %v, workload %s %s: %q, want %q", tc.pod, tc.w.kind, tc.w.name, got, tc.want)
		}
	}
}

func mustClient(t *testing.T) *client.Client {
	t.Helper()
	cl, err := client.New([]string{"http://127.0.0.1:1"}, "")
	if err != nil {
		t.Fatal(err)
	}
	return cl
}
