package kube

import (
	"context"
	_ "embed"
	"fmt"
	"maps"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// kwokStages tell kwok how fake nodes and pods move through their lives.
//
//go:embed testdata/kwok-stages.yaml
var kwokStages []byte

// kwokConfig sizes kwok's workers for a thousand nodes.
//
//go:embed testdata/kwok.yaml
var kwokConfig []byte

// kwokNodeKey is the key of the annotation that marks the nodes kwok
// manages (set to "fake"), and of the taint on them.
const kwokNodeKey = "kwok.x-k8s.io/node"

// nodeLeaseDuration is how long a node lease lasts. kwok renews each a
// quarter of the way through, as kubelets do; at 1,213 nodes, the
// kubelets' 40 s would make 120 lease updates a second, which would take
// much of two cores from the apiserver and etcd.
const nodeLeaseDuration = 5 * time.Minute

// concurrentCreates bounds how many creations AddKwokNodes (and the scale
// benchmark, for pods) has in flight: enough to keep the apiserver busy.
const concurrentCreates = 32

// KwokToleration tolerates the taint that AddKwokNodes puts on its nodes,
// which keeps pods that are not meant for fake nodes off them.
var KwokToleration = corev1.Toleration{
	Key:      kwokNodeKey,
	Operator: corev1.TolerationOpExists,
	Effect:   corev1.TaintEffectNoSchedule,
}

// Node describes a node for AddKwokNodes.
type Node struct {
	Name string
	// Capacity (and as much allocatable) such as {"cpu": "32",
	// "nvidia.com/gpu": "8"}.
	Capacity map[string]string
	// Labels go beside kubernetes.io/hostname=<name> and type=kwok, which
	// they may override.
	Labels map[string]string
}

// AddKwokNode adds one node, as AddKwokNodes does.
func (c *ControlPlane) AddKwokNode(ctx context.Context, name string, capacity map[string]string) error {
	return c.AddKwokNodes(ctx, []Node{{Name: name, Capacity: capacity}})
}

// AddKwokNodes creates nodes that kwok manages, several at a time, and
// returns once they can all take pods: kwok has made them Ready and the
// node lifecycle controller has lifted the not-ready taint that
// kube-apiserver puts on every new node. Pods run on them once bound, by a
// scheduler or by naming the node in spec.nodeName, if they carry
// KwokToleration.
func (c *ControlPlane) AddKwokNodes(ctx context.Context, nodes []Node) error {
	objects := make([]*corev1.Node, len(nodes))
	for i, n := range nodes {
		node, err := kwokNode(n)
		if err != nil {
			return err
		}
		objects[i] = node
	}
	waiting := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		waiting[n.Name] = true
	}
	// One watch sees the nodes become schedulable, rather than a GET per
	// node.
	var mu sync.Mutex
	markSchedulable := func(obj any) {
		node, ok := obj.(*corev1.Node)
		if ok && nodeSchedulable(node) {
			mu.Lock()
			delete(waiting, node.Name)
			mu.Unlock()
		}
	}
	factory := informers.NewSharedInformerFactory(c.Client, 0)
	informer := factory.Core().V1().Nodes().Informer()
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    markSchedulable,
		UpdateFunc: func(_, obj any) { markSchedulable(obj) },
	}); err != nil {
		return err
	}
	stop := make(chan struct{})
	factory.Start(stop)
	defer func() {
		close(stop)
		factory.Shutdown()
	}()

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(concurrentCreates)
	for _, node := range objects {
		g.Go(func() error {
			if _, err := c.Client.CoreV1().Nodes().Create(gctx, node, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("creating node %s: %w", node.Name, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	what := fmt.Sprintf("%d nodes to be Ready and untainted", len(nodes))
	return c.kwok.waitFor(ctx, what, func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		for name := range waiting {
			return fmt.Errorf("%d not Ready or still tainted, such as %s", len(waiting), name)
		}
		return nil
	})
}

// kwokNode is the Node object for n: marked and tainted for kwok.
func kwokNode(n Node) (*corev1.Node, error) {
	resources := corev1.ResourceList{}
	for k, v := range n.Capacity {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return nil, fmt.Errorf("node %s: capacity %s: %w", n.Name, k, err)
		}
		resources[corev1.ResourceName(k)] = q
	}
	labels := map[string]string{"kubernetes.io/hostname": n.Name, "type": "kwok"}
	maps.Copy(labels, n.Labels)
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        n.Name,
			Annotations: map[string]string{kwokNodeKey: "fake"},
			Labels:      labels,
		},
		Spec: corev1.NodeSpec{
			Taints: []corev1.Taint{{Key: kwokNodeKey, Value: "fake", Effect: corev1.TaintEffectNoSchedule}},
		},
		Status: corev1.NodeStatus{Capacity: resources, Allocatable: resources},
	}, nil
}

// nodeSchedulable says whether pods tolerating kwok's taint can be
// scheduled on node. Ready is not enough: kube-apiserver taints each new
// node node.kubernetes.io/not-ready, and the node lifecycle controller
// lifts it only after it sees the node Ready. Creating pods in between
// gave kube-scheduler a few of the nodes to choose from (at 1,213 nodes,
// 1,107 still tainted when the last was Ready).
func nodeSchedulable(node *corev1.Node) bool {
	for _, t := range node.Spec.Taints {
		if t.Key != kwokNodeKey {
			return false
		}
	}
	return nodeReady(node)
}

func nodeReady(node *corev1.Node) bool {
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}
