package collector

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/procfs/sysfs"
)

// Fabric reads the host's InfiniBand and RoCE port counters from sysfs
// (/sys/class/infiniband, through prometheus/procfs) on its own loop.
type Fabric struct {
	fs     sysfs.FS
	latest atomic.Pointer[fabricSnapshot]
	clock  func() time.Time
	// AfterRound, when set before Run, is called after each round, as the
	// Sampler's is: the exporter renders the ports' series there.
	AfterRound func()
}

type fabricSnapshot struct {
	time     time.Time
	duration time.Duration
	ports    []Port
	err      error
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
func NewFabric(sysPath string, clock func() time.Time) (*Fabric, error) {
	fs, err := sysfs.NewFS(sysPath)
	if err != nil {
		return nil, fmt.Errorf("sysfs at %s: %w", sysPath, err)
	}
	if clock == nil {
		clock = time.Now
	}
	f := &Fabric{fs: fs, clock: clock}
	f.latest.Store(&fabricSnapshot{})
	return f, nil
}

// Round reads every port once.
func (f *Fabric) Round() {
	start := time.Now()
	class, err := f.fs.InfiniBandClass()
	snap := &fabricSnapshot{time: f.clock(), duration: time.Since(start), err: err}
	if err != nil {
		prev := f.latest.Load()
		snap.ports, snap.time = prev.ports, prev.time
		f.store(snap)
		return
	}
	for _, dev := range class {
		for _, p := range dev.Ports {
			c := p.Counters
			snap.ports = append(snap.ports, Port{
				Device: dev.Name, Port: p.Port, LinkLayer: p.LinkLayer, Up: p.State == "ACTIVE", RateBytes: p.Rate,
				RxBytes: c.PortRcvData, TxBytes: c.PortXmitData, RxPackets: c.PortRcvPackets, TxPackets: c.PortXmitPackets,
				RxErrors: c.PortRcvErrors, TxDiscards: c.PortXmitDiscards, LinkDowned: c.LinkDowned,
			})
		}
	}
	sort.Slice(snap.ports, func(i, j int) bool {
		a, b := snap.ports[i], snap.ports[j]
		return a.Device < b.Device || a.Device == b.Device && a.Port < b.Port
	})
	f.store(snap)
}

func (f *Fabric) store(snap *fabricSnapshot) {
	f.latest.Store(snap)
	if f.AfterRound != nil {
		f.AfterRound()
	}
}

// Run reads the ports every interval until ctx ends.
func (f *Fabric) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		f.Round()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

var (
	portLabels      = []string{"server", "device", "port"}
	descPortInfo    = prometheus.NewDesc("bitfusion_rdma_port_info", "RDMA ports of the host; 1 per port, with its link layer (InfiniBand or Ethernet for RoCE).", append(portLabels, "link_layer"), nil)
	descPortUp      = prometheus.NewDesc("bitfusion_rdma_port_up", "1 while the port's state is ACTIVE.", portLabels, nil)
	descPortRate    = prometheus.NewDesc("bitfusion_rdma_port_rate_bytes_per_second", "Negotiated port rate.", portLabels, nil)
	descPortCounter = map[string]*prometheus.Desc{}
)

// portCounters name the counters exported per port.
var portCounters = []struct {
	name, help string
	get        func(*Port) *uint64
}{
	{"bitfusion_rdma_port_received_bytes_total", "Data received on the port.", func(p *Port) *uint64 { return p.RxBytes }},
	{"bitfusion_rdma_port_transmitted_bytes_total", "Data transmitted on the port.", func(p *Port) *uint64 { return p.TxBytes }},
	{"bitfusion_rdma_port_received_packets_total", "Packets received on the port.", func(p *Port) *uint64 { return p.RxPackets }},
	{"bitfusion_rdma_port_transmitted_packets_total", "Packets transmitted on the port.", func(p *Port) *uint64 { return p.TxPackets }},
	{"bitfusion_rdma_port_receive_errors_total", "Received packets with errors.", func(p *Port) *uint64 { return p.RxErrors }},
	{"bitfusion_rdma_port_transmit_discards_total", "Outbound packets discarded (congestion, port down).", func(p *Port) *uint64 { return p.TxDiscards }},
	{"bitfusion_rdma_port_link_downed_total", "Times the link went down.", func(p *Port) *uint64 { return p.LinkDowned }},
}

func init() {
	for _, c := range portCounters {
		descPortCounter[c.name] = prometheus.NewDesc(c.name, c.help, portLabels, nil)
	}
}

func (f *Fabric) describe(ch chan<- *prometheus.Desc) {
	ch <- descPortInfo
	ch <- descPortUp
	ch <- descPortRate
	for _, d := range descPortCounter {
		ch <- d
	}
}

// render emits the ports' series and the fabric source's own health.
func (f *Fabric) render(server string, emit func(prometheus.Metric)) {
	snap := f.latest.Load()
	emit(prometheus.MustNewConstMetric(descSourceSuccess, prometheus.GaugeValue, boolValue(snap.err == nil && !snap.time.IsZero()), "infiniband"))
	emit(prometheus.MustNewConstMetric(descSourceTime, prometheus.GaugeValue, snap.duration.Seconds(), "infiniband"))
	for i := range snap.ports {
		p := &snap.ports[i]
		labels := []string{server, p.Device, strconv.FormatUint(uint64(p.Port), 10)}
		emit(prometheus.MustNewConstMetric(descPortInfo, prometheus.GaugeValue, 1, append(labels, p.LinkLayer)...))
		emit(prometheus.MustNewConstMetric(descPortUp, prometheus.GaugeValue, boolValue(p.Up), labels...))
		emit(prometheus.MustNewConstMetric(descPortRate, prometheus.GaugeValue, float64(p.RateBytes), labels...))
		for _, c := range portCounters {
			if v := c.get(p); v != nil {
				emit(prometheus.MustNewConstMetric(descPortCounter[c.name], prometheus.CounterValue, float64(*v), labels...))
			}
		}
	}
}

func (f *Fabric) age(now time.Time) (float64, bool) {
	snap := f.latest.Load()
	return now.Sub(snap.time).Seconds(), !snap.time.IsZero()
}
