package allocator

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestLinkRoundTripsByName(t *testing.T) {
	for l := LinkAny; l <= LinkNVLink; l++ {
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		var back Link
		if err := json.Unmarshal(b, &back); err != nil || back != l {
			t.Errorf("%s: marshalled %s, read back %v (%v)", l, b, back, err)
		}
	}
	if _, err := ParseLink("request.topology", "nvswitch"); err == nil || !strings.Contains(err.Error(), "request.topology nvswitch is not one of any, socket, pcie-switch, nvlink") {
		t.Errorf("ParseLink(nvswitch) = %v", err)
	}
}

func TestServerLinksMustBeSymmetric(t *testing.T) {
	gpu := func(i int, links ...Link) GPU {
		return GPU{Index: i, UUID: "GPU-" + string(rune('a'+i)), Model: "H100", Healthy: true, Links: links}
	}
	for _, tc := range []struct {
		name string
		gpus []GPU
		err  string
	}{
		{"none", []GPU{gpu(0), gpu(1)}, ""},
		{"nvlink pair", []GPU{gpu(0, LinkNVLink, LinkNVLink), gpu(1, LinkNVLink, LinkNVLink)}, ""},
		{"one side only", []GPU{gpu(0, LinkNVLink, LinkNVLink), gpu(1)}, "server.gpus[0].links[1] nvlink differs from what gpus[1] says of this GPU"},
		{"asymmetric", []GPU{gpu(0, LinkNVLink, LinkSocket), gpu(1, LinkAny, LinkNVLink)}, "server.gpus[0].links[1] socket differs"},
		{"short row", []GPU{gpu(0, LinkNVLink), gpu(1, LinkNVLink)}, "server.gpus[0].links 1 links must be empty or one per GPU (2)"},
		{"unknown level", []GPU{gpu(0, LinkNVLink, 9), gpu(1, 9, LinkNVLink)}, "is not a known link"},
	} {
		s := Server{Name: "gpu-1", GPUs: tc.gpus}
		err := s.validate()
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
		topo Topology
		// want[i][j] for a few pairs
		pairs map[[2]int]Link
	}{
		"nvswitch": {NVSwitchTopology(8), map[[2]int]Link{{0, 7}: LinkNVLink, {3, 4}: LinkNVLink}},
		"pcie 2 per switch, 2 switches per socket": {PCIeTopology(8, 2, 2), map[[2]int]Link{
			{0, 1}: LinkPCIeSwitch, {0, 2}: LinkSocket, {1, 3}: LinkSocket, {0, 4}: LinkAny, {6, 7}: LinkPCIeSwitch, {5, 6}: LinkSocket, {2, 2}: LinkNVLink,
		}},
	} {
		s := Server{Name: "gpu-1"}
		for i := range tc.topo {
			s.GPUs = append(s.GPUs, GPU{Index: i, Model: "H100", Healthy: true})
		}
		s.SetTopology(tc.topo)
		if err := s.validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		for p, want := range tc.pairs {
			if got := s.GPUs[p[0]].Links[p[1]]; got != want {
				t.Errorf("%s: link %d-%d is %s, want %s", name, p[0], p[1], got, want)
			}
		}
	}
}
