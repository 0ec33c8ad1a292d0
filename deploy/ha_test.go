package deploy_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// seedValues are the articles' --set flags.
var seedValues = map[string]any{
	"controller":   map[string]any{"replicas": 3},
	"scheduler":    map[string]any{"enabled": true},
	"devicePlugin": map[string]any{"nodeSelector": map[string]any{"gpu": true}},
}

// installs are what users install: each kustomization, and the chart
// with the articles' flags and with every component.
func installs(t *testing.T) map[string][]*unstructured.Unstructured {
	t.Helper()
	out := map[string][]*unstructured.Unstructured{}
	for _, dir := range kustomizations(t) {
		out[dir] = build(t, dir)
	}
	out["the chart, the articles' flags"] = mustRenderChart(t, seedValues)
	out["the chart, everything"] = mustRenderChart(t, map[string]any{"controller": map[string]any{"replicas": 3},
		"scheduler": map[string]any{"enabled": true}, "adapter": map[string]any{"apiService": true}})
	return out
}

// TestReplicasOnDifferentNodes: every workload of more than one replica
// keeps its replicas on different nodes while the cluster has them: a
// spread of at most 1 on the node's name that the scheduler does not
// break (DoNotSchedule), counting only the nodes the pod may run on
// (nodeTaintsPolicy Honor: a tainted control plane or a node that is not
// ready would otherwise be an empty domain that holds the replicas
// Pending), over the workload's own pods; a Deployment's, over one
// rollout's. On one node there is one domain, and every replica goes there.
func TestReplicasOnDifferentNodes(t *testing.T) {
	for what, objs := range installs(t) {
		for _, o := range objs {
			if o.GetKind() != "Deployment" && o.GetKind() != "StatefulSet" || o.GetLabels()["app.kubernetes.io/part-of"] != "gpupool" {
				continue
			}
			replicas, _, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "replicas")
			if n, ok := replicas.(int64); ok && n <= 1 || fmt.Sprint(replicas) == "1" {
				continue
			}
			pod, _ := podSpec(t, o)
			podLabels, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
			i := slices.IndexFunc(pod.TopologySpreadConstraints, func(c corev1.TopologySpreadConstraint) bool {
				return c.TopologyKey == corev1.LabelHostname
			})
			if i < 0 {
				t.Errorf("%s: %s %s (%v replicas) spreads nothing over nodes", what, o.GetKind(), o.GetName(), replicas)
				continue
			}
			c := pod.TopologySpreadConstraints[i]
			sel, err := metav1.LabelSelectorAsSelector(c.LabelSelector)
			if c.MaxSkew != 1 || c.WhenUnsatisfiable != corev1.DoNotSchedule || c.NodeTaintsPolicy == nil || *c.NodeTaintsPolicy != corev1.NodeInclusionPolicyHonor ||
				err != nil || !sel.Matches(labels.Set(podLabels)) {
				t.Errorf("%s: %s %s spreads %+v, want maxSkew 1, DoNotSchedule, nodeTaintsPolicy Honor, over its own pods", what, o.GetKind(), o.GetName(), c)
			}
			if rollout := slices.Contains(c.MatchLabelKeys, "pod-template-hash"); rollout != (o.GetKind() == "Deployment") {
				t.Errorf("%s: %s %s: matchLabelKeys %v: want pod-template-hash for a Deployment alone", what, o.GetKind(), o.GetName(), c.MatchLabelKeys)
			}
		}
	}
}

// TestEtcdKeepsItsQuorum: the 3-member etcd has a PodDisruptionBudget that
// lets a drain take one member at a time (2 of 3 keep the quorum), and a
// liveness probe that reads the member's own store, needing no leader, and
// waits long enough that a leader election or a slow disk does not restart
// a member; it starts only once the member has joined its cluster.
func TestEtcdKeepsItsQuorum(t *testing.T) {
	for what, objs := range installs(t) {
		i := slices.IndexFunc(objs, func(o *unstructured.Unstructured) bool {
			return o.GetKind() == "StatefulSet" && o.GetName() == "gpupool-etcd"
		})
		if i < 0 {
			continue
		}
		pod, _ := podSpec(t, objs[i])
		podLabels, _, _ := unstructured.NestedStringMap(objs[i].Object, "spec", "template", "metadata", "labels")
		var pdb policyv1.PodDisruptionBudget
		found := false
		for _, o := range objs {
			if o.GetKind() != "PodDisruptionBudget" {
				continue
			}
			var p policyv1.PodDisruptionBudget
			find(t, []*unstructured.Unstructured{o}, "PodDisruptionBudget", o.GetName(), &p)
			if sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector); err == nil && sel.Matches(labels.Set(podLabels)) {
				pdb, found = p, true
			}
		}
		if !found || pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.String() != "2" || pdb.Spec.MaxUnavailable != nil {
			t.Errorf("%s: etcd's PodDisruptionBudget %+v (found %v), want minAvailable 2", what, pdb.Spec, found)
		}
		c := pod.Containers[0]
		live, start := c.LivenessProbe, c.StartupProbe
		if live == nil || live.HTTPGet == nil {
			t.Errorf("%s: etcd has no HTTP liveness probe", what)
			continue
		}
		if !strings.Contains(live.HTTPGet.Path, "serializable=true") || !strings.Contains(live.HTTPGet.Path, "exclude=NOSPACE") || live.HTTPGet.Port.String() != "client" {
			t.Errorf("%s: etcd's liveness probe asks %s on %s: want the member's own health (serializable, without NOSPACE) on its client port", what, live.HTTPGet.Path, live.HTTPGet.Port.String())
		}
		if tolerated := live.PeriodSeconds * live.FailureThreshold; tolerated < 60 || live.TimeoutSeconds < 5 {
			t.Errorf("%s: etcd is restarted after %d s of failed probes, %d s each: want a minute or more, 5 s or more", what, tolerated, live.TimeoutSeconds)
		}
		if start == nil || start.HTTPGet == nil || start.PeriodSeconds*start.FailureThreshold < 120 {
			t.Errorf("%s: etcd's startup probe %+v: want 2 minutes or more for the members to find each other", what, start)
		}
	}
}

// TestAdapterReadsOnly: the adapter sends the readers token, which may
// only read, and mounts no other; the allocator's config has a readers
// token for it.
func TestAdapterReadsOnly(t *testing.T) {
	for what, objs := range installs(t) {
		i := slices.IndexFunc(objs, func(o *unstructured.Unstructured) bool {
			return o.GetKind() == "Deployment" && o.GetName() == "gpupool-adapter"
		})
		if i < 0 {
			continue
		}
		pod, _ := podSpec(t, objs[i])
		var keys []string
		for _, v := range pod.Volumes {
			if v.Secret != nil && strings.HasPrefix(v.Secret.SecretName, "gpupool-tokens") {
				if len(v.Secret.Items) == 0 {
					t.Errorf("%s: the adapter mounts every token of %s", what, v.Secret.SecretName)
				}
				for _, item := range v.Secret.Items {
					keys = append(keys, item.Key)
				}
			}
		}
		for _, c := range pod.Containers {
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					keys = append(keys, e.ValueFrom.SecretKeyRef.Key)
				}
			}
		}
		if !slices.Equal(keys, []string{"reader-token"}) {
			t.Errorf("%s: the adapter reads the tokens %v, want reader-token alone", what, keys)
		}
		if args := strings.Join(pod.Containers[0].Args, " "); !strings.Contains(args, "--allocator-token-file=/var/run/secrets/gpupool/reader-token") {
			t.Errorf("%s: the adapter sends %s", what, args)
		}
	}
	config := readFile(t, "base/config/allocator-config.yaml")
	if !strings.Contains(config, "readers:\n  tokens: [REPLACE-reader]") {
		t.Errorf("the allocator's placeholder config has no readers token:\n%s", config)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
