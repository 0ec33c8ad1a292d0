package deviceplugin

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/gpuaccess"
)

// TestDevices: a GPU is a hundred devices in percent, one in gpus, and as
// many as whole slices of its memory in a unit of memory, unhealthy when
// the daemon says so or the server has gone silent.
func TestDevices(t *testing.T) {
	server := api.ServerStatus{Name: "gpu-0", Schedulable: true, GPUs: []api.GPUStatus{
		{Index: 0, UUID: "GPU-a", Healthy: true, MemoryBytes: 80 << 30}, {Index: 1, UUID: "GPU-b", Healthy: false, MemoryBytes: 80 << 30}}}
	silent := server
	silent.Schedulable = false
	for _, tc := range []struct {
		name      string
		unit      kube.Unit
		server    api.ServerStatus
		ids       []string // the first and last devices of each GPU
		healthy   map[string]bool
		count     int
		healthyOf int
	}{
		{"percent", kube.UnitPercent, server, []string{"GPU-a::0", "GPU-a::99", "GPU-b::0", "GPU-b::99"},
			map[string]bool{"GPU-a": true, "GPU-b": false}, 200, 100},
		{"gpus", kube.UnitGPUs, server, []string{"GPU-a", "GPU-a", "GPU-b", "GPU-b"},
			map[string]bool{"GPU-a": true, "GPU-b": false}, 2, 1},
		{"8Gi slices of 80Gi", kube.MemoryUnit(8 << 30), server, []string{"GPU-a::0", "GPU-a::9", "GPU-b::0", "GPU-b::9"},
			map[string]bool{"GPU-a": true, "GPU-b": false}, 20, 10},
		{"silent server", kube.UnitPercent, silent, []string{"GPU-a::0", "GPU-a::99", "GPU-b::0", "GPU-b::99"},
			map[string]bool{"GPU-a": false, "GPU-b": false}, 200, 0},
	} {
		devices := Devices(tc.unit, tc.server)
		per := len(devices) / 2
		ends := []string{devices[0].ID, devices[per-1].ID, devices[per].ID, devices[len(devices)-1].ID}
		if len(devices) != tc.count || !slices.Equal(ends, tc.ids) {
			t.Errorf("%s: %d devices, first and last of each GPU %q; want %d, %q", tc.name, len(devices), ends, tc.count, tc.ids)
		}
		healthy := 0
		for _, d := range devices {
			if want := tc.healthy[gpuOf(d.ID)]; (d.Health == pluginapi.Healthy) != want {
				t.Errorf("%s: device %s is %s, want healthy %v", tc.name, d.ID, d.Health, want)
			}
			if d.Health == pluginapi.Healthy {
				healthy++
			}
		}
		if healthy != tc.healthyOf {
			t.Errorf("%s: %d healthy devices, want %d", tc.name, healthy, tc.healthyOf)
		}
	}
}

// waitingPod is a pod bound to node-1 with a lease, asking n devices in
// its second container.
func waitingPod(name string, n int64, created int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", CreationTimestamp: metav1.NewTime(time.Unix(int64(created), 0)),
			Annotations: map[string]string{kube.AnnotationLease: "lease-" + name}},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "sidecar"}, {Name: "main",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{kube.ResourceGPU: *resource.NewQuantity(n, resource.DecimalSI)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
}

// TestNext: the pod the kubelet allocates for is the first bound of those
// asking as many devices; those bound when the kubelet started, by
// creation.
func TestNext(t *testing.T) {
	a, b, c, d := waitingPod("a", 50, 4), waitingPod("b", 50, 3), waitingPod("c", 100, 1), waitingPod("d", 50, 2)
	for _, tc := range []struct {
		name    string
		waiting []waiting
		size    int
		want    string
	}{
		{"bound first", []waiting{{b, 2}, {a, 1}, {c, 3}}, 50, "a"},
		{"as many devices", []waiting{{b, 2}, {a, 1}, {c, 3}}, 100, "c"},
		{"at the kubelet's start, by creation", []waiting{{a, 0}, {b, 0}, {d, 1}}, 50, "b"},
		{"none asks as many", []waiting{{a, 1}, {c, 2}}, 25, ""},
	} {
		got, ok := next(tc.waiting, tc.size)
		if name := ""; ok != (tc.want != "") || ok && got.Name != tc.want {
			if ok {
				name = got.Name
			}
			t.Errorf("%s: %q, want %q", tc.name, name, tc.want)
		}
	}
}

// TestAwaitsDevices: only a pod bound to the node with a lease, neither
// allocated nor ended, is one the kubelet may allocate for.
func TestAwaitsDevices(t *testing.T) {
	for name, change := range map[string]func(*corev1.Pod){
		"elsewhere":   func(p *corev1.Pod) { p.Spec.NodeName = "node-2" },
		"no lease":    func(p *corev1.Pod) { delete(p.Annotations, kube.AnnotationLease) },
		"allocated":   func(p *corev1.Pod) { p.Annotations[kube.AnnotationAllocated] = "0123456789abcdef" },
		"rejected":    func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed },
		"ended":       func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded },
		"not waiting": nil,
	} {
		pod := waitingPod("a", 50, 1)
		if change != nil {
			change(pod)
		}
		if got := awaitsDevices(pod, "node-1"); got != (change == nil) {
			t.Errorf("%s: awaits devices %v", name, got)
		}
	}
}

// percentDevices are devices from..to-1 of each GPU, in percent.
func percentDevices(from, to int, gpus ...string) []string {
	var ids []string
	for _, g := range gpus {
		for n := from; n < to; n++ {
			ids = append(ids, fmt.Sprintf("%s::%d", g, n))
		}
	}
	return ids
}

// TestPreferred: the kubelet is steered to the lease's GPUs, evenly, with
// the devices it must include; short when they have too few free.
func TestPreferred(t *testing.T) {
	available := slices.Concat(percentDevices(0, 100, "GPU-a"), percentDevices(40, 100, "GPU-b", "GPU-c"))
	perGPU := func(ids []string) map[string]int {
		n := map[string]int{}
		for _, id := range ids {
			n[gpuOf(id)]++
		}
		return n
	}
	for _, tc := range []struct {
		name        string
		gpus        []string
		mustInclude []string
		size        int
		want        map[string]int
	}{
		{"half of two GPUs", []string{"GPU-b", "GPU-c"}, nil, 100, map[string]int{"GPU-b": 50, "GPU-c": 50}},
		{"with a device it must include", []string{"GPU-c"}, []string{"GPU-a::7"}, 30, map[string]int{"GPU-a": 1, "GPU-c": 29}},
		{"more than is free", []string{"GPU-b"}, nil, 80, map[string]int{"GPU-b": 60}},
		{"whole GPUs", []string{"GPU-a"}, nil, 100, map[string]int{"GPU-a": 100}},
	} {
		got := preferred(tc.gpus, available, tc.mustInclude, tc.size)
		if !maps.Equal(perGPU(got), tc.want) || len(slices.Compact(slices.Sorted(slices.Values(got)))) != len(got) {
			t.Errorf("%s: %v devices per GPU (%d distinct of %d), want %v", tc.name, perGPU(got), len(slices.Compact(slices.Sorted(slices.Values(got)))), len(got), tc.want)
		}
		for _, id := range got {
			if !slices.Contains(available, id) && !slices.Contains(tc.mustInclude, id) {
				t.Errorf("%s: preferred %s, which is not available", tc.name, id)
			}
		}
	}
}

// TestContainerResponse: a container gets gpuaccess.For's environment and
// mounts, and a lease it refuses is FailedPrecondition naming the field.
func TestContainerResponse(t *testing.T) {
	l := api.Lease{ID: "lease-000001", Server: "node-1", GPUs: []api.LeaseGPU{{UUID: "GPU-a", Percent: 50, MemoryBytes: 40 << 30}}}
	node := gpuaccess.Node{MPS: gpuaccess.MPS{PipeDir: "/run/nvidia/mps/pipe", ShmDir: "/run/nvidia/mps/shm"}}
	r, err := containerResponse(l, node)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := gpuaccess.For(l, node)
	if !maps.Equal(r.Envs, want.Env) || len(r.Mounts) != 2 || r.Mounts[1].ContainerPath != "/dev/shm" || r.Mounts[1].HostPath != "/run/nvidia/mps/shm" {
		t.Errorf("response %v, mounts %v; want %+v", r.Envs, r.Mounts, want)
	}
	l.GPUs[0].UUID = "../.."
	if r, err := containerResponse(l, node); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "gpus[0].uuid") {
		t.Errorf("a forged UUID: response %v, %v; want FailedPrecondition naming the field", r, err)
	}
}
