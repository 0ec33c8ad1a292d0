package e2e

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDemo runs `gpupool demo` as README's first command does, scrapes
// every /metrics it prints while it runs, checks them with promtool, and
// expects it to stop cleanly after --duration.
func TestDemo(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (make deps installs it)")
	}
	cmd := exec.Command(filepath.Join(binDir, "gpupool"), "demo", "--duration", "8s")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var urls []string
	var external string
	var out strings.Builder
	sc := bufio.NewScanner(stdout)
	metricsLine := regexp.MustCompile(`metrics: (http://\S+/metrics)`)
	externalLine := regexp.MustCompile(`external metrics: (https://\S+)`)
	for sc.Scan() {
		line := sc.Text()
		out.WriteString(line + "\n")
		if m := metricsLine.FindStringSubmatch(line); m != nil {
			urls = append(urls, m[1])
		}
		if m := externalLine.FindStringSubmatch(line); m != nil {
			external = m[1]
		}
		if strings.HasPrefix(line, "  try:") {
			break
		}
	}
	if len(urls) != 4 {
		t.Fatalf("demo printed %d /metrics URLs, want the allocator's and 3 servers':\n%s", len(urls), out.String())
	}
	time.Sleep(5 * time.Second) // leases placed, processes sampled
	for _, u := range urls {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		check := exec.Command(promtool, "check", "metrics")
		check.Stdin = strings.NewReader(string(body))
		if msg, err := check.CombinedOutput(); err != nil {
			t.Errorf("promtool check metrics %s: %v\n%s", u, err, msg)
		}
		if !strings.Contains(string(body), "bitfusion_") {
			t.Errorf("%s exports no bitfusion_ metric", u)
		}
	}
	// The adapter serves the training group's utilization over its
	// self-signed loopback certificate, as a curl -k would read it.
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := insecure.Get(external + "/namespaces/ml/bitfusion_gpu_utilization?labelSelector=app%3Dtf-training")
	if err != nil {
		t.Fatalf("external metrics at %q: %v", external, err)
	}
	var list struct {
		Kind  string `json:"kind"`
		Items []struct {
			Value string `json:"value"`
		} `json:"items"`
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil || list.Kind != "ExternalMetricValueList" || len(list.Items) != 1 {
		t.Errorf("external metric: %v %+v", err, list)
	}
	rest, _ := io.ReadAll(stdout)
	out.Write(rest)
	if err := cmd.Wait(); err != nil {
		t.Errorf("demo exited with %v", err)
	}
	for _, want := range []string{"tf-training-0", "quota ml:", "HPA signal: bitfusion_gpu_utilization", "gpupool demo: stopped"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}
