package collector

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpupool/gpupool/inventory"
)

// readTopology reads how each pair of devices is linked: NVLink when an
// active NVLink joins them, else the PCIe path's common ancestor. The
// links are wired into the host and do not change while the driver runs,
// so the source reads them once, when it opens its devices. A failed call
// leaves the whole topology unknown (nil) and says why: the allocator
// takes a link for every pair or none.
func readTopology(devices []nvml.Device) (inventory.Topology, error) {
	topo := make(inventory.Topology, len(devices))
	for i := range topo {
		topo[i] = make([]inventory.Link, len(devices))
		topo[i][i] = inventory.LinkNVLink
	}
	if len(devices) < 2 {
		return topo, nil // no pair to ask about
	}
	nvlinked, err := readNVLinks(devices)
	if err != nil {
		return nil, err
	}
	for i := range devices {
		for j := i + 1; j < len(devices); j++ {
			level, ret := devices[i].GetTopologyCommonAncestor(devices[j])
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("GPUs %d and %d: %w", i, j, nvmlError("GetTopologyCommonAncestor", ret))
			}
			link := pcieLink(level)
			if nvlinked[i][j] {
				link = inventory.LinkNVLink
			}
			topo[i][j], topo[j][i] = link, link
		}
	}
	return topo, nil
}

// pcieLink folds NVML's common PCIe ancestor of two GPUs into a Link, as
// inventory.Link's levels say.
func pcieLink(level nvml.GpuTopologyLevel) inventory.Link {
	switch level {
	case nvml.TOPOLOGY_INTERNAL, nvml.TOPOLOGY_SINGLE, nvml.TOPOLOGY_MULTIPLE:
		return inventory.LinkPCIeSwitch
	case nvml.TOPOLOGY_HOSTBRIDGE, nvml.TOPOLOGY_NODE:
		return inventory.LinkSocket
	}
	return inventory.LinkAny
}

// pciAddress is where a device sits on the PCI bus (GPUs are function 0).
type pciAddress struct{ domain, bus, device uint32 }

func addressOf(p nvml.PciInfo) pciAddress { return pciAddress{p.Domain, p.Bus, p.Device} }

// readNVLinks says, for each pair of devices, whether an active NVLink
// joins them, directly or through NVSwitches.
//
// A direct link (a DGX-1's hybrid cube mesh, a bridge between two PCIe
// cards) ends at the peer: the link's remote PCI address is the peer GPU's.
// On an HGX board every link of every GPU ends at an NVSwitch instead, and
// its remote PCI address is the switch's, which names no GPU; NVML tells
// the two apart by the remote device type (nvmlDeviceGetNvLinkRemoteDeviceType
// answers NVML_NVLINK_DEVICE_TYPE_SWITCH; `nvidia-smi nvlink -R` shows the
// same). The switches of a host form one fabric (one HGX baseboard, or two
// joined ones) that carries traffic between any two GPUs linked to it, which
// is why `nvidia-smi topo -m` on a DGX H100 shows NV18 for every pair: so
// every pair of GPUs with an active link to an NVSwitch is NVLink. An
// inactive link pairs nothing.
func readNVLinks(devices []nvml.Device) ([][]bool, error) {
	at := make(map[pciAddress]int, len(devices))
	for i, d := range devices {
		p, ret := d.GetPciInfo()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GPU %d: %w", i, nvmlError("GetPciInfo", ret))
		}
		at[addressOf(p)] = i
	}
	linked := make([][]bool, len(devices))
	for i := range linked {
		linked[i] = make([]bool, len(devices))
	}
	onSwitch := make([]bool, len(devices))
	for i, d := range devices {
		for link := range nvml.NVLINK_MAX_LINKS {
			state, ret := d.GetNvLinkState(link)
			switch {
			case ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT:
				continue // a GPU without NVLink, or past its last link
			case ret != nvml.SUCCESS:
				return nil, fmt.Errorf("GPU %d link %d: %w", i, link, nvmlError("GetNvLinkState", ret))
			case state != nvml.FEATURE_ENABLED:
				continue
			}
			remote, ret := d.GetNvLinkRemoteDeviceType(link)
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("GPU %d link %d: %w", i, link, nvmlError("GetNvLinkRemoteDeviceType", ret))
			}
			switch remote {
			case nvml.NVLINK_DEVICE_TYPE_SWITCH:
				onSwitch[i] = true
			case nvml.NVLINK_DEVICE_TYPE_GPU:
				p, ret := d.GetNvLinkRemotePciInfo(link)
				if ret != nvml.SUCCESS {
					return nil, fmt.Errorf("GPU %d link %d: %w", i, link, nvmlError("GetNvLinkRemotePciInfo", ret))
				}
				// A peer this source does not see (another container's) is no pair.
				if j, ok := at[addressOf(p)]; ok {
					linked[i][j], linked[j][i] = true, true
				}
			}
		}
	}
	for i := range devices {
		for j := range devices {
			linked[i][j] = linked[i][j] || (onSwitch[i] && onSwitch[j])
		}
	}
	return linked, nil
}
