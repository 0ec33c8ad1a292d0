package metricstest

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/internal/metricdef"
)

// rowSeries exports one series of a row.
type rowSeries struct {
	family *metricdef.Family
	labels []string
}

func (c rowSeries) Describe(ch chan<- *prometheus.Desc) { ch <- c.family.Desc() }
func (c rowSeries) Collect(ch chan<- prometheus.Metric) { ch <- c.family.Metric(1, c.labels...) }

// TestDocumentationProblems: a documented metric whose type, unit or
// labels differ from its row, a row missing from the doc, a documented
// metric in no row, and an exported family that is in no row or exports
// other labels than its row names, are each reported; labels named at
// start (label_*) and other sections are not.
func TestDocumentationProblems(t *testing.T) {
	doc := filepath.Join(t.TempDir(), "metrics.md")
	text := "# Metrics\n\n## Server (`server` /metrics)\n\n" +
		"| Metric | Type | Unit | Labels | Meaning |\n|---|---|---|---|---|\n" +
		"| `bitfusion_ok` | gauge | 0/1 | server, gpu, model | as its row says |\n" +
		"| `bitfusion_lease_use` | gauge | bytes | lease, label_* | with labels named at start |\n" +
		"| `bitfusion_short` | gauge | bytes | server | one label short |\n" +
		"| `bitfusion_unit` | gauge | seconds | | another unit |\n" +
		"| `bitfusion_gone_total` | counter | errors | | in no row |\n\n" +
		"## Next\n\n| Metric | Type | Unit | Labels |\n|---|---|---|---|\n| `bitfusion_elsewhere` | gauge | 1 | |\n"
	if err := os.WriteFile(doc, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := metricdef.Gauge("bitfusion_ok", "0/1", metricdef.GPULabels, "As documented.")
	lease := metricdef.Gauge("bitfusion_lease_use", "bytes", metricdef.Labels{"lease"}, "Use.")
	lease.LabelPrefix = "label_"
	short := metricdef.Gauge("bitfusion_short", "bytes", metricdef.Labels{"server", "gpu"}, "Two labels.")
	unit := metricdef.Gauge("bitfusion_unit", "bytes", nil, "Bytes, not seconds.")
	undocumented := metricdef.Counter("bitfusion_undocumented_total", "errors", nil, "Not in the doc.")

	reg := prometheus.NewRegistry()
	reg.MustRegister(
		rowSeries{ok, []string{"gpu-a", "0", "H100"}},
		rowSeries{lease.WithPrefixed("app"), []string{"lease-1", "tf-training"}},
		prometheus.NewGauge(prometheus.GaugeOpts{Name: "bitfusion_around", Help: "Made without a row."}),
		rowSeries{metricdef.Gauge("bitfusion_short", "bytes", metricdef.Labels{"server"}, "Two labels."), []string{"gpu-a"}},
	)

	problems, err := documentationProblems(doc, "Server", []*metricdef.Family{ok, lease, short, unit, undocumented}, reg)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"bitfusion_around is exported but in no metric table",
		"bitfusion_gone_total is documented in " + doc + " but in no metric table",
		"bitfusion_short is exported with the labels [server], its row says [server gpu]",
		"bitfusion_short: " + doc + ` says gauge in bytes with labels "server", the code gauge in bytes with labels "server, gpu"`,
		"bitfusion_undocumented_total (counter) is not documented in " + doc,
		"bitfusion_unit: " + doc + ` says gauge in seconds with labels "", the code gauge in bytes with labels ""`,
	}
	slices.Sort(problems)
	if !slices.Equal(problems, want) {
		t.Errorf("problems:\n%q\nwant:\n%q", problems, want)
	}
}
