package allocator

import (
	"testing"
	"time"
)

func TestShareUnits(t *testing.T) {
	for _, tc := range []struct {
		share   Share
		percent float64
		gpus    float64
		text    string
	}{
		{0, 0, 0, "0%"},
		{1, 0.1, 0.001, "0.1%"},
		{466, 46.6, 0.466, "46.6%"},
		{WholeGPU, 100, 1, "100%"},
		{ShareGPUs(4), 400, 4, "400%"},
		{1900, 190, 1.9, "190%"},
	} {
		if got := tc.share.Percent(); got != tc.percent {
			t.Errorf("Share(%d).Percent() = %v, want %v", tc.share, got, tc.percent)
		}
		if got := tc.share.GPUs(); got != tc.gpus {
			t.Errorf("Share(%d).GPUs() = %v, want %v", tc.share, got, tc.gpus)
		}
		if got := tc.share.String(); got != tc.text {
			t.Errorf("Share(%d).String() = %q, want %q", tc.share, got, tc.text)
		}
		if back := SharePercent(tc.share.Percent()); back != tc.share {
			t.Errorf("SharePercent(%v) = %d, want %d back", tc.share.Percent(), back, tc.share)
		}
	}
	// Percent on the wire is a decimal: it comes back to the nearest milli.
	if got := SharePercent(18.69999); got != 187 {
		t.Errorf("SharePercent(18.69999) = %d, want 187", got)
	}
}

func TestShareOfMemory(t *testing.T) {
	for _, tc := range []struct {
		bytes, gpuMemory int64
		want             Share
	}{
		{8 << 30, 80 << 30, 100},
		{6_000_000_000, 40 << 30, 140}, // 139.7 rounds up: the share covers the memory
		{40 << 30, 40 << 30, WholeGPU},
		{1, 16 << 30, 1},
	} {
		got := shareOfMemory(tc.bytes, tc.gpuMemory)
		if got != tc.want {
			t.Errorf("shareOfMemory(%d, %d) = %d, want %d", tc.bytes, tc.gpuMemory, got, tc.want)
		}
		// The smallest share that covers the memory asked.
		if got.ofMemory(tc.gpuMemory) < tc.bytes || (got-1).ofMemory(tc.gpuMemory) >= tc.bytes {
			t.Errorf("share %d is not the least that stands for %d bytes of %d", got, tc.bytes, tc.gpuMemory)
		}
	}
	if got := WholeGPU.ofMemory(80 << 30); got != 80<<30 {
		t.Errorf("a whole GPU stands for %d bytes, want all of it", got)
	}
}

// TestServerStatesAreCopies: what ServerStates returns may be changed
// without changing the pool.
func TestServerStatesAreCopies(t *testing.T) {
	p, err := NewPool(PoolConfig{Policy: newBestFit(PolicyOptions{}), DefaultTTL: time.Minute, MaxTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.RegisterServer(testServer("s1", "A100", 2, 80<<30, 0)); err != nil {
		t.Fatal(err)
	}
	st := p.ServerStates()
	st[0].Node.GPUs[0].Free = 0
	st[0].Node.Schedulable = false
	st[0].Server.GPUs[0].Healthy = false
	again := p.ServerStates()[0]
	if again.Node.GPUs[0].Free != WholeGPU || !again.Node.Schedulable || !again.Server.GPUs[0].Healthy {
		t.Fatalf("changing a returned state changed the pool: %+v", again)
	}
	if changed, err := p.SetSchedulable("s1", true); changed || err != nil {
		t.Fatalf("SetSchedulable(s1, true) on a schedulable server = %v, %v; want no change", changed, err)
	}
	if changed, err := p.SetSchedulable("s1", false); !changed || err != nil {
		t.Fatalf("SetSchedulable(s1, false) = %v, %v; want a change", changed, err)
	}
}
