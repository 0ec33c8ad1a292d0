package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/internal/metricstest"
)

// webhookAlert is an alert as Alertmanager's webhook receiver posts it.
type webhookAlert struct {
	Status      string            `json:"status"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// receiver records what Alertmanager posts, with when it arrived.
type receiver struct {
	mu     sync.Mutex
	events []receivedAlert
}

type receivedAlert struct {
	webhookAlert
	at time.Time
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	var body struct {
		Alerts []webhookAlert `json:"alerts"`
	}
	if err := json.NewDecoder(req.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range body.Alerts {
		r.events = append(r.events, receivedAlert{a, time.Now()})
	}
}

// wait returns the first alert with that name, status and labels that
// arrived after since.
func (r *receiver) wait(t *testing.T, name, status string, labels map[string]string, since time.Time, within time.Duration) receivedAlert {
	t.Helper()
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		r.mu.Lock()
		for _, e := range r.events {
			if e.Labels["alertname"] != name || e.Status != status || e.at.Before(since) {
				continue
			}
			match := true
			for k, v := range labels {
				match = match && e.Labels[k] == v
			}
			if match {
				r.mu.Unlock()
				return e
			}
		}
		r.mu.Unlock()
	}
	t.Fatalf("no %s %s alert %v reached the receiver within %v", status, name, labels, within)
	return receivedAlert{}
}

// shortFor shortens every alert's `for` so the test need not wait minutes;
// the expressions and thresholds are the shipped ones.
func shortFor(t *testing.T) string {
	rules, err := os.ReadFile("../../alerts/gpupool-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rules.yaml")
	short := regexp.MustCompile(`(?m)^(\s+for:) \S+$`).ReplaceAll(rules, []byte("$1 5s"))
	if err := os.WriteFile(path, short, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestAlertsReachAlertmanager: Prometheus with the shipped rules scrapes
// an allocator and two GPU servers and sends to a real Alertmanager,
// whose webhook receiver is the test. Killing a GPU server fires
// GPUPoolServerDown; filling a namespace's quota fires
// GPUPoolQuotaNearlyExhausted; each resolves when its fault ends.
func TestAlertsReachAlertmanager(t *testing.T) {
	am, err := exec.LookPath("prometheus-alertmanager")
	if err != nil {
		t.Fatal("prometheus-alertmanager is not installed (make deps installs it)")
	}
	dir := t.TempDir()
	config := writePoolConfig(t, map[string]int64{"ml": 200})
	a := startAllocator(t, "--data-dir", t.TempDir(), "--config", config.Path, "--heartbeat-timeout", "5s")
	ml := newClient(t, a.URL, config.Tenant["ml"])
	logs := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pool:\n%s", tail(logs.String(), 40))
		}
	})
	servers := map[string]string{}
	start := func(name string) *exec.Cmd {
		if servers[name] == "" {
			servers[name] = "127.0.0.1:" + freePort(t)
		}
		return startDaemon(t, logs, config.Servers, "--allocator", a.URL, "--name", name, "--listen", servers[name], "--probe-listen", "127.0.0.1:0", "--simulate-gpus", "H100:80Gi:2",
			"--interval", "500ms", "--heartbeat", "500ms")
	}
	start("gpu-0")
	gpu1 := start("gpu-1")

	hook := &receiver{}
	hookSrv := httptest.NewServer(hook)
	t.Cleanup(hookSrv.Close)
	amAddr := "127.0.0.1:" + freePort(t)
	amConfig := filepath.Join(dir, "alertmanager.yml")
	if err := os.WriteFile(amConfig, []byte(fmt.Sprintf(`route:
  receiver: test
  group_by: [alertname, server, namespace]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: test
    webhook_configs: [{url: %q, send_resolved: true}]
`, hookSrv.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	amCmd := exec.Command(am, "--config.file="+amConfig, "--storage.path="+t.TempDir(), "--web.listen-address="+amAddr,
		"--cluster.listen-address=", "--log.level=warn")
	amCmd.Stdout, amCmd.Stderr = logs, logs
	if err := amCmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = amCmd.Process.Kill(); _ = amCmd.Wait() })
	metricstest.StartPrometheusWith(t, metricstest.PrometheusConfig{Interval: time.Second,
		RuleFiles: []string{shortFor(t)}, Alertmanager: amAddr}, a.URL, "http://"+servers["gpu-0"], "http://"+servers["gpu-1"])

	// A GPU server dies: no heartbeat for 30 s, then the shortened for.
	killed := time.Now()
	_ = gpu1.Process.Kill()
	down := hook.wait(t, "GPUPoolServerDown", "firing", map[string]string{"server": "gpu-1", "severity": "critical"}, killed, 90*time.Second)
	if want := "https://github.com/gpupool/gpupool/blob/main/docs/runbook.md#gpupoolserverdown"; down.Annotations["runbook_url"] != want {
		t.Errorf("runbook_url %q, want %q", down.Annotations["runbook_url"], want)
	}
	t.Logf("GPUPoolServerDown fired %v after the kill (30 s heartbeat threshold + for 5s)", down.at.Sub(killed).Round(time.Second))
	restarted := time.Now()
	start("gpu-1")
	resolved := hook.wait(t, "GPUPoolServerDown", "resolved", map[string]string{"server": "gpu-1"}, restarted, 60*time.Second)
	t.Logf("GPUPoolServerDown resolved %v after the restart", resolved.at.Sub(restarted).Round(time.Second))

	// Namespace ml fills its quota of two GPUs, with its own token.
	filled := time.Now()
	var leases []string
	for i := range 2 {
		l, err := ml.Acquire(context.Background(), api.AcquireRequest{Namespace: "ml", GPUAmount: 1, GPUPercent: 100, TTL: "10m",
			Owner: api.Owner{Pod: fmt.Sprint("trainer-", i)}})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l.ID)
	}
	full := hook.wait(t, "GPUPoolQuotaNearlyExhausted", "firing", map[string]string{"namespace": "ml", "severity": "warning"}, filled, 60*time.Second)
	if full.Annotations["runbook_url"] == "" || full.Annotations["summary"] != "Namespace ml has used 100% of its GPU quota." {
		t.Errorf("annotations %v", full.Annotations)
	}
	t.Logf("GPUPoolQuotaNearlyExhausted fired %v after the quota filled", full.at.Sub(filled).Round(time.Second))
	released := time.Now()
	for _, id := range leases {
		if err := ml.Release(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	resolved = hook.wait(t, "GPUPoolQuotaNearlyExhausted", "resolved", map[string]string{"namespace": "ml"}, released, 60*time.Second)
	t.Logf("GPUPoolQuotaNearlyExhausted resolved %v after the release", resolved.at.Sub(released).Round(time.Second))
}
