package deviceplugin

import (
	"fmt"
	"path"
	"path/filepath"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/inventory"
	"github.com/gpupool/gpupool/kube"
)

// MPS is where the host's MPS control daemon is, for containers to reach
// it; empty fields mount nothing.
type MPS struct {
	// PipeDir is the daemon's CUDA_MPS_PIPE_DIRECTORY on the host, mounted
	// at the same path in every container and named in its environment.
	PipeDir string
	// ShmDir is the host directory the daemon's shared memory lives in,
	// mounted as the container's /dev/shm: MPS clients share it with the
	// server.
	ShmDir string
}

// containerResponse is what a container holding lease l gets: the lease's
// environment (api.LeaseEnv: its GPUs' UUIDs in NVIDIA_VISIBLE_DEVICES,
// which NVIDIA's container runtime mounts, the GPUPOOL_* variables, MPS's
// limits for a fraction) and the host's MPS; on a node whose GPUs are
// simulated, the files in simulatedDeviceDir that stand for the lease's
// GPUs, each at kube.SimulatedDeviceDir/<UUID>. A UUID not of NVML's
// shapes is refused: the allocator checks them as servers register, but
// a server stored before that check, or a forged allocator answer, must
// not list other devices or mount a host path outside the directory.
func containerResponse(l api.Lease, mps MPS, simulatedDeviceDir string) (*pluginapi.ContainerAllocateResponse, error) {
	for i, g := range l.GPUs {
		if err := inventory.ValidateUUID(fmt.Sprintf("lease %s gpus[%d].uuid", l.ID, i), g.UUID); err != nil {
			return nil, status.Error(codes.FailedPrecondition, err.Error())
		}
	}
	r := &pluginapi.ContainerAllocateResponse{Envs: api.LeaseEnv(l.Core())}
	if simulatedDeviceDir != "" {
		for _, g := range l.GPUs {
			// ValidateUUID leaves no ".." element; this says so again
			// where a host path is made.
			if !filepath.IsLocal(g.UUID) {
				return nil, status.Errorf(codes.FailedPrecondition, "lease %s: GPU UUID %q would leave %s", l.ID, g.UUID, simulatedDeviceDir)
			}
			r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: path.Join(kube.SimulatedDeviceDir, g.UUID),
				HostPath: filepath.Join(simulatedDeviceDir, g.UUID), ReadOnly: true})
		}
	}
	if mps.PipeDir != "" {
		r.Envs["CUDA_MPS_PIPE_DIRECTORY"] = mps.PipeDir
		r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: mps.PipeDir, HostPath: mps.PipeDir})
	}
	if mps.ShmDir != "" {
		r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: "/dev/shm", HostPath: mps.ShmDir})
	}
	return r, nil
}

// preferred are the devices the kubelet should give a container whose
// lease holds gpus: size of the available ones, those of mustInclude
// first, then spread evenly over the lease's GPUs. The kubelet then
// records (in its checkpoint and pod-resources API) the GPUs the
// container uses rather than any that were free. Fewer than size when
// the lease's GPUs have too few free devices (a gpu-memory lease counts
// differently in the pool and in the quota): the kubelet takes the rest
// where it likes.
func preferred(gpus, available, mustInclude []string, size int) []string {
	chosen := slices.Clone(mustInclude)
	free := map[string][]string{}
	for _, id := range slices.Sorted(slices.Values(available)) {
		if g := gpuOf(id); slices.Contains(gpus, g) && !slices.Contains(mustInclude, id) {
			free[g] = append(free[g], id)
		}
	}
	for progressed := true; progressed && len(chosen) < size; {
		progressed = false
		for _, g := range gpus {
			if len(chosen) < size && len(free[g]) > 0 {
				chosen, free[g], progressed = append(chosen, free[g][0]), free[g][1:], true
			}
		}
	}
	return chosen
}
