package gpuserver

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/collector"
	"github.com/gpupool/gpupool/fakegpu"
)

// heartbeatRecorder is an allocator that keeps the heartbeats it takes;
// old, it refuses a heartbeat with use as an allocator that predates the
// field does, naming the unknown field.
type heartbeatRecorder struct {
	mu    sync.Mutex
	old   bool
	picky bool // refuses the use, once, as out of range
	taken []api.Heartbeat
	lease allocator.Lease
}

func (h *heartbeatRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if !strings.HasSuffix(r.URL.Path, "/heartbeat") {
		_ = json.NewEncoder(w).Encode(api.LeaseList{Leases: []api.Lease{api.NewLease(h.lease)}})
		return
	}
	body, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.old && strings.Contains(string(body), `"use"`) {
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(api.Error{Reason: api.ReasonInvalid, Message: `body is not valid JSON for this request: json: unknown field "use"`})
		return
	}
	if h.picky && strings.Contains(string(body), `"use"`) {
		h.picky = false
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(api.Error{Reason: api.ReasonInvalid, Message: "use.gpus.utilization: 1.02 out of range 0..1", Field: "use.gpus.utilization"})
		return
	}
	var hb api.Heartbeat
	_ = json.Unmarshal(body, &hb)
	h.taken = append(h.taken, hb)
	w.WriteHeader(http.StatusNoContent)
}

func (h *heartbeatRecorder) last() api.Heartbeat {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.taken[len(h.taken)-1]
}

// TestHeartbeatCarriesUse: once the daemon has measured, its heartbeats
// carry the GPUs' and the leases' use for the allocator's console. Health
// always gets through: a reading the allocator refuses is left out of
// that heartbeat, and an allocator older than the field gets health alone
// from then on.
func TestHeartbeatCarriesUse(t *testing.T) {
	now := time.Unix(1.8e9, 0)
	lease := allocator.Lease{ID: "lease-000001", Namespace: "ml", Server: "gpu-a", Owner: allocator.Owner{Pod: "tf-0", UID: "uid-0"},
		GPUs: []allocator.LeaseGPU{{Index: 0, Share: 500, MemoryBytes: 40 << 30}}}
	rec := &heartbeatRecorder{lease: lease}
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	c, err := client.New([]string{srv.URL}, "")
	if err != nil {
		t.Fatal(err)
	}
	var d *Daemon
	sim := &fakegpu.Source{Server: "gpu-a", Seed: 7, Clock: func() time.Time { return now },
		GPUs:   []fakegpu.GPU{{Model: "H100", MemoryBytes: 80 << 30}},
		Leases: func() []allocator.Lease { return d.Leases() },
		Demand: func([]allocator.Lease, time.Time) map[string]float64 { return map[string]float64{lease.ID: 0.8} },
	}
	sampler := collector.NewSampler(sim, time.Second, 1, sim.Clock)
	d = New(Config{Inventory: sim.Inventory(0, 0, nil), Client: c, Samplers: []*collector.Sampler{sampler}, Clock: sim.Clock})
	ctx := context.Background()

	d.heartbeat(ctx)
	if hb := rec.last(); hb.Use != nil {
		t.Errorf("before the first round the heartbeat carries use %+v", hb.Use)
	}
	d.refreshLeases(ctx)
	sampler.Round(ctx)
	d.heartbeat(ctx)
	hb := rec.last()
	if hb.Use == nil || len(hb.Use.GPUs) != 1 || hb.Use.GPUs[0].Utilization == nil || len(hb.Use.Leases) != 1 ||
		hb.Use.Leases[0].Lease != lease.ID || hb.Use.Leases[0].SMUtilization == nil || *hb.Use.Leases[0].SMUtilization < 0.39 {
		t.Fatalf("heartbeat use %+v, want the GPU's and lease-000001's (0.4 of the GPU)", hb.Use)
	}

	// twoRounds is what the allocator takes of two heartbeats once it
	// behaves as change says.
	twoRounds := func(change func()) []api.Heartbeat {
		rec.mu.Lock()
		change()
		rec.taken = nil
		rec.mu.Unlock()
		for range 2 {
			if !d.heartbeat(ctx) {
				t.Fatal("the heartbeat failed")
			}
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.taken
	}
	// A reading refused gets health through, and the next round's use.
	if taken := twoRounds(func() { rec.picky = true }); len(taken) != 2 || taken[0].Use != nil || len(taken[0].GPUs) != 1 || taken[1].Use == nil {
		t.Errorf("after a reading refused the allocator took %+v, want health alone, then health and use", taken)
	}
	if taken := twoRounds(func() { rec.old = true }); len(taken) != 2 || taken[0].Use != nil || taken[1].Use != nil || len(taken[0].GPUs) != 1 {
		t.Errorf("an older allocator took %+v, want two heartbeats with health alone", taken)
	}
}
