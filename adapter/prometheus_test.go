package adapter

import (
	"testing"
	"time"

	"github.com/gpupool/gpupool/internal/metricstest"
)

// TestPrometheusBackendAgreesWithDirect: a real Prometheus and a real
// VictoriaMetrics scrape the allocator and the daemon; the built-in PromQL
// gives what the direct backend gives.
func TestPrometheusBackendAgreesWithDirect(t *testing.T) {
	for _, tsdb := range []struct {
		name  string
		start func(t testing.TB, interval time.Duration, targets ...string) string
	}{
		{"prometheus", metricstest.StartPrometheus},
		{"victoria-metrics", metricstest.StartVictoriaMetrics},
	} {
		t.Run(tsdb.name, func(t *testing.T) {
			p := newTestPool(t, 2)
			p.acquire(t, "tf-0", "tf-training", 6, 50)
			p.acquire(t, "tf-1", "tf-training", 8, 50)
			p.acquire(t, "web-0", "web", 2, 25)
			prom, err := NewPrometheus(tsdb.start(t, time.Second, p.allocator.URL, p.daemonSrv.URL), "")
			if err != nil {
				t.Fatal(err)
			}
			direct := NewDirect(p.client, 0, quietLog())
			for _, c := range []struct{ metric, selector string }{
				{GPUUtilization, "app=tf-training"},
				{GPUUtilization, "app in (web)"},
				{MemoryPressure, "app=tf-training"},
				{PoolUnallocatedGPUs, ""},
				{PendingRequests, ""},
			} {
				want := query(t, direct, c.metric, c.selector)
				var got []Value
				deadline := time.Now().Add(30 * time.Second)
				for len(got) == 0 && time.Now().Before(deadline) {
					got = query(t, prom, c.metric, c.selector)
					time.Sleep(200 * time.Millisecond)
				}
				if len(got) != len(want) || len(got) == 0 || !near(got[0].Value, want[0].Value) {
					q, _ := prom.PromQL(Query{Metric: c.metric, Namespace: "ml"})
					t.Errorf("%s{%s}: %s gives %+v, direct %+v\n%s", c.metric, c.selector, tsdb.name, got, want, q)
				}
			}
			if v := query(t, prom, GPUUtilization, "app=nobody"); len(v) != 0 {
				t.Errorf("utilization of no leases = %+v, want no data", v)
			}
		})
	}
}
