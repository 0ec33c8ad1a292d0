package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDemo runs `gpupool-demo` as README's first command does, scrapes
// every /metrics it prints while it runs, checks them with promtool, uses
// the tokens it prints (tokens are on: no token is a 401) and runs its
// gpupool line as printed, and expects it to stop cleanly after --duration
// and keep the log it names.
func TestDemo(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (make deps installs it)")
	}
	// Long enough that the checks below finish on a loaded machine before
	// the demo stops by itself.
	cmd := exec.Command(filepath.Join(binDir, "gpupool-demo"), "--duration", "25s")
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir()) // where it keeps its log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var urls []string
	var external, allocatorURL, logFile, tenantLine, adminToken, consoleURL string
	var out strings.Builder
	sc := bufio.NewScanner(stdout)
	allocatorLine := regexp.MustCompile(`^gpupool-demo: allocator (http://\S+) \(tokens on: \S+\); logs in (\S+)$`)
	metricsLine := regexp.MustCompile(`metrics: (http://\S+/metrics)`)
	externalLine := regexp.MustCompile(`external metrics: (https://\S+)`)
	tenantTry := regexp.MustCompile(`try: (GPUPOOL_ALLOCATOR=\S+ GPUPOOL_TOKEN=\S+ GPUPOOL_NAMESPACE=ml \S+ pool status .*)`)
	adminLine := regexp.MustCompile(`try: curl -s -H 'Authorization: Bearer (\S+)' \S+/v1/leases`)
	consoleLine := regexp.MustCompile(`^  console: (http://\S+/console/) `)
	for sc.Scan() {
		line := sc.Text()
		out.WriteString(line + "\n")
		if m := allocatorLine.FindStringSubmatch(line); m != nil {
			allocatorURL, logFile = m[1], m[2]
		}
		if m := metricsLine.FindStringSubmatch(line); m != nil {
			urls = append(urls, m[1])
		}
		if m := externalLine.FindStringSubmatch(line); m != nil {
			external = m[1]
		}
		if m := tenantTry.FindStringSubmatch(line); m != nil {
			tenantLine = m[1]
		}
		if m := adminLine.FindStringSubmatch(line); m != nil {
			adminToken = m[1]
		}
		if m := consoleLine.FindStringSubmatch(line); m != nil {
			consoleURL = m[1]
		}
		if line == "" { // the end of the header
			break
		}
	}
	if len(urls) != 5 {
		t.Fatalf("demo printed %d /metrics URLs, want the allocator's, 3 servers' and the adapter's:\n%s", len(urls), out.String())
	}
	if allocatorURL == "" || tenantLine == "" || adminToken == "" || consoleURL != allocatorURL+"/console/" {
		t.Fatalf("demo did not print its allocator, its console, namespace ml's token and the admin token:\n%s", out.String())
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
	demoTokens(t, allocatorURL, adminToken, tenantLine)
	demoConsole(t, consoleURL, allocatorURL, adminToken)
	rest, _ := io.ReadAll(stdout)
	out.Write(rest)
	if err := cmd.Wait(); err != nil {
		t.Errorf("demo exited with %v", err)
	}
	for _, want := range []string{"tf-training-0", "quota ml:", "HPA signal: bitfusion_gpu_utilization", "gpupool-demo: stopped"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
	if log, err := os.ReadFile(logFile); err != nil || !strings.Contains(string(log), "registered with the allocator") {
		t.Errorf("the demo's log %s after it stopped: %v, want the parts' log", logFile, err)
	}
}

// demoConsole: the console the demo printed serves its page, and its view
// shows the demo's servers and, from their heartbeats, the use of the
// training group's leases.
func demoConsole(t *testing.T, consoleURL, allocatorURL, adminToken string) {
	t.Helper()
	resp, err := http.Get(consoleURL)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "gpupool console") {
		t.Errorf("console page at %s: %d %.200s", consoleURL, resp.StatusCode, page)
	}
	v, err := newClient(t, allocatorURL, adminToken).Console(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	measured := 0
	for _, l := range v.Leases {
		if l.App == "tf-training" && l.Use != nil {
			measured++
		}
	}
	if len(v.Servers) != 3 || measured == 0 {
		t.Errorf("console view: %d servers, %d tf-training leases measured; want 3 and some: %+v", len(v.Servers), measured, v.Leases)
	}
}

// demoTokens uses the tokens the demo printed: the allocator answers no
// token 401, the admin token the leases (of every namespace), and the
// `gpupool` line with namespace ml's token runs as printed, from the
// repository's root, and its token sees ml's leases only.
func demoTokens(t *testing.T, allocatorURL, admin, tenantLine string) {
	t.Helper()
	get := func(token string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, allocatorURL+"/v1/leases", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get(""); code != http.StatusUnauthorized {
		t.Errorf("GET /v1/leases without a token: %d %s, want 401", code, body)
	}
	code, body := get(admin)
	if code != http.StatusOK || !strings.Contains(body, `"namespace":"ml"`) {
		t.Errorf("GET /v1/leases with the admin token: %d, want 200 and ml's leases:\n%s", code, body)
	}
	printed := exec.Command("sh", "-c", tenantLine)
	printed.Dir = "../.."
	if out, err := printed.CombinedOutput(); err != nil || !strings.Contains(string(out), "sim-h100-0") {
		t.Errorf("%s: %v\n%s", tenantLine, err, out)
	}
	out, code := gpupool(t, strings.Fields(tenantLine)[:3], "leases")
	if code != 0 || !strings.Contains(out, "tf-training-0") || strings.Contains(out, "team-b") {
		t.Errorf("gpupool leases with namespace ml's token: exit %d, want ml's leases only:\n%s", code, out)
	}
}
