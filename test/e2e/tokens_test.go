package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator/api"
	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
)

// TestDaemonWithServersTokenSeesItsLeases runs the pool as deployed: the
// allocator with deploy/base's config (admin, servers and namespace
// tokens), a gpupool-server daemon holding the servers token as the
// DaemonSet gives it, a lease taken with namespace ml's token for pods
// labelled app=tf-training, and the adapter with the admin token. The
// daemon must read the leases of its server (it was answered 403 and
// logged "fetching leases" every round), so that it exports the lease's
// series, lists it in its usage report, and the adapter answers the HPA's
// query for the app.
func TestDaemonWithServersTokenSeesItsLeases(t *testing.T) {
	config := writePoolConfig(t, map[string]int64{"ml": 400})
	a := startAllocator(t, "--data-dir", t.TempDir(), "--config", config.Path)
	dir := t.TempDir()
	workload := filepath.Join(dir, "workload.yaml")
	if err := os.WriteFile(workload, []byte("- {namespace: ml, selector: app=tf-training, gpus: 0.3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("allocator:\n%s\ndaemon and adapter:\n%s", tail(a.logs.String(), 30), tail(logs.String(), 60))
		}
	})
	daemonURL := "http://127.0.0.1:" + freePort(t)
	startDaemon(t, logs, config.Servers, "--allocator", a.URL, "--name", "gpu-node-0",
		"--listen", strings.TrimPrefix(daemonURL, "http://"), "--probe-listen", "127.0.0.1:0", "--simulate-gpus", "H100:80Gi:2",
		"--simulated-workload", workload, "--interval", "200ms", "--process-every", "1", "--heartbeat", "500ms",
		"--metric-labels-allowlist", "app")
	external := startAdapter(t, logs, a.URL, config.adminTokenFile(t)).API

	ml := newClient(t, a.URL, config.Tenant["ml"])
	waitFor(t, func() bool { p, err := ml.Pool(context.Background()); return err == nil && len(p.Servers) == 1 })
	lease, err := ml.Acquire(context.Background(), api.AcquireRequest{Namespace: "ml", GPUAmount: 1, GPUPercent: 50, TTL: "10m",
		Owner: api.Owner{Pod: "tf-training-0", UID: "uid-tf-training-0", Labels: map[string]string{"app": "tf-training"}}})
	if err != nil {
		t.Fatal(err)
	}

	// Each symptom of the report is checked, so a failure shows them all.
	// The daemon's series for the lease, with the app label.
	series := regexp.MustCompile(`(?m)^bitfusion_lease_gpu_utilization\{[^}]*lease="` + regexp.QuoteMeta(lease.ID) + `"[^}]*\} `)
	within(t, 15*time.Second, "the daemon exports no bitfusion_lease_* series for lease "+lease.ID, func() bool {
		return series.MatchString(metricsOf(t, daemonURL))
	})
	m := grep(metricsOf(t, daemonURL), lease.ID)
	for _, name := range []string{"bitfusion_lease_gpu_utilization", "bitfusion_lease_memory_granted_bytes", "bitfusion_lease_processes"} {
		if !regexp.MustCompile(`(?m)^` + name + `\{[^}]*label_app="tf-training"[^}]*lease="` + regexp.QuoteMeta(lease.ID) + `"`).MatchString(m) {
			t.Errorf("no %s{label_app=\"tf-training\", lease=%q} on the daemon:\n%s", name, lease.ID, m)
		}
	}

	// Its usage report, what the adapter's direct backend reads.
	usage, err := gpuapi.FetchUsage(context.Background(), http.DefaultClient, daemonURL)
	if err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, l := range usage.Leases {
		listed = listed || l.Lease == lease.ID && l.Namespace == "ml"
	}
	if !listed {
		t.Errorf("GET /v1/usage does not list lease %s: %+v", lease.ID, usage.Leases)
	}

	// The adapter answers the HPA's query, with the admin token.
	var value, answer string
	if within(t, 15*time.Second, "the adapter answers no bitfusion_gpu_utilization for app=tf-training", func() bool {
		value, answer = externalValue(t, external, "ml", "bitfusion_gpu_utilization", "app=tf-training")
		return value != ""
	}) {
		t.Logf("lease %s: bitfusion_gpu_utilization{namespace=ml, app=tf-training} = %s", lease.ID, value)
	} else {
		t.Logf("the adapter's last answer: %s", answer)
	}

	if warned := grep(logs.String(), "fetching leases"); warned != "" {
		t.Errorf("the daemon could not fetch its leases:\n%s", tail(warned, 3))
	}
}

// within waits until cond holds and reports whether it did; if not, the
// test fails with what.
func within(t *testing.T, d time.Duration, what string, cond func() bool) bool {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("%s within %v", what, d)
			return false
		}
	}
	return true
}

// adapterProcess is a running gpupool-adapter.
type adapterProcess struct {
	cmd *exec.Cmd
	// API is the base URL of its external metrics API; Metrics of its own
	// /metrics.
	API, Metrics string
}

// startAdapter runs gpupool-adapter on the direct backend with the admin
// token file, as deploy/base/adapter.yaml does, on a loopback port with a
// self-signed certificate and no cluster to delegate to.
func startAdapter(t testing.TB, logs *syncBuffer, allocatorURL, tokenFile string) *adapterProcess {
	t.Helper()
	port, metricsAddr := freePort(t), "127.0.0.1:"+freePort(t)
	cmd := startBinary(t, logs, "gpupool-adapter", regexp.MustCompile(`Serving securely`), "--backend", "direct",
		"--allocator", allocatorURL, "--allocator-token-file", tokenFile, "--no-delegation",
		"--secure-port", port, "--bind-address", "127.0.0.1", "--cert-dir", t.TempDir(), "--metrics-listen", metricsAddr)
	return &adapterProcess{cmd: cmd, API: "https://127.0.0.1:" + port + "/apis/external.metrics.k8s.io/v1beta1", Metrics: "http://" + metricsAddr}
}

// newAdapterClient is a client of the adapter's self-signed loopback
// certificate.
func newAdapterClient() *http.Client {
	return &http.Client{Timeout: 5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // a loopback certificate it made itself
}

// externalValue reads an external metric as the HPA does and returns its
// one value ("" when the adapter answers none) and the answer.
func externalValue(t *testing.T, base, ns, metric, selector string) (value, answer string) {
	t.Helper()
	value, answer, err := queryExternal(newAdapterClient(), base, ns, metric, selector)
	if err != nil {
		t.Fatal(err)
	}
	return value, answer
}

// queryExternal is externalValue through c, with the error of a request
// that got no answer.
func queryExternal(c *http.Client, base, ns, metric, selector string) (value, answer string, err error) {
	resp, err := c.Get(fmt.Sprintf("%s/namespaces/%s/%s?labelSelector=%s", base, ns, metric, url.QueryEscape(selector)))
	if err != nil {
		return "", "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	var list struct {
		Items []struct {
			Value string `json:"value"`
		} `json:"items"`
	}
	answer = resp.Status + " " + string(body)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &list) != nil || len(list.Items) != 1 {
		return "", answer, nil
	}
	return list.Items[0].Value, answer, nil
}
