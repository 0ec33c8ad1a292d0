package simulate

import "github.com/gpupool/gpupool/inventory"

// SimulatedTopology is the links the replay gives a server of the OpenB
// cluster, whose node list names only the GPU model and count. V100s come
// as SXM2 boards there: the 8-GPU ones are taken as one NVSwitch fabric
// and the 4-GPU ones as fully NVLinked (a DGX-1's hybrid cube-mesh would
// be closer for 8; an HGX fabric is what newer SXM servers have). Every
// other model (T4, P100, A10 and the anonymised G2 and G3) is a PCIe card:
// two GPUs behind each PCIe switch, two switches on each CPU socket.
func SimulatedTopology(s *inventory.Server) inventory.Topology {
	n := len(s.GPUs)
	if n > 0 && (s.GPUs[0].Model == "V100M16" || s.GPUs[0].Model == "V100M32") {
		return inventory.NVSwitchTopology(n)
	}
	return inventory.PCIeTopology(n, 2, 2)
}

// SetSimulatedTopologies gives every server its SimulatedTopology, so that
// placement sees the links.
func SetSimulatedTopologies(servers []inventory.Server) {
	for i := range servers {
		servers[i].SetTopology(SimulatedTopology(&servers[i]))
	}
}
