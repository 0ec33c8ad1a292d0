package collector

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpupool/gpupool/inventory"
)

// NVML reads GPUs through NVIDIA's management library. go-nvml loads
// libnvidia-ml when the source opens, so the binary builds and runs on
// hosts with no GPU; there NewNVML fails with a clear message.
type NVML struct {
	lib     nvml.Interface
	devices []nvml.Device
	// lastSeen is the newest per-process sample timestamp per device, so
	// each round reads only samples it has not seen (NVML's contract).
	lastSeen []uint64
	// xids counts Xid errors per device, from NVML's event set when the
	// driver offers one; stop ends the watcher.
	xids []atomic.Uint64
	stop chan struct{}
	done chan struct{}
	// topology is how the devices link to each other, read when the
	// source opens them (the links and the device set stay as they are
	// while the driver runs); nil, with topologyErr saying why, when a
	// call failed.
	topology    inventory.Topology
	topologyErr error
	// known keeps each device's identity and error counters from its last
	// good read: a lost GPU keeps its labels, and a failed read never
	// makes a counter go down.
	known []GPU
}

// NewNVML opens every GPU of lib (the real library, or go-nvml's mock).
func NewNVML(lib nvml.Interface) (*NVML, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML: %w (is the NVIDIA driver installed and libnvidia-ml.so.1 on the library path?)", nvmlError("Init", ret))
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		_ = lib.Shutdown()
		return nil, nvmlError("DeviceGetCount", ret)
	}
	s := &NVML{lib: lib, lastSeen: make([]uint64, n), xids: make([]atomic.Uint64, n), known: make([]GPU, n)}
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			_ = lib.Shutdown()
			return nil, fmt.Errorf("GPU %d: %w", i, nvmlError("DeviceGetHandleByIndex", ret))
		}
		s.devices = append(s.devices, d)
	}
	s.topology, s.topologyErr = readTopology(s.devices)
	s.watchXids()
	return s, nil
}

// watchXids counts Xid errors as NVML reports them, when the driver offers
// events (not in every container or driver); without, the count stays 0.
func (s *NVML) watchXids() {
	set, ret := s.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return
	}
	uuids := make([]string, len(s.devices))
	registered := false
	for i, d := range s.devices {
		uuids[i], _ = d.GetUUID()
		if d.RegisterEvents(nvml.EventTypeXidCriticalError, set) == nvml.SUCCESS {
			registered = true
		}
	}
	if !registered {
		_ = set.Free()
		return
	}
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(s.done)
		defer func() { _ = set.Free() }()
		for {
			select {
			case <-s.stop:
				return
			default:
			}
			ev, ret := set.Wait(500) // ms: how long Close may wait
			if ret != nvml.SUCCESS && ret != nvml.ERROR_TIMEOUT {
				time.Sleep(time.Second) // e.g. a lost GPU answers at once: do not spin
				continue
			}
			if ret != nvml.SUCCESS || ev.EventType != nvml.EventTypeXidCriticalError || ev.Device == nil {
				continue
			}
			uuid, _ := ev.Device.GetUUID()
			if i := slices.Index(uuids, uuid); i >= 0 {
				s.xids[i].Add(1)
			}
		}
	}()
}

// Close stops the Xid watcher and releases the library.
func (s *NVML) Close() {
	if s.stop != nil {
		close(s.stop)
		<-s.done
	}
	_ = s.lib.Shutdown()
}

// Name implements Source.
func (*NVML) Name() string { return "nvml" }

// TopologyErr says why the GPUs' links are unknown; nil when they were
// read. The GPUs are read all the same, and placed as if every pair were
// across sockets.
func (s *NVML) TopologyErr() error { return s.topologyErr }

// Inventory is the host's GPUs as they register with the allocator.
func (s *NVML) Inventory(server string) (inventory.Server, error) {
	r, err := s.Sample(context.Background(), false)
	if err != nil {
		return inventory.Server{}, err
	}
	return Inventory(server, r.GPUs), nil
}

// Sample implements Source. A GPU whose identity or memory cannot be read
// is reported with Err (and unhealthy when it fell off the bus); optional
// readings the GPU does not support are left unknown.
func (s *NVML) Sample(_ context.Context, processes bool) (Reading, error) {
	out := make([]GPU, len(s.devices))
	for i, d := range s.devices {
		out[i] = s.read(i, d, processes)
		if s.topology != nil {
			out[i].Links = s.topology[i]
		}
	}
	return Reading{GPUs: out}, nil
}

func (s *NVML) read(i int, d nvml.Device, processes bool) GPU {
	last := &s.known[i]
	g := GPU{Index: i, UUID: last.UUID, Model: last.Model, MemoryBytes: last.MemoryBytes,
		Utilization: unknown, TemperatureCelsius: unknown, PowerWatts: unknown,
		ECCCorrected: last.ECCCorrected, ECCUncorrected: last.ECCUncorrected, RetiredPages: last.RetiredPages}
	fail := func(call string, ret nvml.Return) GPU {
		g.Err = nvmlError(call, ret)
		g.Healthy = false
		return g
	}
	defer func() {
		if g.Err == nil {
			*last = GPU{UUID: g.UUID, Model: g.Model, MemoryBytes: g.MemoryBytes,
				ECCCorrected: g.ECCCorrected, ECCUncorrected: g.ECCUncorrected, RetiredPages: g.RetiredPages}
		}
	}()
	uuid, ret := d.GetUUID()
	if ret != nvml.SUCCESS {
		return fail("GetUUID", ret)
	}
	model, ret := d.GetName()
	if ret != nvml.SUCCESS {
		return fail("GetName", ret)
	}
	g.UUID, g.Model = uuid, model
	mem, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return fail("GetMemoryInfo", ret)
	}
	g.MemoryBytes, g.MemoryUsedBytes, g.Healthy = int64(mem.Total), int64(mem.Used), true
	if u, ret := d.GetUtilizationRates(); ret == nvml.SUCCESS {
		g.Utilization = float64(u.Gpu) / 100
	}
	if t, ret := d.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		g.TemperatureCelsius = float64(t)
	}
	if p, ret := d.GetPowerUsage(); ret == nvml.SUCCESS {
		g.PowerWatts = float64(p) / 1000
	}
	if c, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS {
		g.ECCCorrected = max(g.ECCCorrected, c)
	}
	if u, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS {
		g.ECCUncorrected = max(g.ECCUncorrected, u)
	}
	g.Healthy = g.ECCUncorrected == 0
	if corr, unc, _, failed, ret := d.GetRemappedRows(); ret == nvml.SUCCESS {
		g.RetiredPages = max(g.RetiredPages, uint64(corr+unc))
		g.Healthy = g.Healthy && !failed
	} else if pages, ret := d.GetRetiredPages(nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR); ret == nvml.SUCCESS {
		// GPUs before Ampere retire pages instead of remapping rows.
		g.RetiredPages = max(g.RetiredPages, uint64(len(pages)))
	}
	if r, ret := d.GetCurrentClocksEventReasons(); ret == nvml.SUCCESS {
		g.ThrottleReasons = r
	}
	if cur, _, ret := d.GetMigMode(); ret == nvml.SUCCESS {
		g.MIG = cur == nvml.DEVICE_MIG_ENABLE
	}
	g.XidErrors = s.xids[i].Load()
	if processes {
		g.Processes = s.processes(i, d)
	}
	return g
}

// processes reads each compute process's memory, and its SM share from the
// utilization samples newer than the last round's.
func (s *NVML) processes(i int, d nvml.Device) []Process {
	infos, ret := d.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return nil // unknown, not "none"
	}
	sm := map[uint32]nvml.ProcessUtilizationSample{}
	// NOT_FOUND means no new samples (the slice then holds zeros: ignore
	// it): the processes ran no kernel since the last round.
	samples, ret := d.GetProcessUtilization(s.lastSeen[i])
	smKnown := ret == nvml.SUCCESS || ret == nvml.ERROR_NOT_FOUND
	if ret == nvml.SUCCESS {
		for _, smp := range samples {
			if smp.Pid == 0 {
				continue
			}
			if prev, ok := sm[smp.Pid]; !ok || smp.TimeStamp > prev.TimeStamp {
				sm[smp.Pid] = smp
			}
			s.lastSeen[i] = max(s.lastSeen[i], smp.TimeStamp)
		}
	}
	out := make([]Process, 0, len(infos))
	for _, p := range infos {
		proc := Process{PID: int(p.Pid), MemoryUsedBytes: int64(p.UsedGpuMemory), SMUtilization: unknown}
		if smp, ok := sm[p.Pid]; ok {
			proc.SMUtilization = float64(smp.SmUtil) / 100
		} else if smKnown {
			proc.SMUtilization = 0
		}
		out = append(out, proc)
	}
	return out
}

// NVMLError is a failed NVML call.
type NVMLError struct {
	Call string
	Code nvml.Return
}

func (e *NVMLError) Error() string {
	name, ok := nvmlReturnNames[e.Code]
	if !ok {
		name = fmt.Sprintf("NVML error %d", int(e.Code))
	}
	return "NVML " + e.Call + ": " + name
}

// ErrGPULost is the NVML code of a GPU that fell off the bus.
var ErrGPULost = errors.New("GPU is lost (fell off the bus)")

func (e *NVMLError) Unwrap() error {
	if e.Code == nvml.ERROR_GPU_IS_LOST {
		return ErrGPULost
	}
	return nil
}

func nvmlError(call string, ret nvml.Return) error { return &NVMLError{Call: call, Code: ret} }

// nvmlReturnNames spells the codes users meet, without calling into a
// library that may not be loaded.
var nvmlReturnNames = map[nvml.Return]string{
	nvml.ERROR_UNINITIALIZED:      "not initialized",
	nvml.ERROR_INVALID_ARGUMENT:   "invalid argument",
	nvml.ERROR_NOT_SUPPORTED:      "not supported",
	nvml.ERROR_NO_PERMISSION:      "no permission",
	nvml.ERROR_NOT_FOUND:          "not found",
	nvml.ERROR_DRIVER_NOT_LOADED:  "driver not loaded",
	nvml.ERROR_TIMEOUT:            "timeout",
	nvml.ERROR_IRQ_ISSUE:          "interrupt issue",
	nvml.ERROR_LIBRARY_NOT_FOUND:  "libnvidia-ml.so.1 not found",
	nvml.ERROR_GPU_IS_LOST:        "GPU is lost (fell off the bus)",
	nvml.ERROR_UNKNOWN:            "unknown error",
	nvml.ERROR_FUNCTION_NOT_FOUND: "function not found in this driver",
}
