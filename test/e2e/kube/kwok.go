package kube

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// kwokStages tell kwok how fake nodes and pods move through their lives.
//
//go:embed testdata/kwok-stages.yaml
var kwokStages []byte

// kwokNodeKey is the key of the annotation that marks the nodes kwok
// manages (set to "fake"), and of the taint on them.
const kwokNodeKey = "kwok.x-k8s.io/node"

// KwokToleration tolerates the taint that AddKwokNode puts on its nodes,
// which keeps pods that are not meant for fake nodes off them.
var KwokToleration = corev1.Toleration{
	Key:      kwokNodeKey,
	Operator: corev1.TolerationOpExists,
	Effect:   corev1.TaintEffectNoSchedule,
}

// AddKwokNode creates a node that kwok manages, with capacity (and as much
// allocatable) such as {"cpu": "32", "nvidia.com/gpu": "8"}, and returns
// once kwok has made it Ready. Pods run on it when they name it in
// spec.nodeName and carry KwokToleration.
func (c *ControlPlane) AddKwokNode(ctx context.Context, name string, capacity map[string]string) error {
	resources := corev1.ResourceList{}
	for k, v := range capacity {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return fmt.Errorf("node %s: capacity %s: %w", name, k, err)
		}
		resources[corev1.ResourceName(k)] = q
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{kwokNodeKey: "fake"},
			Labels:      map[string]string{"kubernetes.io/hostname": name, "type": "kwok"},
		},
		Spec: corev1.NodeSpec{
			Taints: []corev1.Taint{{Key: kwokNodeKey, Value: "fake", Effect: corev1.TaintEffectNoSchedule}},
		},
		Status: corev1.NodeStatus{Capacity: resources, Allocatable: resources},
	}
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return err
	}
	return c.kwok.waitFor(ctx, "node "+name+" to be Ready", func(ctx context.Context) error {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return errors.New("not Ready")
	})
}
