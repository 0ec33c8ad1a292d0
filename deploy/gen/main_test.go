package main

import (
	"os"
	"strings"
	"testing"
)

// TestRulesUpToDate checks that the PrometheusRule in the
// prometheus-operator component is alerts/gpupool-rules.yaml as it is now.
func TestRulesUpToDate(t *testing.T) {
	src, err := os.ReadFile("../../alerts/gpupool-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want, err := Render(src)
	if err != nil {
		t.Fatal(err)
	}
	have, err := os.ReadFile("../components/prometheus-operator/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(have) != string(want) {
		t.Fatal("deploy/components/prometheus-operator/rules.yaml is not alerts/gpupool-rules.yaml as it is now: run `go run ./deploy/gen`")
	}
}

func TestRenderRefuses(t *testing.T) {
	for name, in := range map[string]string{
		"not a rules file": "rules: []\n",
		"two keys":         "groups: []\nother: 1\n",
		"two documents":    "groups:\n  - name: a\n    rules: []\n---\ngroups: []\n",
		"not YAML":         "groups: [\n",
	} {
		if _, err := Render([]byte(in)); err == nil {
			t.Errorf("%s: rendered %q", name, in)
		}
	}
}

func TestRenderKeepsComments(t *testing.T) {
	in := "# about\ngroups:\n  - name: g\n    rules:\n      # why\n      - record: r\n        expr: |\n          sum(x)\n\n          / 2\n"
	out, err := Render([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "spec:\n  # about\n  groups:\n") || !strings.Contains(string(out), "        # why\n") {
		t.Errorf("comments lost:\n%s", out)
	}
}
