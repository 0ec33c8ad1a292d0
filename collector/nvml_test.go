package collector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpupool/gpupool/inventory"
)

// nvmlFixture is one GPU's NVML answers as recorded on real hardware.
type nvmlFixture struct {
	UUID   string `json:"uuid"`
	Name   string `json:"name"`
	Memory struct {
		Total uint64 `json:"total"`
		Used  uint64 `json:"used"`
	} `json:"memory"`
	Utilization struct {
		GPU    uint32 `json:"gpu"`
		Memory uint32 `json:"memory"`
	} `json:"utilization"`
	MIGMode   int `json:"migMode"`
	Processes []struct {
		PID  uint32 `json:"pid"`
		Used uint64 `json:"usedGpuMemory"`
	} `json:"processes"`
	ProcessUtilization struct {
		Return      string `json:"return"`
		ZeroSamples int    `json:"zeroSamples"`
		Samples     []struct {
			PID       uint32 `json:"pid"`
			TimeStamp uint64 `json:"timeStamp"`
			SM        uint32 `json:"smUtil"`
			Mem       uint32 `json:"memUtil"`
		} `json:"samples"`
	} `json:"processUtilization"`
	// PCIBusID and NVLinks are what the topology recordings add: the
	// GPU's PCI address and its active NVLinks in link order (the links
	// after them answer INVALID_ARGUMENT; a GPU with none answers
	// NOT_SUPPORTED, as one without NVLink does).
	PCIBusID string `json:"pciBusId"`
	NVLinks  []struct {
		// Remote is the device type at the link's far end, SWITCH or GPU;
		// a GPU's PCIBusID says which.
		Remote   string `json:"remote"`
		PCIBusID string `json:"pciBusId"`
	} `json:"nvLinks"`
}

// pciInfo is a PCI bus ID as NVML reports it; the zero PciInfo for none.
func pciInfo(t *testing.T, busID string) nvml.PciInfo {
	t.Helper()
	var p nvml.PciInfo
	if busID == "" {
		return p
	}
	var function uint32
	if _, err := fmt.Sscanf(busID, "%x:%x:%x.%x", &p.Domain, &p.Bus, &p.Device, &function); err != nil {
		t.Fatalf("PCI bus ID %q: %v", busID, err)
	}
	return p
}

// mockDevice answers as the fixture says, the way go-nvml's mock package
// is meant to be used; calls the probe did not record are NOT_SUPPORTED.
func mockDevice(t *testing.T, f *nvmlFixture) *mock.Device {
	return &mock.Device{
		GetUUIDFunc: func() (string, nvml.Return) { return f.UUID, nvml.SUCCESS },
		GetNameFunc: func() (string, nvml.Return) { return f.Name, nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: f.Memory.Total, Used: f.Memory.Used, Free: f.Memory.Total - f.Memory.Used}, nvml.SUCCESS
		},
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: f.Utilization.GPU, Memory: f.Utilization.Memory}, nvml.SUCCESS
		},
		GetTemperatureFunc: func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED },
		GetPowerUsageFunc:  func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED },
		GetTotalEccErrorsFunc: func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
			return 0, nvml.SUCCESS
		},
		GetRemappedRowsFunc:              func() (int, int, bool, bool, nvml.Return) { return 0, 0, false, false, nvml.SUCCESS },
		GetCurrentClocksEventReasonsFunc: func() (uint64, nvml.Return) { return 0, nvml.SUCCESS },
		GetMigModeFunc:                   func() (int, int, nvml.Return) { return f.MIGMode, f.MIGMode, nvml.SUCCESS },
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			var out []nvml.ProcessInfo
			for _, p := range f.Processes {
				out = append(out, nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: p.Used})
			}
			return out, nvml.SUCCESS
		},
		GetProcessUtilizationFunc: func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			pu := f.ProcessUtilization
			if pu.Return == "NOT_FOUND" {
				// As seen: NOT_FOUND comes with a slice of zero samples.
				return make([]nvml.ProcessUtilizationSample, pu.ZeroSamples), nvml.ERROR_NOT_FOUND
			}
			var out []nvml.ProcessUtilizationSample
			for _, s := range pu.Samples {
				out = append(out, nvml.ProcessUtilizationSample{Pid: s.PID, TimeStamp: s.TimeStamp, SmUtil: s.SM, MemUtil: s.Mem})
			}
			return out, nvml.SUCCESS
		},
		GetPciInfoFunc: func() (nvml.PciInfo, nvml.Return) {
			if f.PCIBusID == "" {
				return nvml.PciInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			return pciInfo(t, f.PCIBusID), nvml.SUCCESS
		},
		GetNvLinkStateFunc: func(link int) (nvml.EnableState, nvml.Return) {
			switch {
			case len(f.NVLinks) == 0:
				return 0, nvml.ERROR_NOT_SUPPORTED
			case link >= len(f.NVLinks):
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		},
		GetNvLinkRemoteDeviceTypeFunc: func(link int) (nvml.IntNvLinkDeviceType, nvml.Return) {
			if f.NVLinks[link].Remote == "SWITCH" {
				return nvml.NVLINK_DEVICE_TYPE_SWITCH, nvml.SUCCESS
			}
			return nvml.NVLINK_DEVICE_TYPE_GPU, nvml.SUCCESS
		},
		GetNvLinkRemotePciInfoFunc: func(link int) (nvml.PciInfo, nvml.Return) {
			return pciInfo(t, f.NVLinks[link].PCIBusID), nvml.SUCCESS
		},
		GetTopologyCommonAncestorFunc: func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			return 0, nvml.ERROR_NOT_SUPPORTED
		},
	}
}

func mockLibrary(devices ...nvml.Device) *mock.Interface {
	return &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return len(devices), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) { return devices[i], nvml.SUCCESS },
		// The probe did not record events: as on drivers that offer none.
		EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED },
	}
}

func loadNVMLFixtures(t *testing.T) (idle, busy *nvmlFixture) {
	t.Helper()
	b, err := os.ReadFile("testdata/nvml-h100.json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct{ Idle, Busy nvmlFixture }
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	return &f.Idle, &f.Busy
}

func TestNVMLOnRecordedH100(t *testing.T) {
	idle, busy := loadNVMLFixtures(t)
	src, err := NewNVML(mockLibrary(mockDevice(t, idle)))
	if err != nil {
		t.Fatal(err)
	}
	inv, err := src.Inventory("h100-host")
	if err != nil || len(inv.GPUs) != 1 || inv.GPUs[0].UUID != idle.UUID || inv.GPUs[0].Model != "NVIDIA H100 80GB HBM3" ||
		inv.GPUs[0].MemoryBytes != 85520809984 {
		t.Fatalf("inventory = %+v, %v", inv, err)
	}
	// One GPU has no pair to ask NVML about (the probe recorded no
	// topology): it reaches only itself.
	if l := inv.GPUs[0].Links; src.TopologyErr() != nil || !slices.Equal(l, []inventory.Link{inventory.LinkNVLink}) {
		t.Errorf("links %v, %v; want itself only", l, src.TopologyErr())
	}
	r, _ := src.Sample(context.Background(), true)
	g := r.GPUs[0]
	if g.Utilization != 0 || len(g.Processes) != 0 || !math.IsNaN(g.TemperatureCelsius) || !math.IsNaN(g.PowerWatts) {
		t.Errorf("idle: %+v; want 0 utilization, no processes (the zero samples of NOT_FOUND ignored), unknown temperature and power", g)
	}
	if p := g.MemoryPressure(); math.Abs(p-503316480.0/85520809984) > 1e-12 {
		t.Errorf("idle memory pressure %v", p)
	}

	src, _ = NewNVML(mockLibrary(mockDevice(t, busy)))
	r, _ = src.Sample(context.Background(), true)
	g = r.GPUs[0]
	if g.Utilization != 1 || len(g.Processes) != 1 {
		t.Fatalf("busy: %+v", g)
	}
	p := g.Processes[0]
	if p.PID != 417 || p.MemoryUsedBytes != 1050673152 || p.SMUtilization != 0.72 {
		t.Errorf("busy process = %+v, want pid 417 using 1050673152 bytes at 72%% SM", p)
	}
	if src.lastSeen[0] != 1795367024554058 {
		t.Errorf("next round would re-read old samples: lastSeen %d", src.lastSeen[0])
	}
}

func TestNVMLLostGPUFailsOnlyThatGPU(t *testing.T) {
	idle, _ := loadNVMLFixtures(t)
	lost := mockDevice(t, idle)
	lost.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
	src, err := NewNVML(mockLibrary(mockDevice(t, idle), lost))
	if err != nil {
		t.Fatal(err)
	}
	r, err := src.Sample(context.Background(), false)
	gpus := r.GPUs
	if err != nil || gpus[0].Err != nil || !gpus[0].Healthy {
		t.Fatalf("the healthy GPU suffered: %+v, %v", gpus[0], err)
	}
	if !errors.Is(gpus[1].Err, ErrGPULost) || gpus[1].Healthy {
		t.Errorf("lost GPU: err %v healthy %v; want ErrGPULost and unhealthy", gpus[1].Err, gpus[1].Healthy)
	}
}

func TestNVMLWithoutLibrary(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	_, err := NewNVML(lib)
	if err == nil || err.Error() != "NVML: NVML Init: libnvidia-ml.so.1 not found (is the NVIDIA driver installed and libnvidia-ml.so.1 on the library path?)" {
		t.Errorf("err = %v", err)
	}
}

// TestNVMLCountsXidEvents: Xid errors come from NVML's event set.
func TestNVMLCountsXidEvents(t *testing.T) {
	idle, _ := loadNVMLFixtures(t)
	dev := mockDevice(t, idle)
	events := make(chan nvml.EventData, 2)
	events <- nvml.EventData{Device: dev, EventType: nvml.EventTypeXidCriticalError, EventData: 79}
	events <- nvml.EventData{Device: dev, EventType: nvml.EventTypeXidCriticalError, EventData: 48}
	set := &mock.EventSet{
		WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
			select {
			case ev := <-events:
				return ev, nvml.SUCCESS
			default:
				time.Sleep(time.Millisecond)
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		},
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
	}
	dev.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	lib := mockLibrary(dev)
	lib.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }
	src, err := NewNVML(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, _ := src.Sample(context.Background(), false)
		gpus := r.GPUs
		if gpus[0].XidErrors == 2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Xid errors = %d after two Xid events, want 2", gpus[0].XidErrors)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
