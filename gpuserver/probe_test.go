package gpuserver

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestProbeMeasuresBothSides: a client and a server probe each other over
// loopback TCP; both record round trips, labelled with the transport.
func TestProbeMeasuresBothSides(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	server := NewLatencyHistogram()
	go ServeProbes(ctx, ln, "gpu-a", 5*time.Millisecond, server, slog.Default())
	client := NewLatencyHistogram()
	obs := client.WithLabelValues("gpu-a", "node-7", TransportTCP)
	go func() {
		_ = DialProbe(ctx, ln.Addr().String(), "node-7", 5*time.Millisecond, func(d time.Duration) { obs.Observe(d.Seconds()) })
	}()
	count := func(h *prometheus.HistogramVec) uint64 {
		reg := prometheus.NewRegistry()
		reg.MustRegister(h)
		fams, _ := reg.Gather()
		for _, f := range fams {
			for _, m := range f.GetMetric() {
				return m.GetHistogram().GetSampleCount()
			}
		}
		return 0
	}
	deadline := time.Now().Add(5 * time.Second)
	for count(server) < 5 || count(client) < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("after 5s: %d server and %d client round trips, want at least 5 each", count(server), count(client))
		}
		time.Sleep(10 * time.Millisecond)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(server)
	fams, _ := reg.Gather()
	labels := fams[0].GetMetric()[0].GetLabel()
	got := map[string]string{}
	for _, l := range labels {
		got[l.GetName()] = l.GetValue()
	}
	if got["server"] != "gpu-a" || got["client_node"] != "node-7" || got["transport"] != "tcp" {
		t.Errorf("server-side labels = %v", got)
	}
	if sum := fams[0].GetMetric()[0].GetHistogram().GetSampleSum(); sum <= 0 || sum > 5 {
		t.Errorf("round trips sum to %vs: not a loopback latency", sum)
	}
}
