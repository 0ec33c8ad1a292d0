// Command gen writes gpupool's Grafana dashboards and their kustomization
// into dashboards/ (run from the repository root: `go run ./dashboards/gen`);
// with -check it writes nothing and fails when the files there differ.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/gpupool/gpupool/dashboards"
)

func main() {
	check := flag.Bool("check", false, "compare the files in -dir with what would be written, and fail listing those that differ")
	dir := flag.String("dir", "dashboards", "where the files are")
	var c dashboards.Config
	flag.StringVar(&c.Selector, "selector", "", `matchers added to every selector of gpupool's series, e.g. job=~"gpupool-.*"`)
	flag.StringVar(&c.KubeStateMetricsSelector, "kube-state-metrics-selector", "", `matchers added to every selector of kube-state-metrics' series, e.g. job="kube-state-metrics"`)
	flag.Parse()
	files, err := dashboards.Files(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboards/gen:", err)
		os.Exit(1)
	}
	if !*check {
		if err := dashboards.Write(*dir, files); err != nil {
			fmt.Fprintln(os.Stderr, "dashboards/gen:", err)
			os.Exit(1)
		}
		return
	}
	diffs, err := dashboards.Check(*dir, files)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboards/gen:", err)
		os.Exit(1)
	}
	if len(diffs) > 0 {
		for _, d := range diffs {
			fmt.Fprintf(os.Stderr, "%s/%s\n", *dir, d)
		}
		fmt.Fprintln(os.Stderr, "dashboards/gen: the committed dashboards are out of date: run `go run ./dashboards/gen`")
		os.Exit(1)
	}
}
