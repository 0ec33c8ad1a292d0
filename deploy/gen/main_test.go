package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedUpToDate checks that every file gen writes is what it
// would write now: the PrometheusRule is alerts/gpupool-rules.yaml as it
// is, the webhook configurations are kube/admission's, the chart's knobs
// are values.schema.json's; and that the chart's templates written by
// hand take their knobs as the generated ones do.
func TestGeneratedUpToDate(t *testing.T) {
	t.Chdir("../..")
	files, err := renderAll()
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range files {
		have, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(have) != string(want) {
			t.Errorf("%s is not up to date: run `go run ./deploy/gen`", path)
		}
	}
	stale, err := staleTemplates(files)
	if err != nil || len(stale) > 0 {
		t.Errorf("templates generated no more: %v (%v)", stale, err)
	}
	problems, err := handWrittenKnobs(filepath.Join(chartDir, "templates"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
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
