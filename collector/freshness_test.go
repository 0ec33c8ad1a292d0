package collector

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func countSeries(t *testing.T, reg *prometheus.Registry, names ...string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, n := range names {
		out[n] = testutil.CollectAndCount(reg, n)
	}
	return out
}

// TestSamplerAsksForProcessesUntilItHasThem: rounds that got no process
// list do not count as having read processes; once a round has, the
// schedule (ProcessEvery) holds, and RequestProcesses has the next round
// read them anyway.
func TestSamplerAsksForProcessesUntilItHasThem(t *testing.T) {
	lists := false
	var asked []bool
	src := sourceFunc(func(processes bool) []GPU {
		asked = append(asked, processes)
		g := GPU{UUID: "GPU-0"}
		if processes && lists {
			g.Processes = []Process{}
		}
		return []GPU{g}
	})
	s := NewSampler(src, time.Second, 10, nil)
	ctx := context.Background()
	s.Round(ctx)
	s.Round(ctx)
	lists = true
	s.Round(ctx) // round 3 gets lists
	s.Round(ctx)
	if got := s.Latest(); got.ProcessRound != 3 || got.GPUs[0].Processes == nil {
		t.Errorf("after round 4: processes of round %d (%v), want round 3's carried", got.ProcessRound, got.GPUs[0].Processes)
	}
	if n := s.RequestProcesses(); n != 4 {
		t.Errorf("RequestProcesses after 4 rounds = %d", n)
	}
	s.Round(ctx)
	s.Round(ctx)
	want := []bool{true, true, true, false, true, false}
	for i := range want {
		if i >= len(asked) || asked[i] != want[i] {
			t.Fatalf("rounds asked for processes %v, want %v", asked, want)
		}
	}
	if got := s.Latest().ProcessRound; got != 5 {
		t.Errorf("ProcessRound after the requested round = %d, want 5", got)
	}
}

// TestNoDurationBeforeTheFirstRound: a source that has not finished a
// round has no round duration (0 s would be one nobody measured).
func TestNoDurationBeforeTheFirstRound(t *testing.T) {
	s := NewSampler(sourceFunc(func(bool) []GPU { return nil }), time.Second, 1, nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(&GPUCollector{Server: "gpu-a", Samplers: []*Sampler{s}})
	if n := testutil.CollectAndCount(reg, "bitfusion_exporter_source_duration_seconds"); n != 0 {
		t.Errorf("duration before the first round: %d series", n)
	}
	s.Round(context.Background())
	reg = prometheus.NewRegistry()
	reg.MustRegister(&GPUCollector{Server: "gpu-a", Samplers: []*Sampler{s}})
	if n := testutil.CollectAndCount(reg, "bitfusion_exporter_source_duration_seconds"); n != 1 {
		t.Errorf("duration after a round: %d series, want 1", n)
	}
}

// TestDCGMMemoryNeedsBothFields: dcgm-exporter can be configured without
// DCGM_FI_DEV_FB_FREE or _USED; with one of them missing the memory is
// unknown, not 0 used (nor all of it).
func TestDCGMMemoryNeedsBothFields(t *testing.T) {
	fixture, err := os.ReadFile("testdata/dcgm-exporter.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED"} {
		without := regexp.MustCompile(`(?m)^(# [A-Z]+ )?`+field+`\b.*\n`).ReplaceAll(fixture, nil)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(without) }))
		src := &DCGM{URL: srv.URL}
		s := NewSampler(src, time.Second, 1, nil)
		s.Round(context.Background())
		srv.Close()
		if err := s.Latest().Err; err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		reg.MustRegister(&GPUCollector{Server: "gpu-a", Samplers: []*Sampler{s}})
		for _, name := range []string{"bitfusion_memory_pressure", "bitfusion_gpu_memory_used_bytes"} {
			if n := testutil.CollectAndCount(reg, name); n != 0 {
				t.Errorf("without %s: %s has %d series, want none", field, name, n)
			}
		}
		if n := testutil.CollectAndCount(reg, "bitfusion_gpu_utilization"); n != 2 {
			t.Errorf("without %s: utilization has %d series, want both GPUs'", field, n)
		}
	}
}
