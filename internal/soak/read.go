package soak

import (
	"errors"
	"io"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Goroutines reads go_goroutines from a /metrics answer.
func Goroutines(metrics io.Reader) (int, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(metrics)
	if err != nil {
		return 0, err
	}
	f, ok := families["go_goroutines"]
	if !ok || len(f.GetMetric()) != 1 {
		return 0, errors.New("no go_goroutines in the metrics")
	}
	return int(f.GetMetric()[0].GetGauge().GetValue()), nil
}
