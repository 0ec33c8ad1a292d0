// Package alerts holds gpupool's Prometheus rules (gpupool-rules.yaml) and
// their promtool unit tests (tests/); this test runs promtool on them,
// checks every alert's annotations, runbook section and tests, and that
// every recording rule is pinned by a test and queried, and evaluated
// more often than scraped.
package alerts

import (
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"

	"github.com/gpupool/gpupool/adapter"
	"github.com/gpupool/gpupool/dashboards"
	"github.com/gpupool/gpupool/gpuserver"
)

type ruleFile struct {
	Groups []struct {
		Name string `json:"name"`
		// Interval is the group's own; empty, the global one.
		Interval string `json:"interval"`
		Rules    []struct {
			Alert       string            `json:"alert"`
			Record      string            `json:"record"`
			Expr        string            `json:"expr"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

type testFile struct {
	GroupEvalOrder []string `json:"group_eval_order"`
	Tests          []struct {
		AlertRuleTest []struct {
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
		PromQLExprTest []struct {
			Expr string `json:"expr"`
		} `json:"promql_expr_test"`
	} `json:"tests"`
}

// The promtool tests: the alerts', and the recording rules' values.
const (
	alertTests = "tests/alerts_test.yaml"
	ruleTests  = "tests/rules_test.yaml"
)

func promtool(t *testing.T, args ...string) {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed (make deps installs it)")
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func TestRulesCheck(t *testing.T) {
	promtool(t, "check", "rules", "gpupool-rules.yaml")
}

func TestRulesUnitTests(t *testing.T) {
	promtool(t, "test", "rules", alertTests, ruleTests)
}

// TestEveryRecordingRuleIsPinnedAndQueried: each recording rule's value
// is pinned by tests/rules_test.yaml, and a dashboard, the adapter's
// Prometheus backend or an alert queries it.
func TestEveryRecordingRuleIsPinnedAndQueried(t *testing.T) {
	var rules ruleFile
	readYAML(t, "gpupool-rules.yaml", &rules)
	var tests testFile
	readYAML(t, ruleTests, &tests)
	pinned := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, e := range tc.PromQLExprTest {
			pinned[e.Expr] = true
		}
	}
	queriers := map[string][]string{} // who -> the PromQL it runs
	for _, d := range dashboards.All() {
		for _, r := range d.Rows {
			for _, p := range r.Panels {
				for _, tg := range p.Targets {
					queriers["dashboard "+d.Name] = append(queriers["dashboard "+d.Name], tg.Expr)
				}
			}
		}
	}
	var templates struct {
		Queries map[string]string `json:"queries"`
	}
	readYAML(t, "../adapter/prometheus.yaml", &templates)
	queriers["the adapter"] = slices.Collect(maps.Values(templates.Queries))
	records := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				queriers["the alerts"] = append(queriers["the alerts"], r.Expr)
			}
		}
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Record == "" {
				continue
			}
			records++
			if !pinned[r.Record] {
				t.Errorf("%s: %s has no promql_expr_test of its value", r.Record, ruleTests)
			}
			name := regexp.MustCompile(`(^|[^a-zA-Z0-9_:])` + regexp.QuoteMeta(r.Record) + `($|[^a-zA-Z0-9_:])`)
			var by []string
			for who, exprs := range queriers {
				if slices.ContainsFunc(exprs, name.MatchString) {
					by = append(by, who)
				}
			}
			if len(by) == 0 {
				t.Errorf("%s: no dashboard, adapter query or alert queries it", r.Record)
			}
		}
	}
	if records == 0 {
		t.Fatal("no recording rule read")
	}
}

// TestRecordingRulesOutpaceTheScrape: the recording rules have groups of
// their own, evaluated more often than deploy/'s ServiceMonitors scrape, so
// that a scrape reaches the adapter and the dashboards without waiting for
// the global evaluation interval; the alerts keep the global interval that
// their `for` durations assume; and tests/alerts_test.yaml has promtool
// evaluate the recording groups first, so that its alerts read the values
// of the same step, as they would in Prometheus (promtool's order is
// otherwise undefined).
func TestRecordingRulesOutpaceTheScrape(t *testing.T) {
	var rules ruleFile
	readYAML(t, "gpupool-rules.yaml", &rules)
	scrape := scrapeIntervals(t)
	var recording, alerting []string
	for _, g := range rules.Groups {
		records := 0
		for _, r := range g.Rules {
			if r.Record != "" {
				records++
			}
		}
		switch records {
		case 0:
			alerting = append(alerting, g.Name)
			if g.Interval != "" {
				t.Errorf("group %s: interval %s, want the global one, which the alerts' for durations assume", g.Name, g.Interval)
			}
		case len(g.Rules):
			recording = append(recording, g.Name)
			d, err := model.ParseDuration(g.Interval)
			if err != nil {
				t.Errorf("group %s: interval %q (%v), want one shorter than the scrape's", g.Name, g.Interval, err)
			}
			for _, s := range scrape {
				if time.Duration(d) >= s {
					t.Errorf("group %s: interval %s, want it shorter than the ServiceMonitors' scrape interval %s", g.Name, g.Interval, s)
				}
			}
		default:
			t.Errorf("group %s holds recording rules and alerts: the recording rules want a shorter interval than the alerts", g.Name)
		}
	}
	var tests testFile
	readYAML(t, alertTests, &tests)
	if want := append(recording, alerting...); !slices.Equal(tests.GroupEvalOrder, want) {
		t.Errorf("%s: group_eval_order %v, want %v", alertTests, tests.GroupEvalOrder, want)
	}
}

// scrapeIntervals are those of the ServiceMonitors deploy/ ships.
func scrapeIntervals(t *testing.T) []time.Duration {
	t.Helper()
	const path = "../deploy/components/prometheus-operator/servicemonitors.yaml"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var intervals []time.Duration
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var monitor struct {
			Spec struct {
				Endpoints []struct {
					Interval string `json:"interval"`
				} `json:"endpoints"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &monitor); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, e := range monitor.Spec.Endpoints {
			d, err := model.ParseDuration(e.Interval)
			if err != nil {
				t.Fatalf("%s: interval %q: %v", path, e.Interval, err)
			}
			intervals = append(intervals, time.Duration(d))
		}
	}
	if len(intervals) == 0 {
		t.Fatalf("%s: no scrape interval read", path)
	}
	return intervals
}

// TestRecordingRulesDocumented: the table of docs/metrics.md's "Recording
// rules" section lists exactly the recording rules.
func TestRecordingRulesDocumented(t *testing.T) {
	var rules ruleFile
	readYAML(t, "gpupool-rules.yaml", &rules)
	var records []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				records = append(records, r.Record)
			}
		}
	}
	doc, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "\n## Recording rules\n")
	section, _, _ = strings.Cut(section, "\n## ")
	var documented []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_:0-9]+)` \\|").FindAllStringSubmatch(section, -1) {
		documented = append(documented, m[1])
	}
	slices.Sort(records)
	slices.Sort(documented)
	if !slices.Equal(records, documented) {
		t.Errorf("docs/metrics.md lists the recording rules %v, gpupool-rules.yaml has %v", documented, records)
	}
}

// TestLatencyRulesAgreeWithTheDirectBackend: the recorded round-trip
// window is the daemon's, and the recorded quantile the adapter's, so
// that both adapter backends and the alert serve one p99.
func TestLatencyRulesAgreeWithTheDirectBackend(t *testing.T) {
	var rules ruleFile
	readYAML(t, "gpupool-rules.yaml", &rules)
	exprs := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs[r.Record] = r.Expr
		}
	}
	const window, p99 = "server_transport_le:bitfusion_rdma_latency_seconds_bucket:rate5m", "server_transport:bitfusion_rdma_latency_seconds:p99_5m"
	m := regexp.MustCompile(`\[(\w+)\]`).FindStringSubmatch(exprs[window])
	if m == nil {
		t.Fatalf("%s: no range in %q", window, exprs[window])
	}
	if d, err := model.ParseDuration(m[1]); err != nil || time.Duration(d) != gpuserver.LatencyWindow {
		t.Errorf("%s: range %s (%v), the daemon's window (gpuserver.LatencyWindow) is %v", window, m[1], err, gpuserver.LatencyWindow)
	}
	m = regexp.MustCompile(`histogram_quantile\(([0-9.]+),`).FindStringSubmatch(exprs[p99])
	if m == nil {
		t.Fatalf("%s: no histogram_quantile in %q", p99, exprs[p99])
	}
	if q, err := strconv.ParseFloat(m[1], 64); err != nil || q != adapter.LatencyQuantile {
		t.Errorf("%s: quantile %s (%v), the adapter's (adapter.LatencyQuantile) is %v", p99, m[1], err, adapter.LatencyQuantile)
	}
}

// TestEveryAlertIsComplete: each alert has a severity, a summary, a
// description and a runbook link to its own section of docs/runbook.md,
// and its tests see it fire and not fire; each section of the runbook is
// an alert's.
func TestEveryAlertIsComplete(t *testing.T) {
	var rules ruleFile
	readYAML(t, "gpupool-rules.yaml", &rules)
	var tests testFile
	readYAML(t, alertTests, &tests)
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	runbook, err := os.ReadFile("../docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## (\S+)$`).FindAllStringSubmatch(string(runbook), -1) {
		sections[strings.ToLower(m[1])] = true
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", r.Alert, s)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[a] == "" {
					t.Errorf("%s has no %s", r.Alert, a)
				}
			}
			anchor := strings.ToLower(r.Alert)
			if want := "https://github.com/gpupool/gpupool/blob/main/docs/runbook.md#" + anchor; r.Annotations["runbook_url"] != want {
				t.Errorf("%s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
			}
			if !sections[anchor] {
				t.Errorf("%s has no section in docs/runbook.md", r.Alert)
			}
			delete(sections, anchor)
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("%s: %s must see it fire (%v) and not fire (%v)", r.Alert, alertTests, fires[r.Alert], quiet[r.Alert])
			}
		}
	}
	for anchor := range sections {
		t.Errorf("docs/runbook.md has a section %s for no alert", anchor)
	}
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
