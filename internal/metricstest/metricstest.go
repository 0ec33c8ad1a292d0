// Package metricstest holds the checks every exporter's tests run: the
// exposition against docs/metrics.md (both ways), and promtool.
package metricstest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

var metricCell = regexp.MustCompile("^`bitfusion_[a-z_]+`$")

// Section returns the metrics of the table under the "## <heading>"
// section of the file: name -> type (the table's second column).
func Section(path, heading string) (map[string]string, error) {
	doc, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	_, section, ok := strings.Cut(string(doc), "\n## "+heading)
	if !ok {
		return nil, fmt.Errorf("%s has no %q section", path, "## "+heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	out := map[string]string{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) > 3 && metricCell.MatchString(strings.TrimSpace(cells[1])) {
			out[strings.Trim(strings.TrimSpace(cells[1]), "`")] = strings.TrimSpace(cells[2])
		}
	}
	return out, nil
}

// Diff lists how the exported families and the documented metrics differ;
// extra names may be documented without being exported by these families
// (metrics another part of the binary registers).
func Diff(families []*dto.MetricFamily, documented map[string]string, extra ...string) []string {
	var problems []string
	exported := map[string]bool{}
	for _, f := range families {
		exported[f.GetName()] = true
		typ := strings.ToLower(f.GetType().String())
		if got, ok := documented[f.GetName()]; !ok {
			problems = append(problems, fmt.Sprintf("%s (%s) is exported but not documented", f.GetName(), typ))
		} else if got != typ {
			problems = append(problems, fmt.Sprintf("%s is a %s, the doc says %s", f.GetName(), typ, got))
		}
	}
	for _, e := range extra {
		exported[e] = true
	}
	for name := range documented {
		if !exported[name] {
			problems = append(problems, fmt.Sprintf("%s is documented but not exported", name))
		}
	}
	return problems
}

// Promtool runs `promtool check metrics` on the families; ok is false when
// promtool is not installed (`make deps` installs it).
func Promtool(families []*dto.MetricFamily) (ok bool, err error) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		return false, nil
	}
	var text bytes.Buffer
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(&text, f); err != nil {
			return true, err
		}
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = &text
	if msg, err := cmd.CombinedOutput(); err != nil {
		return true, fmt.Errorf("promtool check metrics: %w\n%s", err, msg)
	}
	return true, nil
}
