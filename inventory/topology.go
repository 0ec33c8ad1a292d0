package inventory

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
