package e2e

import (
	"bufio"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestGPUServerAttributesRunAndMeasuresLatency: a gpupool-server daemon on
// the simulated source registers with the allocator; `gpupool run` reports
// its command's PID to it and probes the data path; the daemon attributes
// the command's GPU use to the lease and publishes the round trips it
// measured, and the client pushes its own. Tokens are on: the daemon
// holds the servers token, `gpupool run` namespace ml's.
func TestGPUServerAttributesRunAndMeasuresLatency(t *testing.T) {
	config := writePoolConfig(t, map[string]int64{"ml": noQuota})
	a := startAllocator(t, "--data-dir", t.TempDir(), "--config", config.Path)
	srv := exec.Command(filepath.Join(binDir, "gpupool-server"), "--allocator", a.URL, "--name", "sim-0",
		"--listen", "127.0.0.1:0", "--probe-listen", "127.0.0.1:0", "--simulate-gpus", "H100:80Gi:2",
		"--interval", "200ms", "--process-every", "1", "--heartbeat", "500ms")
	srv.Env = append(os.Environ(), "GPUPOOL_TOKEN="+config.Servers)
	stderr, err := srv.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		re := regexp.MustCompile(`gpu server serving.*address=(http://\S+)`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				urlc <- m[1]
			}
		}
	}()
	var daemonURL string
	select {
	case daemonURL = <-urlc:
	case <-time.After(20 * time.Second):
		t.Fatal("gpupool-server did not start")
	}
	c := newClient(t, a.URL, config.Tenant["ml"])
	waitFor(t, func() bool { p, err := c.Pool(context.Background()); return err == nil && len(p.Servers) == 1 })

	var mu sync.Mutex
	var pushed strings.Builder
	push := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			if z, err := gzip.NewReader(r.Body); err == nil {
				body = z
			}
		}
		b, _ := io.ReadAll(body)
		mu.Lock()
		pushed.Write(b)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer push.Close()

	run := exec.Command(filepath.Join(binDir, "gpupool"), "run", "-n", "1", "-p", "50", "--pod", "trainer-0",
		"--metrics-push-url", push.URL, "--", "sleep", "4")
	run.Env = append(append(os.Environ(), config.tenantEnv(t, a.URL, "ml")...), "NODE_NAME=client-node-1")
	var out strings.Builder
	run.Stdout, run.Stderr = &out, &out
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	// While the command runs, its process is the lease's: the simulated
	// GPU runs it under the PID gpupool run reported.
	attributed := regexp.MustCompile(`bitfusion_lease_processes\{[^}]*pod="trainer-0"[^}]*\} 1`)
	waitFor(t, func() bool { return attributed.MatchString(metricsOf(t, daemonURL)) })
	if !regexp.MustCompile(`bitfusion_lease_gpu_utilization\{[^}]*pod="trainer-0"[^}]*\} 0\.[0-9]*[1-9]`).MatchString(metricsOf(t, daemonURL)) {
		t.Errorf("no utilization attributed to trainer-0's lease:\n%s", grep(metricsOf(t, daemonURL), "bitfusion_lease_gpu_utilization"))
	}
	if err := run.Wait(); err != nil {
		t.Fatalf("gpupool run: %v\n%s", err, out.String())
	}
	m := metricsOf(t, daemonURL)
	if !regexp.MustCompile(`bitfusion_rdma_latency_seconds_count\{client_node="client-node-1",server="sim-0",transport="tcp"\} [1-9]`).MatchString(m) {
		t.Errorf("daemon measured no round trips:\n%s", grep(m, "rdma_latency_seconds_count"))
	}
	mu.Lock()
	got := pushed.String()
	mu.Unlock()
	if !regexp.MustCompile(`bitfusion_rdma_latency_seconds_count\{job="gpupool-run",[^}]*client_node="client-node-1",server="sim-0",transport="tcp"\} [1-9]`).MatchString(got) {
		t.Errorf("the client pushed no round trips:\n%s", grep(got, "_count"))
	}
}

func metricsOf(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestSimulatedGPUsHeldByProcesses: gpupool-server with
// --simulated-device-dir makes each simulated GPU a file named by its
// UUID; gpuload, given one GPU's UUID as a GPU pod's container is, holds
// that file, and the daemon sees a process on that GPU (nobody's: it runs
// in no pod), until gpuload ends on SIGTERM. A GPU whose file is removed
// is lost, and the pool marks it unhealthy.
func TestSimulatedGPUsHeldByProcesses(t *testing.T) {
	config := writePoolConfig(t, map[string]int64{"ml": noQuota})
	a := startAllocator(t, "--data-dir", t.TempDir(), "--config", config.Path)
	devices := t.TempDir()
	addr := "127.0.0.1:" + freePort(t)
	logs := &syncBuffer{}
	startDaemon(t, logs, config.Servers, "--allocator", a.URL, "--name", "sim-0", "--listen", addr, "--probe-listen", "127.0.0.1:0",
		"--simulate-gpus", "H100:80Gi:2", "--simulated-device-dir", devices, "--interval", "200ms", "--process-every", "1", "--heartbeat", "500ms")
	processesOn := func(gpu, n int) bool {
		return strings.Contains(metricsOf(t, "http://"+addr), fmt.Sprintf("bitfusion_gpu_unattributed_processes{gpu=\"%d\",server=\"sim-0\"} %d\n", gpu, n))
	}
	waitFor(t, func() bool { return processesOn(1, 0) }) // the leases are known

	load := startBinaryEnv(t, logs, []string{"GPUPOOL_GPU_UUIDS=GPU-sim-sim-0-1"}, "gpuload", regexp.MustCompile(`gpuload: holding`),
		"--device-dir", devices)
	waitFor(t, func() bool { return processesOn(1, 1) })
	if !processesOn(0, 0) {
		t.Errorf("a process on GPU 0, which gpuload was not given:\n%s", grep(metricsOf(t, "http://"+addr), "unattributed"))
	}
	if err := load.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := load.Wait(); err != nil {
		t.Errorf("gpuload on SIGTERM: %v, want exit 0", err)
	}
	if !strings.Contains(logs.String(), "gpuload: GPUPOOL_GPU_UUIDS=GPU-sim-sim-0-1\n") {
		t.Errorf("gpuload did not print its environment:\n%s", grep(logs.String(), "gpuload"))
	}
	waitFor(t, func() bool { return processesOn(1, 0) })

	if err := os.Remove(filepath.Join(devices, "GPU-sim-sim-0-0")); err != nil {
		t.Fatal(err)
	}
	admin := newClient(t, a.URL, config.Admin)
	waitFor(t, func() bool {
		p, err := admin.Pool(context.Background())
		return err == nil && len(p.Servers) == 1 && !p.Servers[0].GPUs[0].Healthy && p.Servers[0].GPUs[1].Healthy
	})
}
