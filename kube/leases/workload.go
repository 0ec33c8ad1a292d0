package leases

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// readScalable reads the Deployment, StatefulSet or ReplicaSet (kind) name:
// its metadata and replicas, what reclaiming and resuming act on.
func readScalable(ctx context.Context, c kubernetes.Interface, kind, namespace, name string) (metav1.Object, *int32, error) {
	apps := c.AppsV1()
	switch kind {
	case "Deployment":
		d, err := apps.Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, nil, err
		}
		return d, d.Spec.Replicas, nil
	case "StatefulSet":
		s, err := apps.StatefulSets(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, nil, err
		}
		return s, s.Spec.Replicas, nil
	}
	r, err := apps.ReplicaSets(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	return r, r.Spec.Replicas, nil
}

// patchWorkload merge-patches the Job, Deployment, StatefulSet or
// ReplicaSet (kind) name with body.
func patchWorkload(ctx context.Context, c kubernetes.Interface, kind, namespace, name string, body []byte) error {
	var err error
	switch kind {
	case "Job":
		_, err = c.BatchV1().Jobs(namespace).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
	case "Deployment":
		_, err = c.AppsV1().Deployments(namespace).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
	case "StatefulSet":
		_, err = c.AppsV1().StatefulSets(namespace).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
	default:
		_, err = c.AppsV1().ReplicaSets(namespace).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
	}
	return err
}
