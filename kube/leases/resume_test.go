package leases

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/gpupool/gpupool/kube"
)

// TestResumeUndoesTheReclaim: what reclaiming did, Resume undoes, and
// nothing else: a Job it suspended runs again and a Deployment or
// StatefulSet gets its recorded replicas, their marks removed; a Job
// suspended by someone else (Kueue), a workload never reclaimed, one
// scaled since, a pod and a name that is not a workload are refused or
// left, each saying why.
func TestResumeUndoesTheReclaim(t *testing.T) {
	ctx := t.Context()
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: namespace, UID: types.UID(name + "-uid")}
	}
	held := &batchv1.Job{ObjectMeta: meta("queued"), Spec: batchv1.JobSpec{Suspend: ptr.To(true)}}
	k := fake.NewClientset([]runtime.Object{
		&batchv1.Job{ObjectMeta: meta("train")},
		&appsv1.Deployment{ObjectMeta: meta("notebook"), Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](3)}},
		&appsv1.StatefulSet{ObjectMeta: meta("lab"), Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2)}},
		&appsv1.Deployment{ObjectMeta: meta("serve"), Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2)}},
		held,
	}...)
	c, err := NewController(Config{Client: k, Allocator: mustClient(t), Recorder: record.NewFakeRecorder(100)})
	if err != nil {
		t.Fatal(err)
	}
	owned := func(kind, apiVersion, name string) {
		t.Helper()
		pod := gpuPod(name+"-0", "s1", 50)
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID(name + "-uid"), Controller: ptr.To(true)}}
		w, err := c.workloadOf(ctx, pod)
		if err != nil {
			t.Fatal(err)
		}
		if done, err := c.reclaim(ctx, pod, w); !done || err != nil {
			t.Fatalf("reclaiming %s %s: %v, %v", kind, name, done, err)
		}
	}
	owned("Job", "batch/v1", "train")
	owned("StatefulSet", "apps/v1", "lab")
	// A Deployment the policy scaled, then someone scaled by hand.
	if _, err := k.AppsV1().Deployments(namespace).Patch(ctx, "serve", types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"gpupool.io/idle-replicas":"2"}},"spec":{"replicas":5}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// A Deployment scaled to zero with its replicas recorded.
	if _, err := k.AppsV1().Deployments(namespace).Patch(ctx, "notebook", types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"gpupool.io/idle-replicas":"3"}},"spec":{"replicas":0}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct{ workload, want, err string }{
		{"job/train", "Job team-a/train resumed (suspended by the idle policy at ", ""},
		{"deployment/notebook", "Deployment team-a/notebook scaled back to 3 replicas", ""},
		{"sts/lab", "StatefulSet team-a/lab scaled back to 2 replicas", ""},
		{"deploy/serve", "Deployment team-a/serve was scaled since, to 5 replicas: left so; its gpupool.io/idle-replicas annotation removed", ""},
		{"job/queued", "", "Job team-a/queued was not suspended by the idle policy (no gpupool.io/idle-suspended annotation): resume it the way it was suspended"},
		{"deployment/notebook", "", "Deployment team-a/notebook was not scaled to zero by the idle policy (no gpupool.io/idle-replicas annotation): nothing to resume"},
		{"job/gone", "", "Job team-a/gone: not found"},
		{"pod/scratch", "", "pod/scratch: an evicted pod is gone; create it again from its manifest"},
		{"cronjob/nightly", "", `"cronjob/nightly": want job/NAME, deployment/NAME, statefulset/NAME or replicaset/NAME`},
		{"notebook", "", `"notebook": want job/NAME, deployment/NAME, statefulset/NAME or replicaset/NAME`},
	} {
		got, err := Resume(ctx, k, namespace, tc.workload)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("%s: %q, %v; want the error %q", tc.workload, got, err, tc.err)
			}
			continue
		}
		if err != nil || !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: %q, %v; want %q", tc.workload, got, err, tc.want)
		}
	}
	j, _ := k.BatchV1().Jobs(namespace).Get(ctx, "train", metav1.GetOptions{})
	d, _ := k.AppsV1().Deployments(namespace).Get(ctx, "notebook", metav1.GetOptions{})
	s, _ := k.AppsV1().StatefulSets(namespace).Get(ctx, "lab", metav1.GetOptions{})
	serve, _ := k.AppsV1().Deployments(namespace).Get(ctx, "serve", metav1.GetOptions{})
	q, _ := k.BatchV1().Jobs(namespace).Get(ctx, "queued", metav1.GetOptions{})
	for _, tc := range []struct {
		name     string
		got      int32
		want     int32
		annotate map[string]string
	}{
		{"Job train (1 = runs)", map[bool]int32{true: 0, false: 1}[ptr.Deref(j.Spec.Suspend, false)], 1, j.Annotations},
		{"Deployment notebook", *d.Spec.Replicas, 3, d.Annotations},
		{"StatefulSet lab", *s.Spec.Replicas, 2, s.Annotations},
		{"Deployment serve", *serve.Spec.Replicas, 5, serve.Annotations},
		{"Job queued (0 = suspended)", map[bool]int32{true: 0, false: 1}[ptr.Deref(q.Spec.Suspend, false)], 0, q.Annotations},
	} {
		_, replicas := tc.annotate[kube.AnnotationIdleReplicas]
		_, suspended := tc.annotate[kube.AnnotationIdleSuspended]
		if tc.got != tc.want || replicas || suspended {
			t.Errorf("%s: %d, annotations %v; want %d and no mark of the idle policy", tc.name, tc.got, tc.annotate, tc.want)
		}
	}
}
