package collector

import (
	"context"
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpupool/gpupool/inventory"
)

// nvmlServerFixture is a server's NVML answers: its GPUs, and the common
// PCIe ancestor of each pair by NVML's level names.
type nvmlServerFixture struct {
	GPUs           []nvmlFixture `json:"gpus"`
	CommonAncestor [][]string    `json:"commonAncestor"`
}

var topologyLevels = map[string]nvml.GpuTopologyLevel{
	"INTERNAL": nvml.TOPOLOGY_INTERNAL, "SINGLE": nvml.TOPOLOGY_SINGLE, "MULTIPLE": nvml.TOPOLOGY_MULTIPLE,
	"HOSTBRIDGE": nvml.TOPOLOGY_HOSTBRIDGE, "NODE": nvml.TOPOLOGY_NODE, "SYSTEM": nvml.TOPOLOGY_SYSTEM,
}

// mockServer is the devices of a server fixture, each answering the
// common ancestor of itself and another as the fixture says.
func mockServer(t *testing.T, path string) []*mock.Device {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f nvmlServerFixture
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	devices := make([]*mock.Device, len(f.GPUs))
	for i := range f.GPUs {
		devices[i] = mockDevice(t, &f.GPUs[i])
	}
	for i, d := range devices {
		d.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			j := slices.IndexFunc(devices, func(d *mock.Device) bool { return d == other })
			level, ok := topologyLevels[f.CommonAncestor[i][j]]
			if !ok {
				t.Fatalf("%s: GPUs %d and %d have no common ancestor %q", path, i, j, f.CommonAncestor[i][j])
			}
			return level, nvml.SUCCESS
		}
	}
	return devices
}

func openMockServer(t *testing.T, devices []*mock.Device) *NVML {
	t.Helper()
	var handles []nvml.Device
	for _, d := range devices {
		handles = append(handles, d)
	}
	src, err := NewNVML(mockLibrary(handles...))
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func inventoryLinks(inv inventory.Server) inventory.Topology {
	var out inventory.Topology
	for _, g := range inv.GPUs {
		out = append(out, g.Links)
	}
	return out
}

// pcieWithBridge is the PCIe server's topology with GPUs 0 and 1 joined by
// an NVLink bridge.
func pcieWithBridge() inventory.Topology {
	t := inventory.PCIeTopology(8, 2, 2)
	t[0][1], t[1][0] = inventory.LinkNVLink, inventory.LinkNVLink
	return t
}

// TestNVMLTopologyOfRecordedServers: the HGX H100's GPUs, all linked to
// the NVSwitches, are NVLink pairs whatever their PCIe path; the PCIe
// server's are PCIe switch, socket and across sockets, as placement's
// NVSwitchTopology and PCIeTopology shape them; a bridge links the two
// GPUs it joins, by their PCI addresses.
func TestNVMLTopologyOfRecordedServers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fixture string
		change  func([]*mock.Device)
		want    inventory.Topology
	}{
		{"HGX H100", "testdata/nvml-hgx-h100.json", nil, inventory.NVSwitchTopology(8)},
		{"PCIe L40S", "testdata/nvml-pcie-l40s.json", nil, inventory.PCIeTopology(8, 2, 2)},
		{"PCIe, GPUs 0 and 1 bridged, GPU 2 bridged to a GPU this source does not see", "testdata/nvml-pcie-l40s.json", func(d []*mock.Device) {
			bridge := func(dev *mock.Device, peer string) {
				dev.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
					if link > 0 {
						return nvml.FEATURE_DISABLED, nvml.SUCCESS
					}
					return nvml.FEATURE_ENABLED, nvml.SUCCESS
				}
				dev.GetNvLinkRemoteDeviceTypeFunc = func(int) (nvml.IntNvLinkDeviceType, nvml.Return) {
					return nvml.NVLINK_DEVICE_TYPE_GPU, nvml.SUCCESS
				}
				dev.GetNvLinkRemotePciInfoFunc = func(int) (nvml.PciInfo, nvml.Return) { return pciInfo(t, peer), nvml.SUCCESS }
			}
			bridge(d[0], "00000000:18:00.0")
			bridge(d[1], "00000000:16:00.0")
			bridge(d[2], "00000000:3B:00.0")
		}, pcieWithBridge()},
	} {
		devices := mockServer(t, tc.fixture)
		if tc.change != nil {
			tc.change(devices)
		}
		src := openMockServer(t, devices)
		if err := src.TopologyErr(); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		inv, err := src.Inventory("gpu-1")
		if err != nil {
			t.Fatal(err)
		}
		if got := inventoryLinks(inv); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: links\n%v\nwant\n%v", tc.name, got, tc.want)
		}
	}
}

// TestNVMLTopologyReadOnce: the links are read when the source opens, not
// on every round.
func TestNVMLTopologyReadOnce(t *testing.T) {
	devices := mockServer(t, "testdata/nvml-hgx-h100.json")
	src := openMockServer(t, devices)
	calls := func() int {
		n := 0
		for _, d := range devices {
			n += len(d.GetTopologyCommonAncestorCalls()) + len(d.GetNvLinkStateCalls()) + len(d.GetPciInfoCalls())
		}
		return n
	}
	opened := calls()
	for range 3 {
		inv, err := src.Inventory("gpu-1")
		if got := inventoryLinks(inv); err != nil || !reflect.DeepEqual(got, inventory.NVSwitchTopology(8)) {
			t.Fatalf("round's links = %v, %v", got, err)
		}
	}
	if opened == 0 || calls() != opened {
		t.Errorf("topology calls: %d when opened, %d after 3 rounds; want some, then no more", opened, calls())
	}
}

// TestNVMLTopologyFailureLeavesLinksUnknown: a failing topology call
// leaves every link unknown and says why, and the GPUs are read and
// register all the same.
func TestNVMLTopologyFailureLeavesLinksUnknown(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fixture string
		fail    func([]*mock.Device)
		err     string
	}{
		{"common ancestor", "testdata/nvml-pcie-l40s.json", func(d []*mock.Device) {
			d[2].GetTopologyCommonAncestorFunc = func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		}, "GPUs 2 and 3: NVML GetTopologyCommonAncestor: unknown error"},
		{"NVLink remote", "testdata/nvml-hgx-h100.json", func(d []*mock.Device) {
			d[5].GetNvLinkRemoteDeviceTypeFunc = func(int) (nvml.IntNvLinkDeviceType, nvml.Return) { return 0, nvml.ERROR_GPU_IS_LOST }
		}, "GPU 5 link 0: NVML GetNvLinkRemoteDeviceType: GPU is lost (fell off the bus)"},
		{"NVLink state", "testdata/nvml-hgx-h100.json", func(d []*mock.Device) {
			d[1].GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		}, "GPU 1 link 0: NVML GetNvLinkState: unknown error"},
		{"PCI address", "testdata/nvml-hgx-h100.json", func(d []*mock.Device) {
			d[0].GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, nvml.ERROR_NO_PERMISSION }
		}, "GPU 0: NVML GetPciInfo: no permission"},
	} {
		devices := mockServer(t, tc.fixture)
		tc.fail(devices)
		src := openMockServer(t, devices)
		if err := src.TopologyErr(); err == nil || err.Error() != tc.err {
			t.Errorf("%s: TopologyErr = %v, want %q", tc.name, err, tc.err)
		}
		r, err := src.Sample(context.Background(), false)
		if err != nil || len(r.GPUs) != 8 {
			t.Fatalf("%s: sample %d GPUs, %v", tc.name, len(r.GPUs), err)
		}
		for _, g := range r.GPUs {
			if g.Err != nil || !g.Healthy || g.Links != nil {
				t.Errorf("%s: GPU %d: err %v, healthy %v, links %v; want read, healthy, links unknown", tc.name, g.Index, g.Err, g.Healthy, g.Links)
			}
		}
		inv, err := src.Inventory("gpu-1")
		if err != nil || len(inv.GPUs) != 8 || slices.ContainsFunc(inv.GPUs, func(g inventory.GPU) bool { return g.Links != nil }) {
			t.Errorf("%s: inventory %+v, %v; want 8 GPUs without links", tc.name, inv.GPUs, err)
		}
	}
}

// TestInventoryLinksOfTheGPUsItKeeps: a GPU whose identity cannot be read
// is left out of the inventory, and so are the others' links to it.
func TestInventoryLinksOfTheGPUsItKeeps(t *testing.T) {
	devices := mockServer(t, "testdata/nvml-pcie-l40s.json")
	devices[3].GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
	inv, err := openMockServer(t, devices).Inventory("gpu-1")
	if err != nil {
		t.Fatal(err)
	}
	full := inventory.PCIeTopology(8, 2, 2)
	var want inventory.Topology
	for i, row := range full {
		if i != 3 {
			want = append(want, slices.Delete(slices.Clone(row), 3, 4))
		}
	}
	if got := inventoryLinks(inv); !reflect.DeepEqual(got, want) {
		t.Errorf("links without GPU 3:\n%v\nwant\n%v", got, want)
	}
	if inv.GPUs[3].UUID != "GPU-pcie-l40s-4" {
		t.Errorf("GPU 3 of the inventory is %s, want the reading's GPU 4", inv.GPUs[3].UUID)
	}
}
