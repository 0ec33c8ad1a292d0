package scheduler

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/service/servicetest"
)

// TestLeaseWithoutABindEnds: a filter's lease whose pod is not bound within
// the timeout (kube-scheduler's cycle failed after the filter) is
// released; a bound pod's stays, and so does the lease of a pod whose
// filter came again within the timeout, until that wait ends too.
func TestLeaseWithoutABindEnds(t *testing.T) {
	te := newTestPlacer(t, []api.Server{servicetest.Server("gpu-0", 2)}, nil)
	te.unbound.timeout = 300 * time.Millisecond
	forgotten, bound := testPod("forgotten", half), testPod("bound", half)
	placedOn(t, te.callFilter(t, forgotten, "gpu-0"), "gpu-0")
	te.bound(t, bound, "gpu-0")
	time.Sleep(150 * time.Millisecond)
	placedOn(t, te.callFilter(t, forgotten, "gpu-0"), "gpu-0") // a retry restarts its wait
	time.Sleep(200 * time.Millisecond)
	if held := te.leases(t, forgotten); len(held) != 1 {
		t.Fatalf("the retried pod holds %d leases within its new wait, want 1", len(held))
	}
	// The release is counted once the allocator answered it.
	waitUntil(t, func() bool {
		return len(te.leases(t, forgotten)) == 0 && testutil.ToFloat64(te.metrics.unboundReleased) == 1
	})
	if held := te.leases(t, bound); len(held) != 1 {
		t.Errorf("the bound pod holds %d leases, want 1", len(held))
	}
	if n := te.unbound.waiting(); n != 0 {
		t.Errorf("%d pods still wait for a bind", n)
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not within 5s: the forgotten pod's lease was not released, or not counted")
		}
	}
}
