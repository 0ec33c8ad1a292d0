package collector

import (
	"context"
	"fmt"
	"sort"

	"github.com/prometheus/procfs/sysfs"
)

// Fabric is the source of the host's InfiniBand and RoCE ports, read from
// sysfs (/sys/class/infiniband, through prometheus/procfs); a Sampler
// samples it as it samples the GPUs.
type Fabric struct {
	fs sysfs.FS
}

// Port is one RDMA port's state and counters.
type Port struct {
	Device, LinkLayer string
	Port              uint
	Up                bool
	RateBytes         uint64
	// Counters since the driver loaded; nil when the driver lacks them.
	RxBytes, TxBytes, RxPackets, TxPackets, RxErrors, TxDiscards, LinkDowned *uint64
}

// NewFabric reads sysfs mounted at sysPath (/sys on a host).
func NewFabric(sysPath string) (*Fabric, error) {
	fs, err := sysfs.NewFS(sysPath)
	if err != nil {
		return nil, fmt.Errorf("sysfs at %s: %w", sysPath, err)
	}
	return &Fabric{fs: fs}, nil
}

// Name implements Source.
func (*Fabric) Name() string { return "infiniband" }

// Sample implements Source: every port once, sorted by device and port.
func (f *Fabric) Sample(context.Context, bool) (Reading, error) {
	class, err := f.fs.InfiniBandClass()
	if err != nil {
		return Reading{}, err
	}
	var ports []Port
	for _, dev := range class {
		for _, p := range dev.Ports {
			c := p.Counters
			ports = append(ports, Port{
				Device: dev.Name, Port: p.Port, LinkLayer: p.LinkLayer, Up: p.State == "ACTIVE", RateBytes: p.Rate,
				RxBytes: c.PortRcvData, TxBytes: c.PortXmitData, RxPackets: c.PortRcvPackets, TxPackets: c.PortXmitPackets,
				RxErrors: c.PortRcvErrors, TxDiscards: c.PortXmitDiscards, LinkDowned: c.LinkDowned,
			})
		}
	}
	sort.Slice(ports, func(i, j int) bool {
		a, b := ports[i], ports[j]
		return a.Device < b.Device || a.Device == b.Device && a.Port < b.Port
	})
	return Reading{Ports: ports}, nil
}
