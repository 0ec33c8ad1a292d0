package soak

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ReadRSS reads a process's resident memory from /proc/<pid>/status:
// VmRSS, all of it, and RssAnon, the part that is no file's pages (its
// binary's code and data are files' pages, which the kernel may drop and
// read again).
func ReadRSS(pid int) (rss, anon int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	if rss, err = statusKB(b, "VmRSS"); err != nil {
		return 0, 0, err
	}
	if anon, err = statusKB(b, "RssAnon"); err != nil {
		return 0, 0, err
	}
	return rss, anon, nil
}

// statusKB reads a field of a /proc/<pid>/status, which gives it in kB,
// in bytes.
func statusKB(status []byte, field string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		value, ok := strings.CutPrefix(sc.Text(), field+":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s %q: %w", field, value, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no %s in the status", field)
}

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
