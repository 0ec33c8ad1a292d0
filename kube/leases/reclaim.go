package leases

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/gpupool/gpupool/kube"
)

// The reasons of the Events reclaiming writes on a pod.
const (
	EventIdleReclaimed = "IdleGPUsReclaimed"
	EventIdleLeft      = "IdleGPUsLeftToOwner"
)

// workload is what reclaiming acts on for a pod: its controller, read and
// checked against the pod's reference (kind, name, UID), or none.
type workload struct {
	kind, name string        // empty for a pod that reclaiming evicts
	meta       metav1.Object // the controller as read, nil for none
	replicas   *int32        // a Deployment's, StatefulSet's or ReplicaSet's
	// evicted says why a pod that names a controller is evicted all the
	// same: a kind that is not scaled here, or a reference that names no
	// such object (a tenant's forged owner must not dodge the policy).
	evicted string
}

// workloadOf resolves pod's controller: a Job, a StatefulSet, a ReplicaSet
// or the Deployment above it. Each is read, and counts only if it is the
// object the reference names (its UID), so that a reference a tenant wrote
// by hand cannot make a pod look like another's.
func (c *Controller) workloadOf(ctx context.Context, pod *corev1.Pod) (workload, error) {
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return workload{}, nil
	}
	group := ""
	if gv, err := schema.ParseGroupVersion(ref.APIVersion); err == nil {
		group = gv.Group
	}
	ns := pod.Namespace
	switch {
	case group == "batch" && ref.Kind == "Job":
		j, err := c.client.BatchV1().Jobs(ns).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return checked(ref)(nil, nil, err)
		}
		return checked(ref)(j, nil, nil)
	case group == "apps" && ref.Kind == "StatefulSet":
		return checked(ref)(readScalable(ctx, c.client, ref.Kind, ns, ref.Name))
	case group == "apps" && ref.Kind == "ReplicaSet":
		w, err := checked(ref)(readScalable(ctx, c.client, ref.Kind, ns, ref.Name))
		if err != nil || w.meta == nil {
			return w, err
		}
		return c.deploymentOf(ctx, w)
	}
	return workload{evicted: fmt.Sprintf("its controller, %s %s, is of a kind the idle policy does not scale: its pod is evicted, as a node drain does", ref.Kind, ref.Name)}, nil
}

// deploymentOf is the Deployment that controls w's ReplicaSet, when there
// is one, else w: a ReplicaSet of its own, or whose Deployment is gone, is
// scaled as a Deployment is.
func (c *Controller) deploymentOf(ctx context.Context, w workload) (workload, error) {
	up := metav1.GetControllerOf(w.meta)
	if up == nil || up.Kind != "Deployment" {
		return w, nil
	}
	d, err := checked(up)(readScalable(ctx, c.client, up.Kind, w.meta.GetNamespace(), up.Name))
	if err != nil || d.meta == nil {
		return w, err
	}
	return d, nil
}

// checked makes the workload ref names of what a read returned (obj,
// its replicas, the read's error): none, for eviction, when no such
// object is there or it is another one.
func checked(ref *metav1.OwnerReference) func(obj metav1.Object, replicas *int32, err error) (workload, error) {
	return func(obj metav1.Object, replicas *int32, err error) (workload, error) {
		switch {
		case apierrors.IsNotFound(err):
			return workload{evicted: fmt.Sprintf("its controller reference names %s %s, which does not exist: its pod is evicted", ref.Kind, ref.Name)}, nil
		case err != nil:
			return workload{}, fmt.Errorf("reading %s %s: %w", ref.Kind, ref.Name, err)
		case obj.GetUID() != ref.UID:
			return workload{evicted: fmt.Sprintf("its controller reference names %s %s with UID %s, not the one of that name: its pod is evicted", ref.Kind, ref.Name, ref.UID)}, nil
		}
		return workload{kind: ref.Kind, name: ref.Name, meta: obj, replicas: replicas}, nil
	}
}

// exemption is where the platform team exempted pod or its workload from
// its namespace's reclaim (kube.AnnotationIdleExempt), and why; "" when it
// did not. A ValidatingAdmissionPolicy lets no one else set it.
func (w workload) exemption(pod *corev1.Pod) string {
	if why, ok := pod.Annotations[kube.AnnotationIdleExempt]; ok {
		return fmt.Sprintf("%s on pod %s: %q", kube.AnnotationIdleExempt, pod.Name, why)
	}
	if w.meta != nil {
		if why, ok := w.meta.GetAnnotations()[kube.AnnotationIdleExempt]; ok {
			return fmt.Sprintf("%s on %s %s: %q", kube.AnnotationIdleExempt, w.kind, w.name, why)
		}
	}
	return ""
}

// reclaim gives back the GPUs of pod, whose lease its namespace's idle
// policy reclaims now, the way its owner's own controller ends pods, so
// that nothing is lost and no controller is fought: a Job is suspended
// (as Kueue does), a Deployment, StatefulSet or ReplicaSet with no
// autoscaler is scaled to zero (its replicas kept in
// AnnotationIdleReplicas), any other pod is evicted (its
// PodDisruptionBudget holds, and an operator sees what a node drain
// shows it). A workload under an autoscaler (an HPA that can change its
// size, or KEDA's) is left to it: its pod gets the Event alone. Each pod
// terminates with its grace period, and its lease ends with it, as ever.
// It is done unless an eviction waits for its budget: tried again then.
func (c *Controller) reclaim(ctx context.Context, pod *corev1.Pod, w workload) (done bool, err error) {
	switch w.kind {
	case "":
		return c.evict(ctx, pod, w.evicted)
	case "Job":
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"uid": w.meta.GetUID(), "annotations": map[string]string{kube.AnnotationIdleSuspended: time.Now().UTC().Format(time.RFC3339)}},
			"spec":     map[string]any{"suspend": true}})
		if err != nil {
			return false, err
		}
		if err := patchWorkload(ctx, c.client, "Job", pod.Namespace, w.name, patch); err != nil {
			return false, fmt.Errorf("suspending Job %s/%s: %w", pod.Namespace, w.name, err)
		}
		c.record.Eventf(pod, corev1.EventTypeWarning, EventIdleReclaimed,
			"Job %s suspended by its namespace's idle policy; to resume: gpupool resume job/%s -n %s", w.name, w.name, pod.Namespace)
		return true, nil
	}
	return true, c.scaleToZero(ctx, pod, w)
}

// evict evicts pod, through the Eviction API so that its
// PodDisruptionBudget holds: not done while the budget refuses.
func (c *Controller) evict(ctx context.Context, pod *corev1.Pod, why string) (done bool, err error) {
	err = c.client.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}}})
	if apierrors.IsTooManyRequests(err) {
		c.record.Event(pod, corev1.EventTypeWarning, EventIdleLeft, "idle past its deadline; its eviction waits for its PodDisruptionBudget: "+err.Error())
		return false, nil
	}
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return true, nil // gone, or another pod of its name: its lease ends with it
	}
	if err != nil {
		return false, fmt.Errorf("evicting pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	message := "evicted by its namespace's idle policy; create it again to resume"
	if why != "" {
		message = "evicted by its namespace's idle policy (" + why + "); create it again to resume"
	}
	c.record.Event(pod, corev1.EventTypeWarning, EventIdleReclaimed, message)
	return true, nil
}

// scaleToZero scales w, a Deployment, StatefulSet or ReplicaSet, to zero,
// its replicas recorded in the same patch, unless an autoscaler owns its
// size or it is at zero already. The patch holds w's UID and
// resourceVersion: a workload changed since it was read is not scaled on
// stale replicas (the next pass reads it again).
func (c *Controller) scaleToZero(ctx context.Context, pod *corev1.Pod, w workload) error {
	hpas, err := c.client.AutoscalingV2().HorizontalPodAutoscalers(pod.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("the autoscalers of namespace %s: %w", pod.Namespace, err)
	}
	for _, h := range hpas.Items {
		if ref := h.Spec.ScaleTargetRef; ref.Kind == w.kind && ref.Name == w.name && scales(h.Spec.MinReplicas, h.Spec.MaxReplicas, h.OwnerReferences) {
			c.record.Eventf(pod, corev1.EventTypeNormal, EventIdleLeft, "idle past its deadline; %s %s is scaled by HorizontalPodAutoscaler %s, which decides: nothing reclaimed", w.kind, w.name, h.Name)
			return nil
		}
	}
	had := int32(1) // Kubernetes' default
	if w.replicas != nil {
		had = *w.replicas
	}
	if _, scaled := w.meta.GetAnnotations()[kube.AnnotationIdleReplicas]; scaled && had == 0 {
		return nil // another of its pods' leases did it
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": w.meta.GetUID(), "resourceVersion": w.meta.GetResourceVersion(),
			"annotations": map[string]string{kube.AnnotationIdleReplicas: strconv.Itoa(int(had))}},
		"spec": map[string]any{"replicas": 0}})
	if err != nil {
		return err
	}
	if err := patchWorkload(ctx, c.client, w.kind, pod.Namespace, w.name, patch); err != nil {
		return fmt.Errorf("scaling %s %s/%s to zero: %w", w.kind, pod.Namespace, w.name, err)
	}
	c.record.Eventf(pod, corev1.EventTypeWarning, EventIdleReclaimed,
		"%s %s scaled from %d to 0 replicas by its namespace's idle policy (%s records it); to resume: gpupool resume %s/%s -n %s",
		w.kind, w.name, had, kube.AnnotationIdleReplicas, strings.ToLower(w.kind), w.name, pod.Namespace)
	return nil
}

// scales is whether an HPA with these bounds and owners can change its
// target's size: one whose least and most replicas are equal cannot (a
// tenant's HPA pinned at one replica must not exempt an idle pod), but
// KEDA's, which scales from zero through it, can.
func scales(minReplicas *int32, maxReplicas int32, owners []metav1.OwnerReference) bool {
	for _, o := range owners {
		if o.Kind == "ScaledObject" && strings.HasPrefix(o.APIVersion, "keda.sh/") {
			return true
		}
	}
	least := int32(1)
	if minReplicas != nil {
		least = *minReplicas
	}
	return maxReplicas > least
}
