package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator/client"
)

// loadSummary is the part of gpupool-load's --summary-json the tests read.
type loadSummary struct {
	RegisteredServers, LiveLeases, UsageReads int64
	SteadyAfter                               time.Duration
	Heartbeat, Acquire, Renew, Adapter        struct {
		Count    int
		P50, P99 time.Duration
	}
	MetricsBytes          int
	MetricsScrape         struct{ P50, Max time.Duration }
	AllocatorCPUPerSecond float64
	AllocatorRSSBytes     int64
	Errors                map[string]int
}

// runLoad runs gpupool-load with args and the summary file, its output
// going to out, and returns its summary.
func runLoad(t testing.TB, out io.Writer, args ...string) loadSummary {
	t.Helper()
	path := filepath.Join(t.TempDir(), "summary.json")
	cmd := exec.Command(filepath.Join(binDir, "gpupool-load"), append(args, "--summary-json", path)...)
	cmd.Stdout, cmd.Stderr = out, out
	// Exit status 1 says that calls failed, which the summary counts.
	var exit *exec.ExitError
	if err := cmd.Run(); err != nil && (!errors.As(err, &exit) || exit.ExitCode() != 1) {
		t.Errorf("gpupool-load: %v", err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("gpupool-load wrote no summary: %v", err)
	}
	var s loadSummary
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestLoadToolCountsWhatTheAllocatorHolds runs gpupool-load for a few
// seconds with 20 servers and 50 leases against an allocator with tokens on
// and the adapter, keeping the leases, and checks that its summary says
// what the allocator's API says: the servers registered and heart-beat, the
// leases live in the namespaces whose tokens acquired them.
func TestLoadToolCountsWhatTheAllocatorHolds(t *testing.T) {
	config := writePoolConfig(t, map[string]int64{"team-a": noQuota, "team-b": noQuota})
	a := startAllocator(t, "--data-dir", t.TempDir(), "--config", config.Path)
	logs := &syncBuffer{}
	external := startAdapter(t, logs, a.URL, config.adminTokenFile(t)).API
	var out strings.Builder
	s := runLoad(t, &out, "--allocator", a.URL, "--pool-config", config.Path, "--servers", "20", "--leases", "50", "--group", "10",
		"--heartbeat", "500ms", "--duration", "6s", "--progress", "1s", "--keep",
		"--allocator-pid", strconv.Itoa(a.cmd.Process.Pid), "--adapter", external, "--adapter-insecure")
	t.Log(out.String())
	if len(s.Errors) > 0 || s.RegisteredServers != 20 || s.LiveLeases != 50 || s.Acquire.Count != 50 || s.Heartbeat.Count == 0 {
		t.Errorf("summary: %d servers registered, %d leases live, %d acquisitions, %d heartbeats, errors %v; want 20, 50, 50, some, none",
			s.RegisteredServers, s.LiveLeases, s.Acquire.Count, s.Heartbeat.Count, s.Errors)
	}
	if s.Adapter.Count == 0 || s.UsageReads == 0 || s.MetricsBytes == 0 || s.AllocatorRSSBytes == 0 {
		t.Errorf("summary: %d adapter answers, %d usage reads, /metrics %d bytes, allocator RSS %d bytes; want each above 0\nadapter:\n%s",
			s.Adapter.Count, s.UsageReads, s.MetricsBytes, s.AllocatorRSSBytes, logs)
	}

	admin := newClient(t, a.URL, config.Admin)
	pool, err := admin.Pool(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	servers, leasesOnServers := 0, 0
	for _, srv := range pool.Servers {
		if strings.HasPrefix(srv.Name, "load-") && srv.Schedulable {
			servers++
		}
		leasesOnServers += srv.Leases
	}
	leases, err := admin.Leases(context.Background(), client.LeaseFilter{})
	if err != nil {
		t.Fatal(err)
	}
	byNamespace := map[string]int{}
	for _, l := range leases {
		byNamespace[l.Namespace]++
	}
	// Groups of 10 leases take the namespaces in turn: groups 0, 2 and 4
	// team-a's, 1 and 3 team-b's.
	want := map[string]int{"team-a": 30, "team-b": 20}
	if int64(servers) != s.RegisteredServers || int64(leasesOnServers) != s.LiveLeases || int64(len(leases)) != s.LiveLeases ||
		fmt.Sprint(byNamespace) != fmt.Sprint(want) {
		t.Errorf("allocator: %d schedulable load servers, %d leases on servers, %d listed, by namespace %v; the summary says %d servers, %d leases, want by namespace %v",
			servers, leasesOnServers, len(leases), byNamespace, s.RegisteredServers, s.LiveLeases, want)
	}
}

// BenchmarkThousandServers runs gpupool-load with 1,000 servers of 8 GPUs
// and 10,000 leases of 10% against the allocator on bolt with tokens on and
// the adapter on the direct backend, reading the simulated daemons, and
// reports the summary's figures (`make scale`; docs/measurements/thousand-servers.md has them).
// GPUPOOL_SCALE_DURATION sets the run's length (150s by default).
func BenchmarkThousandServers(b *testing.B) {
	duration := "150s"
	if d := os.Getenv("GPUPOOL_SCALE_DURATION"); d != "" {
		duration = d
	}
	namespaces := map[string]int64{}
	for i := range 10 {
		namespaces[fmt.Sprintf("team-%d", i)] = noQuota
	}
	for range b.N {
		config := writePoolConfig(b, namespaces)
		a := startAllocator(b, "--data-dir", b.TempDir(), "--config", config.Path)
		logs := &syncBuffer{}
		external := startAdapter(b, logs, a.URL, config.adminTokenFile(b)).API
		s := runLoad(b, os.Stdout, "--allocator", a.URL, "--pool-config", config.Path, "--servers", "1000", "--leases", "10000",
			"--percent", "10", "--group", "1000", "--duration", duration, "--progress", "15s", "--concurrency", "64",
			"--allocator-pid", strconv.Itoa(a.cmd.Process.Pid), "--adapter", external, "--adapter-insecure")
		if failed := grep(logs.String(), "level=ERROR"); failed != "" {
			b.Logf("the adapter's errors:\n%s", failed)
		}
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		b.ReportMetric(ms(s.Heartbeat.P99), "heartbeat-p99-ms")
		b.ReportMetric(ms(s.Acquire.P99), "acquire-p99-ms")
		b.ReportMetric(ms(s.Adapter.P99), "adapter-p99-ms")
		b.ReportMetric(s.AllocatorCPUPerSecond, "allocator-cpu-s/s")
		b.ReportMetric(float64(s.AllocatorRSSBytes>>20), "allocator-rss-MiB")
		b.ReportMetric(float64(s.MetricsBytes), "metrics-bytes")
		b.ReportMetric(ms(s.MetricsScrape.Max), "scrape-max-ms")
		b.ReportMetric(0, "ns/op")
	}
}
