package inventory

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/gpupool/gpupool/internal/fielderr"
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
}

// The webhook shows a bad gpupool.io/topology by the error's limit, and
// the allocator answers 400 to a FieldError.
func TestParseLinkNamesFieldValueAndLimit(t *testing.T) {
	_, err := ParseLink("request.topology", "nvswitch")
	var fe *fielderr.Error
	if !errors.As(err, &fe) || err.Error() != "request.topology nvswitch is not one of any, socket, pcie-switch, nvlink" {
		t.Errorf("ParseLink(nvswitch) = %v", err)
	}
	var l Link
	if err := json.Unmarshal([]byte(`"nvswitch"`), &l); !errors.As(err, &fe) || fe.Field != "link" {
		t.Errorf("reading link nvswitch: %v", err)
	}
}

func TestLinkOfIsTheWorstPair(t *testing.T) {
	s := Server{Name: "gpu-1"}
	for i := range 8 {
		s.GPUs = append(s.GPUs, GPU{Index: i, Model: "L40S", Healthy: true})
	}
	for _, tc := range []struct {
		gpus []int
		want Link
	}{{nil, LinkNVLink}, {[]int{3}, LinkNVLink}, {[]int{0, 1}, LinkAny}} {
		if got := s.LinkOf(tc.gpus); got != tc.want {
			t.Errorf("without links, LinkOf(%v) = %s, want %s", tc.gpus, got, tc.want)
		}
	}
	s.SetTopology(PCIeTopology(8, 2, 2))
	for _, tc := range []struct {
		gpus []int
		want Link
	}{{[]int{0, 1}, LinkPCIeSwitch}, {[]int{0, 1, 2}, LinkSocket}, {[]int{0, 1, 4}, LinkAny}, {[]int{6, 7}, LinkPCIeSwitch}} {
		if got := s.LinkOf(tc.gpus); got != tc.want {
			t.Errorf("pcie: LinkOf(%v) = %s, want %s", tc.gpus, got, tc.want)
		}
	}
}
