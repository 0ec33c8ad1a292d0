// Package metricdef holds each component's metrics as data: one table row
// per metric family (name, type, unit, labels, help) from which the
// component builds its descriptors, and against which the tests check
// docs/metrics.md, as kube-state-metrics checks its docs against its
// family generators.
package metricdef

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
)

// Labels are a metric's label names, in the order their values are given.
type Labels []string

// With returns the labels followed by more; l itself is left as it is, so
// that a shared set can be extended.
func (l Labels) With(more ...string) Labels { return append(slices.Clip(l), more...) }

// GPULabels name one GPU wherever a series is about one: the allocator's
// view of the pool and the daemon's telemetry join on them.
var GPULabels = Labels{"server", "gpu", "model"}

// Family is one metric family as it is exported and documented.
type Family struct {
	Name string
	Type dto.MetricType
	// Unit is the unit as docs/metrics.md writes it ("bytes", "ratio 0..1").
	Unit   string
	Labels Labels
	// LabelPrefix, when set, prefixes labels named only at start (the pod
	// labels an allowlist names, label_<name>); docs/metrics.md writes
	// them as <prefix>*, and WithPrefixed adds them.
	LabelPrefix string
	Help        string
	// Buckets are a histogram's upper bounds.
	Buckets []float64
	desc    *prometheus.Desc
}

// Gauge is a gauge's row.
func Gauge(name, unit string, labels Labels, help string) *Family {
	return newFamily(Family{Name: name, Type: dto.MetricType_GAUGE, Unit: unit, Labels: labels, Help: help})
}

// Counter is a counter's row.
func Counter(name, unit string, labels Labels, help string) *Family {
	return newFamily(Family{Name: name, Type: dto.MetricType_COUNTER, Unit: unit, Labels: labels, Help: help})
}

// Histogram is a histogram's row.
func Histogram(name, unit string, labels Labels, help string, buckets []float64) *Family {
	return newFamily(Family{Name: name, Type: dto.MetricType_HISTOGRAM, Unit: unit, Labels: labels, Help: help, Buckets: buckets})
}

func newFamily(f Family) *Family {
	f.desc = prometheus.NewDesc(f.Name, f.Help, f.Labels, nil)
	return &f
}

// WithPrefixed returns the family with a label LabelPrefix+name for each
// name, after its own.
func (f *Family) WithPrefixed(names ...string) *Family {
	g := *f
	g.Labels, g.LabelPrefix = f.Labels.With(), ""
	for _, n := range names {
		g.Labels = append(g.Labels, f.LabelPrefix+n)
	}
	return newFamily(g)
}

// Desc describes the family's series, for a custom collector's Describe.
func (f *Family) Desc() *prometheus.Desc { return f.desc }

// Metric is one series of a gauge or counter family, with the label values
// in the order of Labels; a custom collector builds its series so.
func (f *Family) Metric(value float64, labelValues ...string) prometheus.Metric {
	valueType := prometheus.GaugeValue
	if f.Type == dto.MetricType_COUNTER {
		valueType = prometheus.CounterValue
	}
	return prometheus.MustNewConstMetric(f.desc, valueType, value, labelValues...)
}

// NewCounterVec is a counter family whose series are counted as they happen.
func (f *Family) NewCounterVec() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: f.Name, Help: f.Help}, f.Labels)
}

// NewGaugeVec is a gauge family set as things happen.
func (f *Family) NewGaugeVec() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: f.Name, Help: f.Help}, f.Labels)
}

// NewHistogramVec is a histogram family observed as things happen.
func (f *Family) NewHistogramVec() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: f.Name, Help: f.Help, Buckets: f.Buckets}, f.Labels)
}

// NewProcessRegistry returns a registry with the Go runtime's and the
// process's collectors, which every binary's /metrics serves beside its
// own families.
func NewProcessRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
