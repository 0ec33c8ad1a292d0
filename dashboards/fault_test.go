package dashboards

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpupool/gpupool/internal/metricstest"
)

// TestFaultQueriesHaveDataDuringFault runs the queries that have data only
// while something fails, during such a fault: an adapter whose allocator
// is gone answers the HPA's requests with a backend error, and Prometheus
// scrapes what it counts.
func TestFaultQueriesHaveDataDuringFault(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the allocator, the adapter and Prometheus; left out of the -short race pass")
	}
	var during []query
	for _, q := range queries() {
		if strings.HasPrefix(q.mayBeEmpty, onlyDuringFault("")) {
			during = append(during, q)
		}
	}
	if len(during) == 0 {
		t.Fatal("no query is marked as having data only during a fault")
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir, "../cmd/gpupool-allocator", "../cmd/gpupool-adapter")
	build.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	allocator := run(t, filepath.Join(dir, "gpupool-allocator"), `address=(http://\S+)`, "--listen", "127.0.0.1:0", "--data-dir", t.TempDir())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	securePort := strings.TrimPrefix(ln.Addr().String(), "127.0.0.1:")
	_ = ln.Close()
	adapterMetrics := run(t, filepath.Join(dir, "gpupool-adapter"), `metrics=(http://\S+)/metrics`, "--no-delegation",
		"--allocator", allocator.url, "--bind-address", "127.0.0.1", "--secure-port", securePort,
		"--cert-dir", t.TempDir(), "--metrics-listen", "127.0.0.1:0")
	prom := metricstest.StartPrometheus(t, time.Second, adapterMetrics.url)

	// The fault: the allocator dies; the HPA keeps asking.
	_ = allocator.cmd.Process.Kill()
	insecure := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	ask := "https://127.0.0.1:" + securePort + "/apis/external.metrics.k8s.io/v1beta1/namespaces/ml/bitfusion_gpu_utilization?labelSelector=app%3Dtf-training"
	pending := awaitData(t, prom, during, 60*time.Second, func() {
		if resp, err := insecure.Get(ask); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Fatal("the adapter served a value with its allocator gone")
			}
		}
	})
	for _, q := range pending {
		t.Errorf("%s, %s: no data during the fault (%s):\n%s", q.dashboard, q.where, q.mayBeEmpty, q.expr)
	}
}

type process struct {
	cmd *exec.Cmd
	url string
}

// run starts bin until the test ends and returns the URL its log names
// (the first submatch of urlLine).
func run(t *testing.T, bin, urlLine string, args ...string) process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	found := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(urlLine)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	select {
	case u := <-found:
		return process{cmd: cmd, url: u}
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not start", filepath.Base(bin))
	}
	return process{}
}
