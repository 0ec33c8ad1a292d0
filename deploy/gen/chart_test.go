package main

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"sigs.k8s.io/yaml"
)

// handWritten are the workloads of the chart's templates written by hand,
// with their values keys (components has the generated ones').
var handWritten = map[string]string{
	"gpupool-secrets":          "secretsJob", // templates/secrets.yaml
	"gpupool-test-pool-status": "tests",      // templates/tests/pool-status.yaml
}

// TestOneEditAddsAKnob: a knob added to values.schema.json's
// $defs.component, and nowhere else (here runtimeClassName, in a copy of
// the schema), reaches every workload the chart renders, the generated
// ones and those written by hand (the hook Job, the `helm test` pod),
// each from its own values key, once gen has run.
func TestOneEditAddsAKnob(t *testing.T) {
	const knob = "runtimeClassName"
	t.Chdir("../..")
	text, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(text, &schema); err != nil {
		t.Fatal(err)
	}
	props := schema["$defs"].(map[string]any)["component"].(map[string]any)["properties"].(map[string]any)
	if _, ok := props[knob]; ok {
		t.Fatalf("%s is a knob already: make this test add another", knob)
	}
	props[knob] = map[string]any{"type": "string"}
	edited, err := json.Marshal(schema)
	if err != nil {
		t.Fatal(err)
	}
	files, err := renderChartWith(edited)
	if err != nil {
		t.Fatal(err)
	}

	// The chart as it is, with the edited schema and what gen writes from
	// it; the templates written by hand as they are.
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	ch.Schema = edited
	for path, b := range files {
		name, err := filepath.Rel(chartDir, path)
		if err != nil || !strings.HasPrefix(name, "templates/") {
			continue
		}
		if i := slices.IndexFunc(ch.Templates, func(f *chart.File) bool { return f.Name == name }); i >= 0 {
			ch.Templates[i].Data = b
		} else {
			ch.Templates = append(ch.Templates, &chart.File{Name: name, Data: b})
		}
	}

	// Each component's key (every property of the values that is a
	// $defs.component) sets the knob to its own name.
	var keys []string
	for key, p := range schema["properties"].(map[string]any) {
		if p.(map[string]any)["$ref"] == "#/$defs/component" {
			keys = append(keys, key)
		}
	}
	workloads := maps.Clone(components)
	maps.Copy(workloads, handWritten)
	taken := map[string]bool{}
	for _, replicas := range []int{1, 3} { // the embedded allocator; the allocators on etcd, and etcd
		vals := map[string]any{"controller": map[string]any{"replicas": replicas}, "scheduler": map[string]any{"enabled": true}}
		for _, key := range keys {
			m, _ := vals[key].(map[string]any)
			if m == nil {
				m = map[string]any{}
				vals[key] = m
			}
			m[knob] = key
		}
		caps := chartutil.DefaultCapabilities.Copy()
		caps.KubeVersion = chartutil.KubeVersion{Version: "v1.37.2", Major: "1", Minor: "37"}
		values, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "gpupool", Namespace: "gpupool", IsInstall: true}, caps)
		if err != nil {
			t.Fatalf("values %v against the edited schema: %v", vals, err)
		}
		rendered, err := engine.Render(ch, values)
		if err != nil {
			t.Fatal(err)
		}
		pods := 0
		for _, name := range slices.Sorted(maps.Keys(rendered)) {
			if !strings.HasSuffix(name, ".yaml") {
				continue // NOTES.txt
			}
			for _, doc := range strings.Split(rendered[name], "\n---\n") {
				var obj map[string]any
				if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
					t.Fatalf("%s does not parse: %v\n%s", name, err, doc)
				}
				spec, ok := podSpecOf(obj)
				if !ok {
					continue
				}
				pods++
				meta, _ := obj["metadata"].(map[string]any)
				what := obj["kind"].(string) + "/" + meta["name"].(string)
				key, ok := workloads[meta["name"].(string)]
				if !ok {
					t.Errorf("%s (%s): a workload without a values key", what, name)
					continue
				}
				taken[key] = true
				if spec[knob] != key {
					t.Errorf("%s (%s): %s %v, want %s.%s (%q)", what, name, knob, spec[knob], key, knob, key)
				}
			}
		}
		if pods == 0 {
			t.Fatalf("controller.replicas %d: no workload rendered", replicas)
		}
	}
	for _, key := range keys {
		if !taken[key] {
			t.Errorf("%s: the knobs of no workload", key)
		}
	}
	for _, name := range []string{"gpupool-secrets", "gpupool-test-pool-status"} {
		if !taken[handWritten[name]] {
			t.Errorf("%s not rendered", name)
		}
	}
}

// podSpecOf is the pod spec of a workload or a bare Pod.
func podSpecOf(obj map[string]any) (map[string]any, bool) {
	spec, _ := obj["spec"].(map[string]any)
	switch obj["kind"] {
	case "Pod":
		return spec, spec != nil
	case "Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet":
		tmpl, _ := spec["template"].(map[string]any)
		pod, ok := tmpl["spec"].(map[string]any)
		return pod, ok
	case "CronJob":
		job, _ := spec["jobTemplate"].(map[string]any)
		jobSpec, _ := job["spec"].(map[string]any)
		tmpl, _ := jobSpec["template"].(map[string]any)
		pod, ok := tmpl["spec"].(map[string]any)
		return pod, ok
	}
	return nil, false
}
