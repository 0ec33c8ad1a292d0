package leases

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/gpupool/gpupool/kube"
)

// resumeKinds are the workloads Resume takes, by the names kubectl
// gives them (kind/name, as in kubectl scale deployment/x).
var resumeKinds = map[string]string{
	"job": "Job", "jobs": "Job", "job.batch": "Job",
	"deployment": "Deployment", "deployments": "Deployment", "deploy": "Deployment", "deployment.apps": "Deployment",
	"statefulset": "StatefulSet", "statefulsets": "StatefulSet", "sts": "StatefulSet", "statefulset.apps": "StatefulSet",
	"replicaset": "ReplicaSet", "replicasets": "ReplicaSet", "rs": "ReplicaSet", "replicaset.apps": "ReplicaSet",
}

// Resume undoes what the idle policy did to the workload ("job/train",
// "deployment/notebook", "statefulset/lab", "replicaset/x") in namespace:
// a Job it suspended runs again, a Deployment, StatefulSet or ReplicaSet
// it scaled to zero gets back the replicas it recorded. Its pods are
// placed and leased again as new. It refuses a workload the policy did
// not reclaim (a Job Kueue suspended is Kueue's to resume), and says what
// it did.
func Resume(ctx context.Context, c kubernetes.Interface, namespace, workload string) (string, error) {
	resource, name, ok := strings.Cut(workload, "/")
	kind := resumeKinds[strings.ToLower(resource)]
	switch {
	case strings.EqualFold(resource, "pod") || strings.EqualFold(resource, "pods"):
		return "", fmt.Errorf("%s: an evicted pod is gone; create it again from its manifest", workload)
	case !ok || name == "" || kind == "":
		return "", fmt.Errorf("%q: want job/NAME, deployment/NAME, statefulset/NAME or replicaset/NAME", workload)
	case namespace == "":
		return "", fmt.Errorf("%s: no namespace", workload)
	}
	if kind == "Job" {
		return resumeJob(ctx, c, namespace, name)
	}
	return scaleBack(ctx, c, kind, namespace, name)
}

func resumeJob(ctx context.Context, c kubernetes.Interface, namespace, name string) (string, error) {
	j, err := c.BatchV1().Jobs(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", notFound(err, "Job", namespace, name)
	}
	when, ok := j.Annotations[kube.AnnotationIdleSuspended]
	switch {
	case !ok:
		return "", fmt.Errorf("%s %s/%s was not suspended by the idle policy (no %s annotation): resume it the way it was suspended", "Job", namespace, name, kube.AnnotationIdleSuspended)
	case j.Spec.Suspend == nil || !*j.Spec.Suspend:
		return fmt.Sprintf("Job %s/%s runs already (suspended by the idle policy at %s, since resumed); its %s annotation removed", namespace, name, when, kube.AnnotationIdleSuspended),
			patch(ctx, c, "Job", namespace, name, j.UID, j.ResourceVersion, nil)
	}
	suspend := false
	if err := patch(ctx, c, "Job", namespace, name, j.UID, j.ResourceVersion, map[string]any{"suspend": &suspend}); err != nil {
		return "", err
	}
	return fmt.Sprintf("Job %s/%s resumed (suspended by the idle policy at %s)", namespace, name, when), nil
}

func scaleBack(ctx context.Context, c kubernetes.Interface, kind, namespace, name string) (string, error) {
	meta, replicas, err := readScalable(ctx, c, kind, namespace, name)
	if err != nil {
		return "", notFound(err, kind, namespace, name)
	}
	recorded, ok := meta.GetAnnotations()[kube.AnnotationIdleReplicas]
	if !ok {
		return "", fmt.Errorf("%s %s/%s was not scaled to zero by the idle policy (no %s annotation): nothing to resume", kind, namespace, name, kube.AnnotationIdleReplicas)
	}
	had, err := strconv.ParseInt(recorded, 10, 32)
	if err != nil || had < 0 {
		return "", fmt.Errorf("%s %s/%s: annotation %s=%q: not a number of replicas", kind, namespace, name, kube.AnnotationIdleReplicas, recorded)
	}
	if now := int32(1); replicas == nil || *replicas != 0 {
		if replicas != nil {
			now = *replicas
		}
		return fmt.Sprintf("%s %s/%s was scaled since, to %d replicas: left so; its %s annotation removed", kind, namespace, name, now, kube.AnnotationIdleReplicas),
			patch(ctx, c, kind, namespace, name, meta.GetUID(), meta.GetResourceVersion(), nil)
	}
	if err := patch(ctx, c, kind, namespace, name, meta.GetUID(), meta.GetResourceVersion(), map[string]any{"replicas": had}); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s %s/%s scaled back to %d replicas", kind, namespace, name, had), nil
}

// patch removes the idle policy's annotations from the workload and sets
// spec, in one merge patch that holds the UID and resourceVersion it was
// read at, so that a workload changed since is not overwritten.
func patch(ctx context.Context, c kubernetes.Interface, kind, namespace, name string, uid types.UID, resourceVersion string, spec map[string]any) error {
	body := map[string]any{"metadata": map[string]any{"uid": uid, "resourceVersion": resourceVersion,
		"annotations": map[string]any{kube.AnnotationIdleReplicas: nil, kube.AnnotationIdleSuspended: nil}}}
	if spec != nil {
		body["spec"] = spec
	}
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	err = patchWorkload(ctx, c, kind, namespace, name, b)
	if apierrors.IsConflict(err) {
		return fmt.Errorf("%s %s/%s changed while it was resumed; run it again: %w", kind, namespace, name, err)
	}
	if err != nil {
		return fmt.Errorf("resuming %s %s/%s: %w", kind, namespace, name, err)
	}
	return nil
}

func notFound(err error, kind, namespace, name string) error {
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%s %s/%s: not found", kind, namespace, name)
	}
	return fmt.Errorf("reading %s %s/%s: %w", kind, namespace, name, err)
}
