package metricstest

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// StartPrometheus runs the Debian-packaged Prometheus until the test ends,
// scraping targets (base URLs; /metrics is scraped) every interval, and
// returns its base URL once it answers queries.
func StartPrometheus(t testing.TB, interval time.Duration, targets ...string) string {
	t.Helper()
	return StartPrometheusWith(t, PrometheusConfig{Interval: interval}, targets...)
}

// PrometheusConfig is what StartPrometheusWith and StartVictoriaMetricsWith
// set beyond the targets.
type PrometheusConfig struct {
	// Interval is the scrape interval and the rules' global evaluation
	// interval; a group with an interval of its own keeps it (gpupool's
	// recording rules: 5 s).
	Interval time.Duration
	// RuleFiles are evaluated; alerts go to Alertmanager (host:port).
	RuleFiles    []string
	Alertmanager string
}

// GpupoolRules is the path of alerts/gpupool-rules.yaml, whose recording
// rules the dashboards and the adapter's Prometheus backend query.
func GpupoolRules(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "alerts", "gpupool-rules.yaml")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// StartPrometheusWith is StartPrometheus with rules and an Alertmanager.
func StartPrometheusWith(t testing.TB, c PrometheusConfig, targets ...string) string {
	t.Helper()
	cfg := scrapeConfig(t, c.Interval, targets, ", evaluation_interval: "+c.Interval.String())
	if len(c.RuleFiles) > 0 || c.Alertmanager != "" {
		// Prometheus reads them relative to its config file, in a temp dir.
		extra := fmt.Sprintf("rule_files: [%s]\n", quoteAll(absolute(t, c.RuleFiles)))
		if c.Alertmanager != "" {
			extra += fmt.Sprintf("alerting:\n  alertmanagers:\n  - static_configs:\n    - targets: [%q]\n", c.Alertmanager)
		}
		appendFile(t, cfg, extra)
	}
	addr := freeAddr(t)
	return startTSDB(t, addr, "prometheus", "--config.file="+cfg,
		"--storage.tsdb.path="+t.TempDir(), "--web.listen-address="+addr)
}

func absolute(t testing.TB, paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		abs, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = abs
	}
	return out
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

func appendFile(t testing.TB, path, text string) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}

// StartVictoriaMetricsWith is StartPrometheusWith with the Debian-packaged
// single-node VictoriaMetrics, which serves the same query API, and vmalert
// evaluating the rules into it; the alerts go nowhere (no Alertmanager).
func StartVictoriaMetricsWith(t testing.TB, c PrometheusConfig, targets ...string) string {
	t.Helper()
	addr := freeAddr(t)
	base := startTSDB(t, addr, "victoria-metrics", "-promscrape.config="+scrapeConfig(t, c.Interval, targets, ""),
		"-storageDataPath="+t.TempDir(), "-httpListenAddr="+addr, "-search.latencyOffset=0s", "-search.disableCache")
	if len(c.RuleFiles) == 0 {
		return base
	}
	// vmalert refuses to start without an Alertmanager when the rules
	// hold alerts: it gets a port nothing listens on. By default it would
	// date an evaluation by its time truncated to the group's interval and
	// write the results every 5 s, each making a recorded value up to that
	// much older than Prometheus's (docs/adapter.md): off, and every
	// interval, so that both TSDBs answer as fresh.
	args := []string{"-datasource.url=" + base, "-remoteWrite.url=" + base, "-notifier.url=http://" + freeAddr(t),
		"-evaluationInterval=" + c.Interval.String(), "-datasource.queryTimeAlignment=false",
		"-remoteWrite.flushInterval=" + c.Interval.String(), "-httpListenAddr=" + freeAddr(t)}
	for _, f := range absolute(t, c.RuleFiles) {
		args = append(args, "-rule="+f)
	}
	start(t, "vmalert", args...)
	return base
}

func freeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String()
}

// scrapeConfig writes a config scraping targets; globalExtra adds to its
// global section (VictoriaMetrics rejects what it does not know).
func scrapeConfig(t testing.TB, interval time.Duration, targets []string, globalExtra string) string {
	hosts := make([]string, len(targets))
	for i, tg := range targets {
		u, err := url.Parse(tg)
		if err != nil {
			t.Fatal(err)
		}
		hosts[i] = fmt.Sprintf("%q", u.Host)
	}
	cfg := fmt.Sprintf("global: {scrape_interval: %[1]s%[3]s}\nscrape_configs:\n- job_name: gpupool\n  static_configs:\n  - targets: [%[2]s]\n",
		interval, strings.Join(hosts, ", "), globalExtra)
	path := filepath.Join(t.TempDir(), "scrape.yml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func startTSDB(t testing.TB, addr, name string, args ...string) string {
	t.Helper()
	log := start(t, name, args...)
	base := "http://" + addr
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get(base + "/api/v1/query?query=1")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(log)
			t.Fatalf("%s did not start: %v\n%s", name, err, out)
		}
	}
}

// start runs the Debian-packaged name until the test ends, its output in
// the file it returns.
func start(t testing.TB, name string, args ...string) (log string) {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed (make deps installs it): %v", name, err)
	}
	log = filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = f.Close() })
	return log
}
