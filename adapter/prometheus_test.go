package adapter

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestPrometheusBackendAgreesWithDirect: a real Prometheus and a real
// VictoriaMetrics scrape the allocator and the daemon; the built-in PromQL
// gives what the direct backend gives.
func TestPrometheusBackendAgreesWithDirect(t *testing.T) {
	for _, tsdb := range []struct {
		name  string
		start func(t *testing.T, targets []string) string
	}{
		{"prometheus", startPrometheus},
		{"victoria-metrics", startVictoriaMetrics},
	} {
		t.Run(tsdb.name, func(t *testing.T) {
			p := newTestPool(t, 2)
			p.acquire(t, "tf-0", "tf-training", 6, 50)
			p.acquire(t, "tf-1", "tf-training", 8, 50)
			p.acquire(t, "web-0", "web", 2, 25)
			targets := []string{hostPort(t, p.allocator.URL), hostPort(t, p.daemonSrv.URL)}
			prom, err := NewPrometheus(tsdb.start(t, targets), "")
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

func hostPort(t *testing.T, raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func scrapeConfig(t *testing.T, targets []string) string {
	cfg := "global: {scrape_interval: 1s}\nscrape_configs:\n- job_name: gpupool\n  static_configs:\n  - targets: ["
	for i, tg := range targets {
		if i > 0 {
			cfg += ", "
		}
		cfg += fmt.Sprintf("%q", tg)
	}
	cfg += "]\n"
	path := filepath.Join(t.TempDir(), "scrape.yml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startTSDB runs a Debian-packaged time-series database until the test
// ends and returns its base URL once it answers.
func startTSDB(t *testing.T, addr string, name string, args ...string) string {
	bin, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed (make deps installs it): %v", name, err)
	}
	cmd := exec.Command(bin, args...)
	log := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = f.Close() })
	base := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := NewPrometheus(base, "")
		if err == nil {
			if _, err = p.Query(context.Background(), Query{Metric: PendingRequests, Namespace: "ml", Selector: everything()}); err == nil {
				return base
			}
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(log)
			t.Fatalf("%s did not start: %v\n%s", name, err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func startPrometheus(t *testing.T, targets []string) string {
	addr := freePort(t)
	return startTSDB(t, addr, "prometheus", "--config.file="+scrapeConfig(t, targets), "--storage.tsdb.path="+t.TempDir(),
		"--web.listen-address="+addr)
}

func startVictoriaMetrics(t *testing.T, targets []string) string {
	addr := freePort(t)
	return startTSDB(t, addr, "victoria-metrics", "-promscrape.config="+scrapeConfig(t, targets), "-storageDataPath="+t.TempDir(),
		"-httpListenAddr="+addr, "-search.latencyOffset=0s", "-search.disableCache")
}
