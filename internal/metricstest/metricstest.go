// Package metricstest holds the checks every exporter's tests run: the
// exposition against a golden file, the metric table against
// docs/metrics.md (both ways), and promtool.
package metricstest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/gpupool/gpupool/internal/golden"
	"github.com/gpupool/gpupool/internal/metricdef"
)

// Golden compares what g exports, less the families named in except (whose
// values vary from run to run), with the exposition in the golden file; a
// difference fails the test with a diff. With -update it rewrites the file
// first. It then lints the whole exposition with client_golang's linter
// and promtool (Lint).
func Golden(t *testing.T, g prometheus.Gatherer, path string, except ...string) {
	t.Helper()
	compared := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		families, err := g.Gather()
		return slices.DeleteFunc(families, func(f *dto.MetricFamily) bool { return slices.Contains(except, f.GetName()) }), err
	})
	if golden.Updating() {
		// Not testutil.GatherAndFormat: it keeps only the families it is
		// named, and none when named none.
		families, err := compared.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var text bytes.Buffer
		enc := expfmt.NewEncoder(&text, expfmt.NewFormat(expfmt.TypeTextPlain))
		for _, f := range families {
			if err := enc.Encode(f); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(path, text.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (rewrite it with -update)", err)
	}
	if err := testutil.GatherAndCompare(compared, bytes.NewReader(want)); err != nil {
		t.Errorf("the exposition differs from %s (- exported, + in the file; if the change is meant, rewrite it with -update and read the diff):\n%v", path, err)
	}
	if problems, err := testutil.GatherAndLint(g); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	Lint(t, g)
}

// Documented checks the table under "## <heading>" in the doc against a
// component's metric table, both ways: every family is documented with its
// type, unit and labels, and every documented metric is in the table. When
// g is not nil, every family it exports must be in the table as its row
// says (type and labels), so that nothing is exported around the table.
func Documented(t *testing.T, doc, heading string, families []*metricdef.Family, g prometheus.Gatherer) {
	t.Helper()
	problems, err := documentationProblems(doc, heading, families, g)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

func documentationProblems(doc, heading string, families []*metricdef.Family, g prometheus.Gatherer) ([]string, error) {
	documented, err := section(doc, heading)
	if err != nil {
		return nil, err
	}
	var problems []string
	byName := map[string]*metricdef.Family{}
	for _, f := range families {
		byName[f.Name] = f
		want := row{typeName(f.Type), f.Unit, documentedLabels(f)}
		switch got, ok := documented[f.Name]; {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s (%s) is not documented in %s", f.Name, want.typ, doc))
		case got != want:
			problems = append(problems, fmt.Sprintf("%s: %s says %s, the code %s", f.Name, doc, got, want))
		}
	}
	for name := range documented {
		if byName[name] == nil {
			problems = append(problems, fmt.Sprintf("%s is documented in %s but in no metric table", name, doc))
		}
	}
	if g == nil {
		return problems, nil
	}
	exported, err := g.Gather()
	if err != nil {
		return nil, err
	}
	for _, e := range exported {
		f := byName[e.GetName()]
		if f == nil {
			problems = append(problems, fmt.Sprintf("%s is exported but in no metric table", e.GetName()))
			continue
		}
		if typ := typeName(e.GetType()); typ != typeName(f.Type) {
			problems = append(problems, fmt.Sprintf("%s is exported as a %s, its row says %s", f.Name, typ, typeName(f.Type)))
		}
		for _, m := range e.GetMetric() {
			if labels := exportedLabels(m, f.LabelPrefix); !slices.Equal(labels, sorted(f.Labels)) {
				problems = append(problems, fmt.Sprintf("%s is exported with the labels %v, its row says %v", f.Name, labels, f.Labels))
				break
			}
		}
	}
	return problems, nil
}

// row is what docs/metrics.md says of one metric.
type row struct{ typ, unit, labels string }

func (r row) String() string { return fmt.Sprintf("%s in %s with labels %q", r.typ, r.unit, r.labels) }

func typeName(t dto.MetricType) string { return strings.ToLower(t.String()) }

// documentedLabels are a family's labels as docs/metrics.md lists them.
func documentedLabels(f *metricdef.Family) string {
	labels := f.Labels.With()
	if f.LabelPrefix != "" {
		labels = append(labels, f.LabelPrefix+"*")
	}
	return strings.Join(labels, ", ")
}

// exportedLabels are a series' label names, sorted, less those named at
// start (the prefixed ones).
func exportedLabels(m *dto.Metric, prefix string) []string {
	var names []string
	for _, l := range m.GetLabel() {
		if prefix == "" || !strings.HasPrefix(l.GetName(), prefix) {
			names = append(names, l.GetName())
		}
	}
	return sorted(names)
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// section reads the metric table under "## <heading>" in the doc: its
// Metric, Type, Unit and Labels columns, by metric name.
func section(doc, heading string) (map[string]row, error) {
	text, err := os.ReadFile(doc)
	if err != nil {
		return nil, err
	}
	_, body, ok := strings.Cut(string(text), "\n## "+heading)
	if !ok {
		return nil, fmt.Errorf("%s has no %q section", doc, "## "+heading)
	}
	body, _, _ = strings.Cut(body, "\n## ")
	out := map[string]row{}
	var column map[string]int
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if column == nil {
			column = map[string]int{}
			for i, c := range cells {
				column[c] = i
			}
			for _, c := range []string{"Metric", "Type", "Unit", "Labels"} {
				if _, ok := column[c]; !ok {
					return nil, fmt.Errorf("%s, %q: the table has no %s column", doc, heading, c)
				}
			}
			continue
		}
		name := strings.Trim(cells[column["Metric"]], "`")
		if !strings.HasPrefix(name, "bitfusion_") {
			continue // the header's underline
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("%s, %q: %s is documented twice", doc, heading, name)
		}
		out[name] = row{cells[column["Type"]], cells[column["Unit"]], cells[column["Labels"]]}
	}
	return out, nil
}

// Lint gathers g and has `promtool check metrics` check it; without
// promtool (`make deps` installs it) the test fails, saying so.
func Lint(t *testing.T, g prometheus.Gatherer) {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed (make deps installs it)")
	}
	var text bytes.Buffer
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(&text, f); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = &text
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, msg)
	}
}
