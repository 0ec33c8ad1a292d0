package extender

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/allocator/service/servicetest"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/scheduler"
	"github.com/gpupool/gpupool/simulate"
)

// openBServers are the OpenB cluster's 1,213 GPU servers, as they
// register.
func openBServers(b *testing.B) []api.Server {
	b.Helper()
	f, err := simulate.Open(simulate.DefaultNodes)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	nodes, err := simulate.ReadNodes(f)
	if err != nil {
		b.Fatal(err)
	}
	servers := make([]api.Server, len(nodes))
	for i, n := range nodes {
		servers[i] = api.NewServer(n)
		for g := range servers[i].GPUs {
			servers[i].GPUs[g].MemoryBytes = 32 << 30
		}
	}
	return servers
}

// filterBodies are kube-scheduler's filter calls for n pods of the
// webhook's shape (10% of a GPU each, BFK's annotations, a
// bitfusion.io/gpu limit) over every server as a candidate, and the pods,
// which the extender reads from the cluster.
func filterBodies(b *testing.B, servers []api.Server, n int) ([][]byte, []runtime.Object) {
	b.Helper()
	names := make([]string, len(servers))
	for i, s := range servers {
		names[i] = s.Name
	}
	bodies, pods := make([][]byte, n), make([]runtime.Object, n)
	for i := range bodies {
		pod := testPod(fmt.Sprintf("worker-%d", i), kube.Request{GPUAmount: 1, GPUPercent: 10})
		pod.UID = types.UID(fmt.Sprintf("7f9c2ba4-e88f-11e7-aa6a-%012d", i))
		pod.Annotations[kube.AnnotationAutoManagement] = "all"
		pod.Annotations[kube.AnnotationClientOS] = "ubuntu20"
		pod.Annotations[kube.AnnotationClientVersion] = "401"
		pod.Annotations[kube.AnnotationStatus] = kube.StatusInjected
		c := &pod.Spec.Containers[0]
		c.Image, c.Command = "nvcr.io/nvidia/tensorflow:23.10-tf2-py3", []string{"python", "train.py"}
		c.Resources.Limits = v1.ResourceList{kube.ResourceGPU: resource.MustParse("10")}
		c.Resources.Requests[kube.ResourceGPU] = resource.MustParse("10")
		pod.Spec.SchedulerName = "gpupool-scheduler"
		pod.Spec.NodeSelector = map[string]string{"bitfusion-node": "enabled"}
		bodies[i] = mustJSON(b, extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
		pods[i] = pod
	}
	return bodies, pods
}

// BenchmarkFilter1213Nodes times a filter call as kube-scheduler makes it
// at the OpenB cluster's size (1,213 candidate names and the pod, about
// 25 kB): through a real allocator (placement among the candidates and a
// durable grant on a bolt store), and through an allocator that answers a
// fixed lease at once, which leaves the extender's own cost (decoding,
// encoding, the HTTP round trip to the allocator).
func BenchmarkFilter1213Nodes(b *testing.B) {
	servers := openBServers(b)
	b.Run("allocator", func(b *testing.B) {
		a := servicetest.Start(b, nil)
		a.Register(b, servers)
		bodies, pods := filterBodies(b, servers, b.N)
		benchmarkFilter(b, newExtenderOn(a.Client(b), pods...), bodies)
	})
	b.Run("extender", func(b *testing.B) {
		lease := mustJSON(b, api.Lease{ID: "lease-000001", Namespace: "team-a", Server: servers[0].Name,
			GPUs: []api.LeaseGPU{{Index: 0, UUID: "GPU-0", Model: "A100", Percent: 10, MemoryBytes: 8 << 30}}, UntilReleased: true})
		fixed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(lease)
		}))
		b.Cleanup(fixed.Close)
		alloc, err := client.New([]string{fixed.URL}, servicetest.AdminToken)
		if err != nil {
			b.Fatal(err)
		}
		bodies, pods := filterBodies(b, servers, b.N)
		benchmarkFilter(b, newExtenderOn(alloc, pods...), bodies)
	})
}

// benchmarkFilter posts the bodies to the extender over HTTP, one after
// the other, as kube-scheduler's one scheduling loop does.
func benchmarkFilter(b *testing.B, te *testExtender, bodies [][]byte) {
	srv := httptest.NewServer(te.handler)
	b.Cleanup(srv.Close)
	b.ReportAllocs()
	b.SetBytes(int64(len(bodies[0])))
	b.ResetTimer()
	for i := range b.N {
		resp, err := srv.Client().Post(srv.URL+"/"+scheduler.VerbFilter, "application/json", bytes.NewReader(bodies[i]))
		if err != nil {
			b.Fatal(err)
		}
		var res extenderv1.ExtenderFilterResult
		err = json.NewDecoder(resp.Body).Decode(&res)
		_ = resp.Body.Close()
		if err != nil || res.Error != "" || res.NodeNames == nil {
			b.Fatalf("filter answered %+v (%v)", res, err)
		}
	}
}
