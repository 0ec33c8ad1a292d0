package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
)

// TestChartSpreadsReplicas places the replicas of the chart's etcd
// (StatefulSet) and webhook (Deployment), as the articles' flags render
// them, with the cluster's kube-scheduler on kwok nodes, beside a tainted
// node as a control plane is: on three nodes, one replica each; on two,
// two and one, none Pending. The tainted node counts for neither (the
// spread's nodeTaintsPolicy Honor): were it a domain, it would hold no
// replica and keep the third Pending. Only the workloads' labels and
// spread are the chart's; their pods are placeholders.
func TestChartSpreadsReplicas(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cp, _ := startControlPlaneWith(ctx, t, nil, e2ekube.Options{})
	if err := cp.StartScheduler(ctx, e2ekube.SchedulerOptions{DefaultOnly: true}); err != nil {
		t.Fatal(err)
	}
	h := newHelm(t, cp.Kubeconfig)
	objs := h.template(ctx, t, seedFlags...)

	capacity := map[string]string{"cpu": "16", "memory": "64Gi", "pods": "110"}
	groups := map[string][]string{"three": {"three-0", "three-1", "three-2"}, "two": {"two-0", "two-1"}}
	var nodes []e2ekube.Node
	for group, names := range groups {
		for _, name := range append(slices.Clone(names), group+"-control-plane") {
			nodes = append(nodes, e2ekube.Node{Name: name, Capacity: capacity, Labels: map[string]string{"group": group}})
		}
	}
	if err := cp.AddKwokNodes(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	for group := range groups {
		taint := []byte(`{"spec":{"taints":[{"key":"kwok.x-k8s.io/node","value":"fake","effect":"NoSchedule"},{"key":"node-role.kubernetes.io/control-plane","effect":"NoSchedule"}]}}`)
		if _, err := cp.Client.CoreV1().Nodes().Patch(ctx, group+"-control-plane", types.MergePatchType, taint, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// placeholder is the pod template of the chart's workload: its labels
	// and spread, on the nodes of group.
	placeholder := func(tmpl corev1.PodTemplateSpec, group string) corev1.PodTemplateSpec {
		return corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: maps.Clone(tmpl.Labels)},
			Spec: corev1.PodSpec{
				NodeSelector:                 map[string]string{"group": group},
				Tolerations:                  []corev1.Toleration{e2ekube.KwokToleration},
				TopologySpreadConstraints:    tmpl.Spec.TopologySpreadConstraints,
				AutomountServiceAccountToken: ptr.To(false),
				Containers:                   []corev1.Container{{Name: "placeholder", Image: "placeholder"}},
			},
		}
	}
	var etcd appsv1.StatefulSet
	decode(t, find(t, objs, "StatefulSet", "gpupool-etcd"), &etcd)
	var webhook appsv1.Deployment
	decode(t, find(t, objs, "Deployment", "gpupool-webhook"), &webhook)
	for group, names := range groups {
		if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: group}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		s := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: etcd.Name, Namespace: group}, Spec: appsv1.StatefulSetSpec{
			Replicas: etcd.Spec.Replicas, Selector: etcd.Spec.Selector, PodManagementPolicy: etcd.Spec.PodManagementPolicy,
			Template: placeholder(etcd.Spec.Template, group)}}
		if _, err := cp.Client.AppsV1().StatefulSets(group).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: webhook.Name, Namespace: group}, Spec: appsv1.DeploymentSpec{
			Replicas: webhook.Spec.Replicas, Selector: webhook.Spec.Selector, Template: placeholder(webhook.Spec.Template, group)}}
		if _, err := cp.Client.AppsV1().Deployments(group).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, selector := range []string{"app.kubernetes.io/name=gpupool-etcd", "app.kubernetes.io/name=gpupool-webhook"} {
			var placed map[string]int
			err := retry(ctx, time.Minute, func() error {
				pods, err := cp.Client.CoreV1().Pods(group).List(ctx, metav1.ListOptions{LabelSelector: selector})
				if err != nil {
					return err
				}
				placed = map[string]int{}
				for _, p := range pods.Items {
					if p.Spec.NodeName == "" {
						return fmt.Errorf("pod %s is not placed", p.Name)
					}
					placed[p.Spec.NodeName]++
				}
				if len(pods.Items) != 3 {
					return fmt.Errorf("%d pods, want 3", len(pods.Items))
				}
				return nil
			})
			if err != nil {
				t.Errorf("%s on %d nodes: %v (placed: %v)", selector, len(names), err, placed)
				continue
			}
			var counts []int
			for node, n := range placed {
				if !slices.Contains(names, node) {
					t.Errorf("%s: %d replicas on %s, a node it may not run on", selector, n, node)
				}
				counts = append(counts, n)
			}
			slices.Sort(counts)
			if want := map[int][]int{3: {1, 1, 1}, 2: {1, 2}}[len(names)]; !slices.Equal(counts, want) {
				t.Errorf("%s on %d nodes: replicas %v, want %v", selector, len(names), placed, want)
			}
		}
	}
}
