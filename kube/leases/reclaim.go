package leases

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupool/gpupool/kube"
)

// The reasons of the Events reclaiming writes on a pod.
const (
	EventIdleReclaimed = "IdleGPUsReclaimed"
	EventIdleLeft      = "IdleGPUsLeftToOwner"
)

// reclaim gives back the GPUs of pod, whose lease its namespace's idle
// policy reclaims now, the way its owner's own controller ends pods, so
// that nothing is lost and no controller is fought: a Job is suspended
// (as Kueue does), a Deployment or StatefulSet with no autoscaler is
// scaled to zero (its replicas kept in AnnotationIdleReplicas), a pod of
// no controller is evicted (its PodDisruptionBudget holds). A workload
// under an autoscaler (an HPA, or KEDA's) or another controller (an
// operator's) is left to it: its pod gets the Event alone. Each pod
// terminates with its grace period, and its lease ends with it, as ever.
// It is done unless an eviction waits for its budget: tried again then.
func (c *Controller) reclaim(ctx context.Context, pod *corev1.Pod) (done bool, err error) {
	owner := metav1.GetControllerOf(pod)
	if owner == nil {
		err := c.client.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{
			ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
			DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}}})
		if apierrors.IsTooManyRequests(err) {
			c.record.Event(pod, corev1.EventTypeWarning, EventIdleLeft, "idle past its deadline; its eviction waits for its PodDisruptionBudget: "+err.Error())
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("evicting pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		c.record.Event(pod, corev1.EventTypeWarning, EventIdleReclaimed, "evicted by its namespace's idle policy; create it again to resume")
		return true, nil
	}
	kind, name := owner.Kind, owner.Name
	if kind == "ReplicaSet" {
		rs, err := c.client.AppsV1().ReplicaSets(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Errorf("the ReplicaSet of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		if up := metav1.GetControllerOf(rs); up != nil {
			kind, name = up.Kind, up.Name
		}
	}
	switch kind {
	case "Job":
		patch := []byte(`{"spec":{"suspend":true}}`)
		if _, err := c.client.BatchV1().Jobs(pod.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return false, fmt.Errorf("suspending Job %s/%s: %w", pod.Namespace, name, err)
		}
		c.record.Eventf(pod, corev1.EventTypeWarning, EventIdleReclaimed,
			`Job %s suspended by its namespace's idle policy; to resume: kubectl patch job %s -n %s -p '{"spec":{"suspend":false}}'`, name, name, pod.Namespace)
		return true, nil
	case "Deployment", "StatefulSet":
		return true, c.scaleToZero(ctx, pod, kind, name)
	}
	c.record.Eventf(pod, corev1.EventTypeNormal, EventIdleLeft, "idle past its deadline; owned by %s %s, whose controller decides: nothing reclaimed", kind, name)
	return true, nil
}

// scaleToZero scales the Deployment or StatefulSet name to zero, its
// replicas recorded in the same patch, unless an autoscaler owns its
// size or it is at zero already.
func (c *Controller) scaleToZero(ctx context.Context, pod *corev1.Pod, kind, name string) error {
	hpas, err := c.client.AutoscalingV2().HorizontalPodAutoscalers(pod.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("the autoscalers of namespace %s: %w", pod.Namespace, err)
	}
	for _, h := range hpas.Items {
		if ref := h.Spec.ScaleTargetRef; ref.Kind == kind && ref.Name == name {
			// KEDA's ScaledObjects scale through an HPA of their own.
			c.record.Eventf(pod, corev1.EventTypeNormal, EventIdleLeft, "idle past its deadline; %s %s is scaled by HorizontalPodAutoscaler %s, which decides: nothing reclaimed", kind, name, h.Name)
			return nil
		}
	}
	var replicas *int32
	var annotations map[string]string
	switch kind {
	case "Deployment":
		d, err := c.client.AppsV1().Deployments(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading Deployment %s/%s: %w", pod.Namespace, name, err)
		}
		replicas, annotations = d.Spec.Replicas, d.Annotations
	default:
		s, err := c.client.AppsV1().StatefulSets(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading StatefulSet %s/%s: %w", pod.Namespace, name, err)
		}
		replicas, annotations = s.Spec.Replicas, s.Annotations
	}
	had := int32(1) // Kubernetes' default
	if replicas != nil {
		had = *replicas
	}
	if _, scaled := annotations[kube.AnnotationIdleReplicas]; scaled && had == 0 {
		return nil // another of its pods' leases did it
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{kube.AnnotationIdleReplicas: strconv.Itoa(int(had))}},
		"spec":     map[string]any{"replicas": 0}})
	if err != nil {
		return err
	}
	if kind == "Deployment" {
		_, err = c.client.AppsV1().Deployments(pod.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	} else {
		_, err = c.client.AppsV1().StatefulSets(pod.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	}
	if err != nil {
		return fmt.Errorf("scaling %s %s/%s to zero: %w", kind, pod.Namespace, name, err)
	}
	c.record.Eventf(pod, corev1.EventTypeWarning, EventIdleReclaimed,
		"%s %s scaled from %d to 0 replicas by its namespace's idle policy (%s records it); to resume: kubectl scale %s/%s -n %s --replicas=%d",
		kind, name, had, kube.AnnotationIdleReplicas, kindResource(kind), name, pod.Namespace, had)
	return nil
}

func kindResource(kind string) string {
	if kind == "Deployment" {
		return "deployment"
	}
	return "statefulset"
}
