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
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

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
	for _, name := range []string{"notebook-0", "train-0", "serve-0", "gpupool-run"} {
		if _, err := k.CoreV1().Pods(namespace).Create(t.Context(), gpuPod(name, "s1", 50), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.actOnIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantOnly(t, events,
		"Warning IdleGPUs idle for 30m0s (use under 10% of its GPU share since 2026-11-29T13:20:00Z); its GPUs are reclaimed at 2026-11-29T14:05:00Z unless used",
		"Warning IdleGPUs idle for 30m0s (use under 10% of its GPU share since 2026-11-29T13:20:00Z); its namespace's idle policy reports it, and reclaims nothing")
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
	// length): reclaimed, once.
	mu.Lock()
	leases[0].Idle.Seconds = 45 * 60
	mu.Unlock()
	for range 2 {
		if err := c.actOnIdle(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	wantOnly(t, events, "Warning IdleGPUsReclaimed evicted by its namespace's idle policy; create it again to resume")
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
// PodDisruptionBudget may make it wait), a Job suspended, a Deployment (by
// its ReplicaSet) and a StatefulSet scaled to zero with their replicas
// recorded, once; a Deployment under an HPA (KEDA's included) and a pod of
// an operator are left to them, with an Event.
func TestReclaimByOwner(t *testing.T) {
	ctx := t.Context()
	ownedBy := func(pod *corev1.Pod, kind, name string) *corev1.Pod {
		yes := true
		pod.OwnerReferences = []metav1.OwnerReference{{Kind: kind, Name: name, Controller: &yes}}
		return pod
	}
	three, two := int32(3), int32(2)
	yes := true
	objs := []runtime.Object{
		&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: namespace}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "notebook", Namespace: namespace}, Spec: appsv1.DeploymentSpec{Replicas: &three}},
		&appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "notebook-5d8f", Namespace: namespace,
			OwnerReferences: []metav1.OwnerReference{{Kind: "Deployment", Name: "notebook", Controller: &yes}}}},
		&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "lab", Namespace: namespace}, Spec: appsv1.StatefulSetSpec{Replicas: &two}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "serve", Namespace: namespace}, Spec: appsv1.DeploymentSpec{Replicas: &two}},
		&appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "serve-7c9", Namespace: namespace,
			OwnerReferences: []metav1.OwnerReference{{Kind: "Deployment", Name: "serve", Controller: &yes}}}},
		&autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Name: "keda-hpa-serve", Namespace: namespace},
			Spec: autoscalingv2.HorizontalPodAutoscalerSpec{ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{Kind: "Deployment", Name: "serve"}}},
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
	for _, tc := range []struct {
		pod  *corev1.Pod
		want string
	}{
		{bare, "Warning IdleGPUsLeftToOwner idle past its deadline; its eviction waits for its PodDisruptionBudget"},
		{ownedBy(gpuPod("train-0", "s1", 50), "Job", "train"), `Warning IdleGPUsReclaimed Job train suspended by its namespace's idle policy; to resume: kubectl patch job train -n team-a -p '{"spec":{"suspend":false}}'`},
		{ownedBy(gpuPod("notebook-0", "s1", 50), "ReplicaSet", "notebook-5d8f"), "Warning IdleGPUsReclaimed Deployment notebook scaled from 3 to 0 replicas by its namespace's idle policy (gpupool.io/idle-replicas records it); to resume: kubectl scale deployment/notebook -n team-a --replicas=3"},
		{ownedBy(gpuPod("notebook-1", "s1", 50), "ReplicaSet", "notebook-5d8f"), ""}, // its Deployment is at zero already
		{ownedBy(gpuPod("lab-0", "s1", 50), "StatefulSet", "lab"), "Warning IdleGPUsReclaimed StatefulSet lab scaled from 2 to 0 replicas"},
		{ownedBy(gpuPod("serve-0", "s1", 50), "ReplicaSet", "serve-7c9"), "Normal IdleGPUsLeftToOwner idle past its deadline; Deployment serve is scaled by HorizontalPodAutoscaler keda-hpa-serve, which decides: nothing reclaimed"},
		{ownedBy(gpuPod("worker-0", "s1", 50), "TFJob", "mnist"), "Normal IdleGPUsLeftToOwner idle past its deadline; owned by TFJob mnist, whose controller decides: nothing reclaimed"},
	} {
		done, err := c.reclaim(ctx, tc.pod)
		if err != nil || done != (tc.pod != bare) {
			t.Fatalf("%s: done %v, %v; want done but for the eviction its budget refuses", tc.pod.Name, done, err)
		}
		var got []string
		for len(events.Events) > 0 {
			got = append(got, <-events.Events)
		}
		if tc.want == "" && len(got) != 0 || tc.want != "" && (len(got) != 1 || !strings.HasPrefix(got[0], tc.want)) {
			t.Errorf("%s: Events %q, want %q", tc.pod.Name, got, tc.want)
		}
	}
	job, _ := k.BatchV1().Jobs(namespace).Get(ctx, "train", metav1.GetOptions{})
	notebook, _ := k.AppsV1().Deployments(namespace).Get(ctx, "notebook", metav1.GetOptions{})
	lab, _ := k.AppsV1().StatefulSets(namespace).Get(ctx, "lab", metav1.GetOptions{})
	serve, _ := k.AppsV1().Deployments(namespace).Get(ctx, "serve", metav1.GetOptions{})
	switch {
	case job.Spec.Suspend == nil || !*job.Spec.Suspend:
		t.Error("the Job is not suspended")
	case *notebook.Spec.Replicas != 0 || notebook.Annotations[kube.AnnotationIdleReplicas] != "3":
		t.Errorf("the Deployment: %d replicas, annotations %v; want 0, and 3 recorded", *notebook.Spec.Replicas, notebook.Annotations)
	case *lab.Spec.Replicas != 0 || lab.Annotations[kube.AnnotationIdleReplicas] != "2":
		t.Errorf("the StatefulSet: %d replicas, annotations %v; want 0, and 2 recorded", *lab.Spec.Replicas, lab.Annotations)
	case *serve.Spec.Replicas != 2:
		t.Errorf("the autoscaled Deployment was scaled to %d", *serve.Spec.Replicas)
	}
	// The budget allows it now: the bare pod is evicted, its UID checked.
	pdbBlocks = false
	k.ClearActions()
	if done, err := c.reclaim(ctx, bare); !done || err != nil {
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

func mustClient(t *testing.T) *client.Client {
	t.Helper()
	cl, err := client.New([]string{"http://127.0.0.1:1"}, "")
	if err != nil {
		t.Fatal(err)
	}
	return cl
}
