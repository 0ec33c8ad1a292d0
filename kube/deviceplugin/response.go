package deviceplugin

import (
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/kube/gpuaccess"
)

// containerResponse is what a container holding lease l gets on the
// node (gpuaccess.For), in the device plugin API's words; a lease it
// refuses is FailedPrecondition.
func containerResponse(l api.Lease, node gpuaccess.Node) (*pluginapi.ContainerAllocateResponse, error) {
	a, err := gpuaccess.For(l, node)
	if err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	r := &pluginapi.ContainerAllocateResponse{Envs: a.Env}
	for _, m := range a.Mounts {
		r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly})
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
