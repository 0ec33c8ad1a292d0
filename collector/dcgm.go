package collector

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

const mib = 1 << 20

// DCGM reads a dcgm-exporter's /metrics, for sites that already run DCGM,
// and maps its DCGM_FI_* fields to gpupool's (base units, ratios). It sees
// no processes: dcgm-exporter does not report them per PID.
type DCGM struct {
	URL    string
	Client *http.Client
	// lastXid is the last Xid value seen per GPU: dcgm-exporter reports
	// the last error's code, gpupool counts errors.
	lastXid map[string]float64
	xids    map[string]uint64
}

// Name implements Source.
func (*DCGM) Name() string { return "dcgm" }

// Sample implements Source.
func (s *DCGM) Sample(ctx context.Context, _ bool) (Reading, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	if err != nil {
		return Reading{}, err
	}
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return Reading{}, fmt.Errorf("dcgm-exporter %s: %w", s.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Reading{}, fmt.Errorf("dcgm-exporter %s answered %s", s.URL, resp.Status)
	}
	gpus, err := s.parse(io.LimitReader(resp.Body, 16<<20))
	return Reading{GPUs: gpus}, err
}

func (s *DCGM) parse(r io.Reader) ([]GPU, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("dcgm-exporter %s: %w", s.URL, err)
	}
	if s.lastXid == nil {
		s.lastXid, s.xids = map[string]float64{}, map[string]uint64{}
	}
	byGPU := map[string]*GPU{} // by UUID
	// Memory is known only with both fields: one alone would make the
	// total the used part (pressure 1) or the free part (pressure 0).
	fbUsed, fbFree := map[string]float64{}, map[string]float64{}
	// gpu is the whole GPU a series is about; nil for series of no GPU
	// (the exporter's own) or of one MIG instance (GPU_I_ID set).
	gpu := func(m *dto.Metric) *GPU {
		l := labels(m)
		idx, err := strconv.Atoi(l["gpu"])
		if l["UUID"] == "" || err != nil || l["GPU_I_ID"] != "" {
			return nil
		}
		g, ok := byGPU[l["UUID"]]
		if !ok {
			g = &GPU{Index: idx, UUID: l["UUID"], Model: l["modelName"], Healthy: true,
				Utilization: unknown, TemperatureCelsius: unknown, PowerWatts: unknown}
			byGPU[l["UUID"]] = g
		}
		return g
	}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			v := value(m)
			g := gpu(m)
			if g == nil {
				continue
			}
			switch name {
			case "DCGM_FI_DEV_GPU_UTIL":
				g.Utilization = v / 100
			case "DCGM_FI_DEV_FB_USED":
				fbUsed[g.UUID] = v
			case "DCGM_FI_DEV_FB_FREE":
				fbFree[g.UUID] = v
			case "DCGM_FI_DEV_GPU_TEMP":
				g.TemperatureCelsius = v
			case "DCGM_FI_DEV_POWER_USAGE":
				g.PowerWatts = v
			case "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL":
				g.ECCCorrected = uint64(v)
			case "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL":
				g.ECCUncorrected = uint64(v)
			case "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS":
				g.ThrottleReasons = uint64(v)
			case "DCGM_FI_DEV_XID_ERRORS":
				if v != 0 && v != s.lastXid[g.UUID] {
					s.xids[g.UUID]++
				}
				s.lastXid[g.UUID] = v
			}
		}
	}
	out := make([]GPU, 0, len(byGPU))
	for _, g := range byGPU {
		used, okUsed := fbUsed[g.UUID]
		free, okFree := fbFree[g.UUID]
		if okUsed && okFree {
			g.MemoryUsedBytes, g.MemoryBytes = int64(used*mib), int64((used+free)*mib)
		}
		g.XidErrors = s.xids[g.UUID]
		g.Healthy = g.ECCUncorrected == 0
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, nil
}

func labels(m *dto.Metric) map[string]string {
	out := make(map[string]string, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return math.NaN()
}
