package gpuaccess

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/allocator/api"
)

// TestFor: the host's MPS and the files of simulated GPUs reach the
// container when the node says where they are, and nothing is mounted
// otherwise.
func TestFor(t *testing.T) {
	l := api.Lease{ID: "lease-000001", Server: "node-1", GPUs: []api.LeaseGPU{{UUID: "GPU-a", Percent: 50, MemoryBytes: 40 << 30}}}
	bare := mustFor(t, l, Node{})
	if len(bare.Mounts) != 0 || bare.Env["CUDA_MPS_PIPE_DIRECTORY"] != "" || !maps.Equal(bare.Env, api.LeaseEnv(l.Core())) {
		t.Errorf("without MPS: %v, mounts %v; want the lease's environment alone", bare.Env, bare.Mounts)
	}
	a := mustFor(t, l, Node{MPS: MPS{PipeDir: "/run/nvidia/mps/pipe", ShmDir: "/run/nvidia/mps/shm"}})
	want := []Mount{{ContainerPath: "/run/nvidia/mps/pipe", HostPath: "/run/nvidia/mps/pipe"}, {ContainerPath: "/dev/shm", HostPath: "/run/nvidia/mps/shm"}}
	if a.Env["CUDA_MPS_PIPE_DIRECTORY"] != "/run/nvidia/mps/pipe" || a.Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "50" || !slices.Equal(a.Mounts, want) {
		t.Errorf("with MPS: %v, mounts %v", a.Env, a.Mounts)
	}
	simulated := mustFor(t, l, Node{SimulatedDeviceDir: "/var/lib/gpupool/devices"})
	want = []Mount{{ContainerPath: "/dev/gpupool/GPU-a", HostPath: "/var/lib/gpupool/devices/GPU-a", ReadOnly: true}}
	if !slices.Equal(simulated.Mounts, want) {
		t.Errorf("simulated GPUs: mounts %v", simulated.Mounts)
	}
}

func mustFor(t *testing.T, l api.Lease, n Node) Access {
	t.Helper()
	a, err := For(l, n)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestForRefusesForgedUUIDs: a lease whose GPU UUID is not of NVML's
// shapes (a server stored before the allocator checked them, a forged
// answer) gets nothing: no host path outside the simulated devices'
// directory, no other devices in NVIDIA_VISIBLE_DEVICES.
func TestForRefusesForgedUUIDs(t *testing.T) {
	for _, uuid := range []string{"../..", "GPU-a/../../../etc", "MIG-GPU-a/../../etc", "GPU-a,GPU-b", "GPU-a\n", ""} {
		l := api.Lease{ID: "lease-000001", Server: "node-1", GPUs: []api.LeaseGPU{{UUID: uuid, Percent: 100}}}
		for _, dir := range []string{"", "/var/lib/gpupool/devices"} {
			if a, err := For(l, Node{SimulatedDeviceDir: dir}); err == nil || !strings.Contains(err.Error(), "gpus[0].uuid") {
				t.Errorf("UUID %q, dir %q: %+v, %v; want it refused naming the field", uuid, dir, a, err)
			}
		}
	}
}
