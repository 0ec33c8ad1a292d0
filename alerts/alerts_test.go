// Package alerts holds gpupool's Prometheus rules (gpupool-rules.yaml) and
// their promtool unit tests (tests/); this test runs promtool on them and
// checks every alert's annotations, runbook section and tests.
package alerts

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Record      string            `json:"record"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

type testFile struct {
	Tests []struct {
		AlertRuleTest []struct {
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

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

func TestAlertsUnitTests(t *testing.T) {
	promtool(t, "test", "rules", "tests/alerts_test.yaml")
}

// TestEveryAlertIsComplete: each alert has a severity, a summary, a
// description and a runbook link to its own section of docs/runbook.md,
// and its tests see it fire and not fire.
func TestEveryAlertIsComplete(t *testing.T) {
	var rules ruleFile
	readYAML(t, "gpupool-rules.yaml", &rules)
	var tests testFile
	readYAML(t, "tests/alerts_test.yaml", &tests)
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
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
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
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("%s: tests/alerts_test.yaml must see it fire (%v) and not fire (%v)", r.Alert, fires[r.Alert], quiet[r.Alert])
			}
		}
	}
	if alerts < 13 {
		t.Errorf("%d alerts, want the 13 of the issue", alerts)
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
