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
