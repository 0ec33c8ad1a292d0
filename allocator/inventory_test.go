package allocator

import (
	"strings"
	"testing"

	"github.com/gpupool/gpupool/inventory"
)

func TestServerLinksMustBeSymmetric(t *testing.T) {
	gpu := func(i int, links ...inventory.Link) inventory.GPU {
		return inventory.GPU{Index: i, UUID: "GPU-" + string(rune('a'+i)), Model: "H100", Healthy: true, Links: links}
	}
	for _, tc := range []struct {
		name string
		gpus []inventory.GPU
		err  string
	}{
		{"none", []inventory.GPU{gpu(0), gpu(1)}, ""},
		{"nvlink pair", []inventory.GPU{gpu(0, inventory.LinkNVLink, inventory.LinkNVLink), gpu(1, inventory.LinkNVLink, inventory.LinkNVLink)}, ""},
		{"one side only", []inventory.GPU{gpu(0, inventory.LinkNVLink, inventory.LinkNVLink), gpu(1)}, "server.gpus[0].links[1] nvlink differs from what gpus[1] says of this GPU"},
		{"asymmetric", []inventory.GPU{gpu(0, inventory.LinkNVLink, inventory.LinkSocket), gpu(1, inventory.LinkAny, inventory.LinkNVLink)}, "server.gpus[0].links[1] socket differs"},
		{"short row", []inventory.GPU{gpu(0, inventory.LinkNVLink), gpu(1, inventory.LinkNVLink)}, "server.gpus[0].links 1 links must be empty or one per GPU (2)"},
		{"unknown level", []inventory.GPU{gpu(0, inventory.LinkNVLink, 9), gpu(1, 9, inventory.LinkNVLink)}, "is not a known link"},
	} {
		s := inventory.Server{Name: "gpu-1", GPUs: tc.gpus}
		err := validateServer(&s)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.err)
		}
	}
}

func TestTopologyShapesAreValid(t *testing.T) {
	for name, tc := range map[string]struct {
		topo inventory.Topology
		// want[i][j] for a few pairs
		pairs map[[2]int]inventory.Link
	}{
		"nvswitch": {inventory.NVSwitchTopology(8), map[[2]int]inventory.Link{{0, 7}: inventory.LinkNVLink, {3, 4}: inventory.LinkNVLink}},
		"pcie 2 per switch, 2 switches per socket": {inventory.PCIeTopology(8, 2, 2), map[[2]int]inventory.Link{
			{0, 1}: inventory.LinkPCIeSwitch, {0, 2}: inventory.LinkSocket, {1, 3}: inventory.LinkSocket, {0, 4}: inventory.LinkAny, {6, 7}: inventory.LinkPCIeSwitch, {5, 6}: inventory.LinkSocket, {2, 2}: inventory.LinkNVLink,
		}},
	} {
		s := inventory.Server{Name: "gpu-1"}
		for i := range tc.topo {
			s.GPUs = append(s.GPUs, inventory.GPU{Index: i, Model: "H100", Healthy: true})
		}
		s.SetTopology(tc.topo)
		if err := validateServer(&s); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		for p, want := range tc.pairs {
			if got := s.GPUs[p[0]].Links[p[1]]; got != want {
				t.Errorf("%s: link %d-%d is %s, want %s", name, p[0], p[1], got, want)
			}
		}
	}
}
