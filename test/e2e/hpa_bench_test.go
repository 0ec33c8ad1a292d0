package e2e

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// BenchmarkHPAReaction measures, with the HPA controller's default 15 s
// sync, the seconds from a step in tf-training's work to the HPA's
// desiredReplicas changing: up (0.25 -> 1.5 GPUs) and down (1.5 -> 0.3),
// twice, with the direct backend and with the Prometheus backend scraping
// every 15 s. The steps come at four phases of the sync period (each
// after the HPA last acted, plus 0, 3.75, 7.5 or 11.25 s), since when the
// load moves within the period is chance. It reports the mean and the
// slowest step.
func BenchmarkHPAReaction(b *testing.B) {
	for _, o := range []rigOptions{
		{backend: "direct"},
		{backend: "prometheus", scrape: 15 * time.Second},
	} {
		b.Run("backend="+o.backend, func(b *testing.B) {
			r := startHPARig(b, o)
			waitReplicas(b, r.cp.Client, 1, 3*time.Minute)
			var steps []time.Duration
			for range b.N {
				for i, load := range []float64{1.5, 0.3, 1.5, 0.3} {
					time.Sleep(time.Duration(i) * 3750 * time.Millisecond)
					from := tfTrainingHPAStatus(b, r.cp.Client).Status.DesiredReplicas
					r.setLoad(b, load)
					start := time.Now()
					for tfTrainingHPAStatus(b, r.cp.Client).Status.DesiredReplicas == from {
						if time.Since(start) > 3*time.Minute {
							b.Fatalf("the HPA still wants %d replicas 3 minutes after the load went to %g", from, load)
						}
						time.Sleep(100 * time.Millisecond)
					}
					steps = append(steps, time.Since(start))
					b.Logf("load -> %g GPUs: desiredReplicas %d -> %d after %v", load, from, tfTrainingHPAStatus(b, r.cp.Client).Status.DesiredReplicas, steps[len(steps)-1].Round(100*time.Millisecond))
					waitReplicas(b, r.cp.Client, int32(expectedReplicas(load)), 3*time.Minute)
				}
			}
			var sum time.Duration
			for _, s := range steps {
				sum += s
			}
			b.ReportMetric(sum.Seconds()/float64(len(steps)), "s/step")
			b.ReportMetric(slices.Max(steps).Seconds(), "max-s/step")
		})
	}
}

// BenchmarkAdapterThroughAPIServer sends 200 external-metric requests a
// second, open loop, through the kube-apiserver's aggregator to the
// adapter (direct backend), as the HPA's reads travel, and reports the
// latency's p50 and p99.
func BenchmarkAdapterThroughAPIServer(b *testing.B) {
	const rate, seconds = 200, 10
	r := startHPARig(b, rigOptions{backend: "direct"})
	waitReplicas(b, r.cp.Client, 1, 3*time.Minute)
	cfg := rest.CopyConfig(r.cp.Config)
	cfg.QPS = -1 // no client-side throttling: the load is the point
	raw, err := newRawGetter(cfg)
	if err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	var latencies []time.Duration
	var failed int
	b.ResetTimer()
	for range b.N {
		var wg sync.WaitGroup
		tick := time.NewTicker(time.Second / rate)
		for range rate * seconds {
			<-tick.C
			wg.Go(func() {
				start := time.Now()
				_, err := raw(context.Background())
				d := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failed++
					return
				}
				latencies = append(latencies, d)
			})
		}
		tick.Stop()
		wg.Wait()
	}
	b.StopTimer()
	if failed > 0 {
		b.Errorf("%d of %d requests failed", failed, failed+len(latencies))
	}
	slices.Sort(latencies)
	q := func(p float64) float64 {
		return float64(latencies[int(p*float64(len(latencies)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(float64(len(latencies))/float64(b.N*seconds), "requests/s")
}
