package allocator

import (
	"fmt"
	"strconv"
	"strings"
)

// Link is how directly two GPUs of one server reach each other, from the
// farthest to the closest, so that a larger Link is a better one. The
// levels follow what NVML tells apart (nvmlDeviceGetTopologyCommonAncestor
// and the NVLink state), folded to what a placement can promise.
type Link uint8

const (
	// LinkAny is across CPU sockets (NVML's SYSTEM), or not known.
	LinkAny Link = iota
	// LinkSocket is through the host bridge of one CPU socket (NVML's
	// NODE and HOSTBRIDGE).
	LinkSocket
	// LinkPCIeSwitch is behind one PCIe switch or a tree of them (NVML's
	// SINGLE and MULTIPLE), without the host bridge.
	LinkPCIeSwitch
	// LinkNVLink is NVLink, direct or through an NVSwitch.
	LinkNVLink
)

// linkNames are the links as the API, the CLI and the Kubernetes
// annotation spell them.
var linkNames = [...]string{LinkAny: "any", LinkSocket: "socket", LinkPCIeSwitch: "pcie-switch", LinkNVLink: "nvlink"}

func (l Link) String() string {
	if int(l) < len(linkNames) {
		return linkNames[l]
	}
	return "link(" + strconv.Itoa(int(l)) + ")"
}

// ParseLink reads a link by its name; field names the value in the error.
func ParseLink(field, s string) (Link, error) {
	for l, name := range linkNames {
		if s == name {
			return Link(l), nil
		}
	}
	return 0, notALink(field, shorten(s))
}

func notALink(field, value string) *FieldError {
	return &FieldError{field, value, "is not one of " + strings.Join(linkNames[:], ", ")}
}

// MarshalText writes the link's name, so that it reads as such in JSON.
func (l Link) MarshalText() ([]byte, error) {
	if int(l) >= len(linkNames) {
		return nil, fmt.Errorf("unknown link %d", l)
	}
	return []byte(l.String()), nil
}

// UnmarshalText reads a link's name.
func (l *Link) UnmarshalText(b []byte) error {
	v, err := ParseLink("link", string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// Topology is a server's links, Topology[i][j] between its GPUs i and j.
type Topology [][]Link

// NVSwitchTopology is n GPUs on one NVSwitch fabric, as in an 8-GPU HGX
// H100: every pair is NVLink.
func NVSwitchTopology(n int) Topology {
	return buildTopology(n, func(i, j int) Link { return LinkNVLink })
}

// PCIeTopology is n GPUs with no NVLink, perSwitch of them behind each
// PCIe switch and switchesPerSocket switches on each CPU socket, numbered
// in that order, as in a 2-socket PCIe server with 2 GPUs per switch.
func PCIeTopology(n, perSwitch, switchesPerSocket int) Topology {
	return buildTopology(n, func(i, j int) Link {
		switch {
		case i/perSwitch == j/perSwitch:
			return LinkPCIeSwitch
		case i/(perSwitch*switchesPerSocket) == j/(perSwitch*switchesPerSocket):
			return LinkSocket
		}
		return LinkAny
	})
}

func buildTopology(n int, link func(i, j int) Link) Topology {
	t := make(Topology, n)
	for i := range t {
		t[i] = make([]Link, n)
		for j := range t[i] {
			t[i][j] = LinkNVLink
			if i != j {
				t[i][j] = link(i, j)
			}
		}
	}
	return t
}

// LinkOf is the link every pair of the given GPUs of s has: the worst of
// their links; LinkNVLink for fewer than two GPUs, as a GPU's link to
// itself.
func (s *Server) LinkOf(gpus []int) Link {
	worst := LinkNVLink
	for _, i := range gpus {
		for _, j := range gpus {
			worst = min(worst, linkBetween(s.GPUs, i, j))
		}
	}
	return worst
}

// SetTopology gives s's GPUs their links; t must have a row per GPU.
func (s *Server) SetTopology(t Topology) {
	for i := range s.GPUs {
		s.GPUs[i].Links = t[i]
	}
}
