package node

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdi "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/kube/dra"
	"github.com/gpupool/gpupool/kube/gpuaccess"
)

// leases are the allocator's leases, by pod.
type leases map[types.UID][]api.Lease

func (l leases) PodLeases(_ context.Context, _ string, pod types.UID) ([]api.Lease, error) {
	if l == nil {
		return nil, errors.New("the allocator does not answer")
	}
	return l[pod], nil
}

var lease = api.Lease{ID: "lease-000001", Namespace: "ml", Server: "gpu-0",
	GPUs: []api.LeaseGPU{{Index: 1, UUID: "GPU-0b1c2d3e-0000-1111-2222-333344445555", Percent: 10, MemoryBytes: 8 << 30}}}

// claim is ml/notebook, allocated a, reserved for pod uid-notebook.
func claim(a *resourceapi.AllocationResult) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "notebook", Namespace: "ml", UID: "claim-1"},
		Status: resourceapi.ResourceClaimStatus{Allocation: a,
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "notebook", UID: "uid-notebook"}}}}
}

// TestPrepareWritesTheLeasesAccess: a claim the pool allocated gets a CDI
// spec of one device that gives its containers what the lease gives (the
// device plugin's environment, MPS's limits, the host's MPS), and its
// devices name that CDI device; unpreparing removes the spec, and again
// is no error.
func TestPrepareWritesTheLeasesAccess(t *testing.T) {
	d := &Driver{Node: "gpu-0", Leases: leases{"uid-notebook": {lease}}, CDIDir: t.TempDir(),
		Access: gpuaccess.Node{MPS: gpuaccess.MPS{PipeDir: "/run/nvidia/mps/pipe"}}}
	c := claim(dra.Allocation("gpu", lease))
	results, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil || results[c.UID].Err != nil {
		t.Fatalf("prepare: %v, %v", err, results[c.UID].Err)
	}
	devices := results[c.UID].Devices
	if len(devices) != 1 || devices[0].PoolName != "gpu-0" || devices[0].DeviceName != "gpu-1" || !slices.Equal(devices[0].Requests, []string{"gpu"}) ||
		!slices.Equal(devices[0].CDIDeviceIDs, []string{"gpu.gpupool.io/claim=claim-1"}) || devices[0].ShareID == nil {
		t.Errorf("devices %+v", devices)
	}
	raw, err := os.ReadFile(filepath.Join(d.CDIDir, "gpu.gpupool.io-claim-1.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec cdi.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	access, _ := gpuaccess.For(lease, d.Access)
	if spec.Kind != CDIKind || len(spec.Devices) != 1 || spec.Devices[0].Name != "claim-1" || len(spec.Devices[0].ContainerEdits.Env) != len(access.Env) ||
		!slices.Contains(spec.Devices[0].ContainerEdits.Env, "CUDA_VISIBLE_DEVICES="+lease.GPUs[0].UUID) || !slices.Contains(spec.Devices[0].ContainerEdits.Env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10") ||
		len(spec.Devices[0].ContainerEdits.Mounts) != 1 || spec.Devices[0].ContainerEdits.Mounts[0].HostPath != "/run/nvidia/mps/pipe" {
		t.Errorf("spec %s", raw)
	}
	for range 2 {
		errs, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: c.UID}})
		if err != nil || errs[c.UID] != nil {
			t.Fatalf("unprepare: %v, %v", err, errs[c.UID])
		}
	}
	if left, _ := os.ReadDir(d.CDIDir); len(left) != 0 {
		t.Errorf("after unprepare the CDI directory holds %v", left)
	}
}

// TestPrepareRefuses: an allocation the pool did not write (no lease of
// the pod names it), a lease of another node, an unallocated claim and one
// reserved for no pod get nothing; an allocator that does not answer is
// worth a retry.
func TestPrepareRefuses(t *testing.T) {
	forged := claim(dra.Allocation("gpu", api.Lease{ID: "forged", Server: "gpu-0", GPUs: []api.LeaseGPU{{Index: 3, MemoryBytes: 80 << 30}}}))
	unreserved := claim(dra.Allocation("gpu", lease))
	unreserved.Status.ReservedFor = nil
	for _, tc := range []struct {
		name   string
		node   string
		leases leases
		claim  *resourceapi.ResourceClaim
		want   string
	}{
		{"a forged allocation", "gpu-0", leases{"uid-notebook": {lease}}, forged, "status.allocation names no lease the pool holds for its pod uid-notebook"},
		{"another node's lease", "gpu-9", leases{"uid-notebook": {lease}}, claim(dra.Allocation("gpu", lease)), "its lease lease-000001 is on gpu-0, not on this node gpu-9"},
		{"not allocated", "gpu-0", leases{}, claim(nil), "ResourceClaim ml/notebook is not allocated"},
		{"no pod", "gpu-0", leases{}, unreserved, "reserved for no pod"},
		{"the allocator down", "gpu-0", nil, claim(dra.Allocation("gpu", lease)), kubeletplugin.ErrRecoverable.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &Driver{Node: tc.node, Leases: tc.leases, CDIDir: t.TempDir()}
			results, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{tc.claim})
			got := results[tc.claim.UID]
			if err != nil || got.Err == nil || !strings.Contains(got.Err.Error(), tc.want) || len(got.Devices) > 0 {
				t.Errorf("prepare: %+v, %v; want it refused with %q", got, err, tc.want)
			}
			if left, _ := os.ReadDir(d.CDIDir); len(left) != 0 {
				t.Errorf("a refused claim left %v", left)
			}
		})
	}
}
