package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"

	"github.com/gpupool/gpupool/adapter"
	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/collector"
	"github.com/gpupool/gpupool/gpuserver"
	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
)

// header prints where the demo's parts listen and what to try with them:
// lines that run as printed (a shell comment says what each shows), with
// the gpupool client run as gpupool says (clientCommand).
func (d *demo) header(w io.Writer, gpupool string) {
	fmt.Fprintf(w, "gpupool-demo: allocator %s (tokens on: %s); logs in %s\n", d.allocatorURL, d.tokens.configFile, d.logFile)
	fmt.Fprintf(w, "  metrics: %s/metrics\n", d.allocatorURL)
	for _, s := range d.servers {
		fmt.Fprintf(w, "  metrics: %s/metrics (%s)\n", s.url, s.name)
	}
	fmt.Fprintf(w, "  external metrics: %s (no authentication: loopback only; its own metrics are on the allocator's)\n", d.adapterURL)
	fmt.Fprintf(w, "  try: curl -sk '%s/namespaces/ml/bitfusion_gpu_utilization?labelSelector=app%%3Dtf-training'\n", d.adapterURL)
	fmt.Fprintf(w, "  try: GPUPOOL_ALLOCATOR=%s GPUPOOL_TOKEN=%s GPUPOOL_NAMESPACE=ml %s pool status   # namespace ml's token: leases, quota and run act in ml only\n",
		d.allocatorURL, d.tokens.tenant["ml"], gpupool)
	fmt.Fprintf(w, "  try: curl -s -H 'Authorization: Bearer %s' %s/v1/leases   # the admin token: every namespace\n\n", d.tokens.admin, d.allocatorURL)
}

// view prints servers and GPUs, leases with their use, and quota use.
func (d *demo) view(ctx context.Context, w io.Writer, elapsed time.Duration) {
	pool, err := d.client.Pool(ctx)
	if err != nil {
		return
	}
	listed, _ := d.client.Leases(ctx, client.LeaseFilter{})
	leases := api.CoreLeases(listed)
	quotas, _ := d.client.Quotas(ctx)
	gpuUse := map[string]collector.GPU{}
	leaseUse := map[gpuapi.LeaseGPU]*gpuserver.LeaseUse{}
	for _, s := range d.servers {
		for _, g := range s.host.Sampler.Latest().GPUs {
			gpuUse[s.name+"/"+fmt.Sprint(g.Index)] = g
		}
		use, _ := s.host.Daemon.Usage()
		maps.Copy(leaseUse, use)
	}
	fmt.Fprintf(w, "gpupool-demo  t=%s  allocator %s\n\n", elapsed.Round(time.Second), d.allocatorURL)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVER\tGPU\tMODEL\tLEASED\tUTIL\tMEMORY")
	for _, s := range pool.Servers {
		for _, g := range s.GPUs {
			u := gpuUse[s.Name+"/"+fmt.Sprint(g.Index)]
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", s.Name, g.Index, g.Model, bar(g.Allocated().GPUs()),
				bar(u.Utilization), bar(u.MemoryPressure()))
		}
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LEASE\tNAMESPACE\tPOD\tAPP\tGPU\tSHARE\tUSE OF SHARE")
	slices.SortFunc(leases, func(a, b allocator.Lease) int {
		return strings.Compare(a.Namespace+a.Owner.Pod, b.Namespace+b.Owner.Pod)
	})
	for _, l := range leases {
		for _, g := range l.GPUs {
			use := "-"
			if u := leaseUse[gpuapi.LeaseGPU{Lease: l.ID, GPU: g.Index}]; u != nil && u.SMKnown && g.Share > 0 {
				use = fmt.Sprintf("%.0f%%", 100*u.ShareUtilization(g.Share))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s/%d\t%s\t%s\n", l.ID, l.Namespace, l.Owner.Pod, l.Owner.Labels["app"],
				l.Server, g.Index, g.Share, use)
		}
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	for _, wire := range quotas {
		q := wire.Core()
		hard := "no quota"
		if q.Limited {
			hard = "of " + q.Hard.String()
		}
		fmt.Fprintf(w, "quota %s: %s %s   ", q.Namespace, q.Used, hard)
	}
	fmt.Fprintln(w)
	sel := labels.SelectorFromSet(labels.Set{"app": "tf-training"})
	signal := "no value (the HPA would hold)"
	if v, err := d.adapter.GetExternalMetric(ctx, "ml", sel, provider.ExternalMetricInfo{Metric: adapter.GPUUtilization}); err == nil && len(v.Items) > 0 {
		// The HPA compares the quantity (934m); people read 0.934.
		value := v.Items[0].Value
		signal = fmt.Sprintf("%.3f (the HPA reads %s)", value.AsApproximateFloat64(), value.String())
	}
	fmt.Fprintf(w, "HPA signal: %s{namespace=ml, app=tf-training} = %s\n", adapter.GPUUtilization, signal)
}

// bar draws a ratio as a 10-cell bar and a percent.
func bar(r float64) string {
	if math.IsNaN(r) {
		return "-"
	}
	r = math.Max(0, math.Min(1, r))
	n := int(math.Round(r * 10))
	return strings.Repeat("#", n) + strings.Repeat(".", 10-n) + fmt.Sprintf(" %3.0f%%", 100*r)
}

// clientCommand is how to run the gpupool client from the directory wd,
// given this program's path: the binary next to it (`make demo` builds
// both into bin/), else go run, from the repository's root.
func clientCommand(self, wd string) string {
	bin := filepath.Join(filepath.Dir(self), "gpupool")
	if _, err := os.Stat(bin); err != nil {
		return "go run ./cmd/gpupool"
	}
	if rel, err := filepath.Rel(wd, bin); err == nil && filepath.IsLocal(rel) {
		return "./" + rel
	}
	return bin
}

// isTerminal reports whether w is a terminal, to redraw in place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
