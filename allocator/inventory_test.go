package allocator

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

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
			s.GPUs = append(s.GPUs, inventory.GPU{Index: i, UUID: "GPU-" + strconv.Itoa(i), Model: "H100", Healthy: true})
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

// TestRegisterRefusesForgedGPUNames: what a probe registered with the
// servers' token, each refused naming the field; a stored server is not
// checked again (RestoreServer), so an upgraded allocator still starts.
func TestRegisterRefusesForgedGPUNames(t *testing.T) {
	server := func(uuid, model string) inventory.Server {
		return inventory.Server{Name: "gpu-1", GPUs: []inventory.GPU{
			{Index: 0, UUID: "GPU-7c682f66-8b92-d30a-5893-1f2ad346d947", Model: "H100", Healthy: true},
			{Index: 1, UUID: uuid, Model: model, Healthy: true}}}
	}
	for _, tc := range []struct {
		uuid, model, field string
	}{
		{"GPU-a\x00", "H100", "server.gpus[1].uuid"},
		{"GPU-a\nGPU-b", "H100", "server.gpus[1].uuid"},
		{"GPU-\x1b[31m", "H100", "server.gpus[1].uuid"},
		{"GPU-\u202ea", "H100", "server.gpus[1].uuid"},
		{"GPU-<img src=x onerror=alert(1)>", "H100", "server.gpus[1].uuid"},
		{"../..", "H100", "server.gpus[1].uuid"},
		{"GPU-a,GPU-7c682f66-8b92-d30a-5893-1f2ad346d947", "H100", "server.gpus[1].uuid"},
		{"GPU-7c682f66-8b92-d30a-5893-1f2ad346d947", "H100", "server.gpus[1].uuid"}, // gpus[0]'s
		{"GPU-b", "H100\x00", "server.gpus[1].model"},
		{"GPU-b", "H100\r\nforged", "server.gpus[1].model"},
		{"GPU-b", "\x1b[2JH100", "server.gpus[1].model"},
		{"GPU-b", "H\u202e001", "server.gpus[1].model"},
	} {
		s := server(tc.uuid, tc.model)
		p, err := NewPool(PoolConfig{Policy: newBestFit(PolicyOptions{}), DefaultTTL: time.Minute, MaxTTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		err = p.RegisterServer(s)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("RegisterServer(uuid %q, model %q) = %v; want a refusal of %s", tc.uuid, tc.model, err, tc.field)
		}
		if err := p.RestoreServer(s); err != nil {
			t.Errorf("RestoreServer(uuid %q, model %q) = %v; a stored server is restored as it was", tc.uuid, tc.model, err)
		}
	}
}
