package admission

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpupool/gpupool/kube"
)

// likelyGPUs is the most bitfusion.io/gpu that, in percent, probably
// meant whole GPUs (a GPU server holds up to 8), and the least that, in
// whole GPUs, probably meant a percent of one.
const likelyGPUs = 8

// Warnings are what kubectl shows whoever creates pod, beside its
// admission: a bare bitfusion.io/gpu that probably means another unit than
// the cluster's, such as the articles' bitfusion.io/gpu: 2 (two GPUs)
// under percent, where it is 2% of one GPU. The pod is admitted as asked:
// the number is valid either way, and only its author knows which was
// meant; in a unit of GPU memory, slices that add up to more than the
// cluster's GPU memory. BFK's gpu-amount with gpu-percent or gpu-memory
// says it in no unit at all, and gets no warning.
func (c Config) Warnings(pod *corev1.Pod) []string {
	if marked(pod) {
		return nil
	}
	gc, errs := findGPUContainer(pod)
	if gc == nil || len(errs) > 0 {
		return nil
	}
	gpu, direct := gc.asked[kube.ResourceGPU]
	if !direct {
		return nil
	}
	n := gpu.value
	switch {
	case c.Unit == kube.UnitPercent && n <= likelyGPUs:
		return []string{fmt.Sprintf("%s: %d is %d%% of one GPU: this cluster counts %s in percent (100 is one GPU); for %d whole GPUs ask %d, or %s: %d",
			gpu.path, n, n, kube.ResourceGPU, n, n*100, kube.ResourceGPUAmount, n)}
	case c.Unit == kube.UnitGPUs && n > likelyGPUs:
		return []string{fmt.Sprintf("%s: %d is %d whole GPUs on one server: this cluster counts %s in whole GPUs; for %d%% of one GPU ask %s: 1 and %s: %d",
			gpu.path, n, n, kube.ResourceGPU, n, kube.ResourceGPUAmount, kube.ResourceGPUPercent, n)}
	case c.Unit.MemoryBytes() > 0 && c.GPUMemoryBytes > 0 && n > c.GPUMemoryBytes/c.Unit.MemoryBytes():
		m := c.Unit.MemoryBytes()
		return []string{fmt.Sprintf("%s: %d is %s of one GPU's memory, more than this cluster's GPUs have (%s): this cluster counts %s in slices of %s; for whole GPUs ask %s",
			gpu.path, n, resource.NewQuantity(n*m, resource.BinarySI), resource.NewQuantity(c.GPUMemoryBytes, resource.DecimalSI), kube.ResourceGPU,
			resource.NewQuantity(m, resource.BinarySI), kube.ResourceGPUAmount)}
	}
	return nil
}
