package dashboards

import (
	"bufio"
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

	"sigs.k8s.io/yaml"

	"github.com/gpupool/gpupool/internal/metricstest"
)

// query is one PromQL expression of the dashboards as the tests run it:
// placeholders expanded, $__rate_interval 1m, every variable `.*` (All).
type query struct {
	dashboard, where string // the dashboard, and the panel and refId or the variable
	expr             string
	label            string // a variable's: a series must carry it
	mayBeEmpty       string
}

func queries() []query {
	var c Config
	var out []query
	for _, d := range All() {
		vars := c.variablesOf(d)
		pairs := []string{"$__rate_interval", "1m"}
		for _, v := range vars {
			pairs = append(pairs, "$"+v.Label, ".*")
		}
		instant := strings.NewReplacer(pairs...)
		for _, v := range vars {
			out = append(out, query{dashboard: d.Name, where: "variable " + v.Label,
				expr: instant.Replace(c.expand(v.Series)), label: v.Label, mayBeEmpty: v.MayBeEmpty})
		}
		for _, r := range d.Rows {
			for _, p := range r.Panels {
				for i, t := range p.Targets {
					out = append(out, query{dashboard: d.Name, where: fmt.Sprintf("panel %q %c", p.Title, 'A'+i),
						expr: instant.Replace(c.expand(t.Expr)), mayBeEmpty: t.MayBeEmpty})
				}
			}
		}
	}
	return out
}

// TestGeneratedFilesUpToDate is `go run ./dashboards/gen -check`.
func TestGeneratedFilesUpToDate(t *testing.T) {
	files, err := Files(Config{})
	if err != nil {
		t.Fatal(err)
	}
	diffs, err := Check(".", files)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		t.Errorf("dashboards/%s: run `go run ./dashboards/gen`", d)
	}
}

// TestPanelsFitTheGrid: every panel lies within Grafana's 24 columns. The
// SDK lays panels out left to right and starts a new line only once a line
// is full, so a panel that does not fit would be placed past the edge.
func TestPanelsFitTheGrid(t *testing.T) {
	for _, d := range All() {
		b, err := Config{}.JSON(d)
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Panels []struct {
				Title   string             `json:"title"`
				GridPos struct{ X, W int } `json:"gridPos"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		for _, p := range out.Panels {
			if p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("%s, panel %q: columns %d to %d, past the grid's 24", d.Name, p.Title, p.GridPos.X, p.GridPos.X+p.GridPos.W)
			}
		}
	}
}

// TestQueriesParse writes every query as a recording rule and has
// promtool check them.
func TestQueriesParse(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed (make deps installs it)")
	}
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	type group struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	}
	var groups []group
	nonName := regexp.MustCompile(`[^a-z0-9]+`)
	for _, q := range queries() {
		if len(groups) == 0 || groups[len(groups)-1].Name != q.dashboard {
			groups = append(groups, group{Name: q.dashboard})
		}
		g := &groups[len(groups)-1]
		// The record names the query, to find it in promtool's complaint.
		record := "dashboard:" + strings.Trim(nonName.ReplaceAllString(strings.ToLower(q.dashboard+" "+q.where), "_"), "_")
		g.Rules = append(g.Rules, rule{Record: record, Expr: q.expr})
	}
	b, err := yaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboards.rules.yaml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

// TestQueriesHaveDataInDemo runs `gpupool-demo` and a real Prometheus
// scraping it and evaluating gpupool's recording rules, and expects every
// query to return data there, except those marked MayBeEmpty, which it
// lists with their reason.
func TestQueriesHaveDataInDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the demo and Prometheus (about 40 s); left out of the -short race pass")
	}
	if _, err := exec.LookPath("prometheus"); err != nil {
		t.Fatal("prometheus is not installed (make deps installs it)")
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir, "../cmd/gpupool-demo")
	build.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/gpupool-demo: %v\n%s", err, out)
	}
	prom := metricstest.StartPrometheusWith(t, metricstest.PrometheusConfig{Interval: time.Second, RuleFiles: []string{metricstest.GpupoolRules(t)}},
		startDemo(t, filepath.Join(dir, "gpupool-demo"))...)

	var pending, allowed []query
	for _, q := range queries() {
		if q.mayBeEmpty == "" {
			pending = append(pending, q)
		} else {
			allowed = append(allowed, q)
		}
	}
	// Rates need two scrapes; the workload places leases in its first seconds.
	pending = awaitData(t, prom, pending, 60*time.Second, func() {})
	for _, q := range pending {
		t.Errorf("%s, %s: no data after 60 s against the demo:\n%s", q.dashboard, q.where, q.expr)
	}
	for _, q := range allowed {
		ok, err := hasData(prom, q)
		if err != nil {
			t.Fatalf("%s, %s: %v\n%s", q.dashboard, q.where, err, q.expr)
		}
		if !ok {
			t.Logf("%s, %s: empty, as allowed: %s", q.dashboard, q.where, q.mayBeEmpty)
		}
	}
}

// startDemo runs `gpupool-demo` until the test ends and returns the base
// URLs of its /metrics: the allocator's, the three GPU servers' and the
// adapter's own.
func startDemo(t *testing.T, bin string) []string {
	t.Helper()
	cmd := exec.Command(bin, "--duration", "90s")
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir()) // where it keeps its log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt) // it removes its temp dir on the way out
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	metricsLine := regexp.MustCompile(`metrics: (http://\S+)/metrics`)
	var urls []string
	var out strings.Builder
	sc := bufio.NewScanner(stdout)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "  try:") {
		out.WriteString(sc.Text() + "\n")
		if m := metricsLine.FindStringSubmatch(sc.Text()); m != nil {
			urls = append(urls, m[1])
		}
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }() // the live view, once a second
	if len(urls) != 5 {
		t.Fatalf("demo printed %d /metrics URLs, want the allocator's, 3 servers' and the adapter's:\n%s", len(urls), out.String())
	}
	return urls
}

// awaitData runs the queries every second, after poke, until each has
// returned data or within has passed, and returns those that never did.
func awaitData(t *testing.T, prom string, qs []query, within time.Duration, poke func()) []query {
	t.Helper()
	for deadline := time.Now().Add(within); len(qs) > 0 && time.Now().Before(deadline); time.Sleep(time.Second) {
		poke()
		var still []query
		for _, q := range qs {
			if ok, err := hasData(prom, q); err != nil {
				t.Fatalf("%s, %s: %v\n%s", q.dashboard, q.where, err, q.expr)
			} else if !ok {
				still = append(still, q)
			}
		}
		qs = still
	}
	return qs
}

// hasData runs q as an instant query: a variable's needs a series with
// its label, a panel's any series.
func hasData(prom string, q query) (bool, error) {
	resp, err := http.Get(prom + "/api/v1/query?query=" + url.QueryEscape(q.expr))
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return false, err
	}
	if body.Status != "success" {
		return false, fmt.Errorf("prometheus: %s", body.Error)
	}
	for _, r := range body.Data.Result {
		if q.label == "" || r.Metric[q.label] != "" {
			return true, nil
		}
	}
	return false, nil
}
