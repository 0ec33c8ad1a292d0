package adapter

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/gpupool/gpupool/gpuserver/api"
	"github.com/gpupool/gpupool/internal/metricstest"
)

// tsdbs run the built-in queries against each TSDB evaluating the
// recording rules they read.
var tsdbs = []struct {
	name  string
	start func(t testing.TB, c metricstest.PrometheusConfig, targets ...string) string
}{
	{"prometheus", metricstest.StartPrometheusWith},
	{"victoria-metrics", metricstest.StartVictoriaMetricsWith},
}

func startTSDB(t *testing.T, start func(testing.TB, metricstest.PrometheusConfig, ...string) string, targets ...string) *Prometheus {
	t.Helper()
	c := metricstest.PrometheusConfig{Interval: time.Second, RuleFiles: []string{metricstest.GpupoolRules(t)}}
	prom, err := NewPrometheus(start(t, c, targets...), "")
	if err != nil {
		t.Fatal(err)
	}
	return prom
}

// TestPrometheusBackendAgreesWithDirect: a real Prometheus and a real
// VictoriaMetrics scrape the allocator and the daemon; the built-in PromQL
// gives what the direct backend gives, dated by fresh samples. Once the
// targets stop answering, their series go stale and there is no data, not
// a 0.
func TestPrometheusBackendAgreesWithDirect(t *testing.T) {
	t.Parallel()
	for _, tsdb := range tsdbs {
		t.Run(tsdb.name, func(t *testing.T) {
			t.Parallel() // each its own pool and TSDB, most of the time waiting for scrapes
			p := newTestPool(t, 2)
			p.acquire(t, "tf-0", "tf-training", 6, 50)
			p.acquire(t, "tf-1", "tf-training", 8, 50)
			p.acquire(t, "web-0", "web", 2, 25)
			prom := startTSDB(t, tsdb.start, p.allocator.URL, p.daemonSrv.URL)
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
				if len(got) > 0 && time.Since(got[0].Time) > 10*time.Second {
					t.Errorf("%s{%s}: dated %s, %s ago, scraped every second", c.metric, c.selector, got[0].Time, time.Since(got[0].Time))
				}
			}
			// Round trips probed once the TSDB scrapes the daemon, so that its
			// rate sees them: one p99, for tcp, through the recorded window.
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			_ = api.DialProbe(ctx, p.probeAddr, "client-0", 10*time.Millisecond, func(time.Duration) {})
			cancel()
			var latency []Value
			for deadline := time.Now().Add(30 * time.Second); len(latency) == 0 && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
				latency = query(t, prom, RDMALatency, "app=tf-training")
			}
			if len(latency) != 1 || latency[0].Labels["transport"] != api.TransportTCP || latency[0].Value <= 0 || latency[0].Value > 0.08 ||
				time.Since(latency[0].Time) > 10*time.Second {
				t.Errorf("latency = %+v, want one fresh tcp p99 in (0, 80ms]", latency)
			}
			if v := query(t, prom, GPUUtilization, "app=nobody"); len(v) != 0 {
				t.Errorf("utilization of no leases = %+v, want no data", v)
			}

			p.daemonSrv.Close()
			p.allocator.Close()
			for _, metric := range []string{GPUUtilization, MemoryPressure, PendingRequests} {
				got := query(t, prom, metric, "app=tf-training")
				for deadline := time.Now().Add(30 * time.Second); len(got) != 0 && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
					got = query(t, prom, metric, "app=tf-training")
				}
				if len(got) != 0 {
					t.Errorf("%s with the targets down = %+v, want no data", metric, got)
				}
			}
		})
	}
}

// TestPrometheusBackendServesOnlyWhatWasMeasured, against a target whose
// series say exactly what was measured and when:
//   - the TSDB answers from the last sample of a series, stamped with the
//     evaluation time, for its lookback delta (as after Prometheus restarts
//     while a target is down); the backend dates the value by the oldest
//     sample behind it, so the freshness guard refuses a two-minute-old
//     value (503) instead of serving it as current;
//   - a lease the daemon has not measured has its grant and no use series:
//     it is left out of the memory pressure, not counted as using nothing.
func TestPrometheusBackendServesOnlyWhatWasMeasured(t *testing.T) {
	t.Parallel()
	for _, tsdb := range tsdbs {
		t.Run(tsdb.name, func(t *testing.T) {
			t.Parallel() // each its own pool and TSDB, most of the time waiting for scrapes
			old := time.Now().Add(-2 * time.Minute).Truncate(time.Millisecond)
			// lease-1's samples carry their (old) time, the others are
			// fresh; lease-3 is not measured yet.
			exposition := fmt.Sprintf(`# TYPE bitfusion_lease_gpu_utilization gauge
bitfusion_lease_gpu_utilization{server="gpu-0",gpu="0",lease="lease-1",namespace="ml",pod="tf-0",label_app="tf-training"} 0.8 %[1]d
bitfusion_lease_gpu_utilization{server="gpu-0",gpu="1",lease="lease-2",namespace="ml",pod="tf-1",label_app="tf-training"} 0.4
# TYPE bitfusion_lease_allocated_gpus gauge
bitfusion_lease_allocated_gpus{lease="lease-1",namespace="ml",server="gpu-0"} 0.5 %[1]d
bitfusion_lease_allocated_gpus{lease="lease-2",namespace="ml",server="gpu-0"} 0.5
bitfusion_lease_allocated_gpus{lease="lease-3",namespace="ml",server="gpu-0"} 0.5
# TYPE bitfusion_lease_memory_used_bytes gauge
bitfusion_lease_memory_used_bytes{server="gpu-0",gpu="1",lease="lease-2",namespace="ml",pod="tf-1",label_app="tf-training"} 1e9
# TYPE bitfusion_lease_memory_granted_bytes gauge
bitfusion_lease_memory_granted_bytes{server="gpu-0",gpu="1",lease="lease-2",namespace="ml",pod="tf-1",label_app="tf-training"} 4e9
bitfusion_lease_memory_granted_bytes{server="gpu-0",gpu="2",lease="lease-3",namespace="ml",pod="tf-2",label_app="tf-training"} 4e9
`, old.UnixMilli())
			target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/plain; version=0.0.4")
				_, _ = fmt.Fprint(w, exposition)
			}))
			t.Cleanup(target.Close)
			prom := startTSDB(t, tsdb.start, target.URL)
			var got []Value
			for deadline := time.Now().Add(30 * time.Second); len(got) == 0 && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
				got = query(t, prom, GPUUtilization, "app=tf-training")
			}
			if len(got) != 1 || !near(got[0].Value, 0.6) || !got[0].Time.Equal(old) {
				t.Fatalf("utilization = %+v, want 0.6 dated %s (lease-1's samples)", got, old)
			}
			if err := askAsTheHPA(prom); !apierrors.IsServiceUnavailable(err) {
				t.Errorf("the HPA's answer from a two-minute-old sample: %v, want 503 ServiceUnavailable", err)
			}
			if got := query(t, prom, MemoryPressure, "app=tf-training"); len(got) != 1 || !near(got[0].Value, 0.25) || time.Since(got[0].Time) > 10*time.Second {
				t.Errorf("memory pressure = %+v, want lease-2's 0.25 (lease-3 unmeasured), fresh", got)
			}
		})
	}
}

// TestPrometheusBackendDatesByTheRuleEvaluation: a recorded series whose
// rule stopped evaluating (an evaluation that fails leaves no staleness
// marker) is returned from its last sample for the lookback delta, beside
// fresh samples of the series it was computed from; the value is dated by
// that last evaluation, so the freshness guard refuses it.
func TestPrometheusBackendDatesByTheRuleEvaluation(t *testing.T) {
	t.Parallel()
	for _, tsdb := range tsdbs {
		t.Run(tsdb.name, func(t *testing.T) {
			t.Parallel() // each its own pool and TSDB, most of the time waiting for scrapes
			old := time.Now().Add(-2 * time.Minute).Truncate(time.Millisecond)
			// The recorded series, two minutes old, as the TSDB would hold
			// them; no rules are evaluated.
			exposition := fmt.Sprintf(`# TYPE bitfusion_lease_gpu_utilization gauge
bitfusion_lease_gpu_utilization{server="gpu-0",gpu="0",lease="lease-1",namespace="ml",pod="tf-0",label_app="tf-training"} 0.4
# TYPE bitfusion_lease_allocated_gpus gauge
bitfusion_lease_allocated_gpus{lease="lease-1",namespace="ml",server="gpu-0"} 0.5
# TYPE lease:bitfusion_lease_busy_gpus gauge
lease:bitfusion_lease_busy_gpus{server="gpu-0",lease="lease-1",namespace="ml",pod="tf-0",label_app="tf-training"} 0.2 %[1]d
# TYPE lease:bitfusion_lease_held_gpus gauge
lease:bitfusion_lease_held_gpus{server="gpu-0",lease="lease-1",namespace="ml",pod="tf-0",label_app="tf-training"} 0.5 %[1]d
`, old.UnixMilli())
			target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/plain; version=0.0.4")
				_, _ = fmt.Fprint(w, exposition)
			}))
			t.Cleanup(target.Close)
			prom, err := NewPrometheus(tsdb.start(t, metricstest.PrometheusConfig{Interval: time.Second}, target.URL), "")
			if err != nil {
				t.Fatal(err)
			}
			var got []Value
			for deadline := time.Now().Add(30 * time.Second); len(got) == 0 && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
				got = query(t, prom, GPUUtilization, "app=tf-training")
			}
			if len(got) != 1 || !near(got[0].Value, 0.4) || !got[0].Time.Equal(old) {
				t.Errorf("utilization = %+v, want 0.4 dated %s (the rule's last evaluation)", got, old)
			}
		})
	}
}

// TestPrometheusBackendReadsTheQueryAPI, against a server answering as
// Prometheus's query API may: each query carries the evaluation timeout;
// a vector's samples become values, NaN left out; an error, a warning (a
// partial answer) or a result that is not a vector fails the query,
// which the HPA gets as a backend error.
func TestPrometheusBackendReadsTheQueryAPI(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		answer string
		want   []Value
		// wantErr is in the error, when the query fails.
		wantErr string
	}{
		{"vector", http.StatusOK, `{"status":"success","data":{"resultType":"vector","result":[
			{"metric":{"__name__":"x","model":"H100"},"value":[1700000000.5,"0.75"]},
			{"metric":{"model":"A100"},"value":[1700000000.5,"NaN"]}]}}`,
			[]Value{{Labels: map[string]string{"model": "H100"}, Value: 0.75, Time: time.UnixMilli(1700000000500)}}, ""},
		{"error", http.StatusBadRequest, `{"status":"error","errorType":"bad_data","error":"parse error at char 3"}`, nil, "bad_data: parse error at char 3"},
		{"warning", http.StatusOK, `{"status":"success","warnings":["store eu-1 did not answer"],"data":{"resultType":"vector","result":[]}}`,
			nil, "warns: store eu-1 did not answer"},
		{"matrix", http.StatusOK, `{"status":"success","data":{"resultType":"matrix","result":[]}}`, nil, "gives a matrix, want a vector"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var timeout string
			server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_ = r.ParseForm()
				timeout = r.Form.Get("timeout")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.answer)
			}))
			t.Cleanup(server.Close)
			prom, err := NewPrometheus(server.URL, "")
			if err != nil {
				t.Fatal(err)
			}
			got, err := prom.instant(context.Background(), PoolUnallocatedGPUs, "x")
			if timeout != queryTimeout.String() {
				t.Errorf("timeout %q, want %s", timeout, queryTimeout)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("error %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v (%v), want %+v", got, err, tc.want)
			}
		})
	}
}
