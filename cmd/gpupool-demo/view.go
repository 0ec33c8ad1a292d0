package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/metrics/pkg/apis/external_metrics/v1beta1"

	"github.com/gpupool/gpupool/adapter"
	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/console"
	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
)

// show prints the header, then a view every refresh until ctx ends (nil)
// or a part of the demo fails (its error). A terminal gets each view on a
// cleared screen, under the header, so that its URLs and lines to try
// stay in sight.
func (d *demo) show(ctx context.Context, w io.Writer, gpupool string, refresh time.Duration) error {
	d.header(w, gpupool)
	redraw := isTerminal(w)
	t := time.NewTicker(refresh)
	defer t.Stop()
	start := time.Now()
	for {
		select {
		case <-d.parts.Done(): // ctx's end stops the parts too
			if ctx.Err() != nil {
				return nil
			}
			return context.Cause(d.parts)
		case <-t.C:
			if redraw {
				fmt.Fprint(w, "\033[H\033[2J")
				d.header(w, gpupool)
			}
			d.view(ctx, w, time.Since(start))
		}
	}
}

// header prints where the demo's parts listen and what to try with them:
// lines that run as printed (a shell comment says what each shows), with
// the gpupool client run as gpupool says (clientCommand).
func (d *demo) header(w io.Writer, gpupool string) {
	fmt.Fprintf(w, "gpupool-demo: allocator %s (tokens on: %s); logs in %s\n", d.allocatorURL, d.tokens.configFile, d.logFile)
	fmt.Fprintf(w, "  console: %s%s   # sign in with the admin token %s, or ml's %s\n", d.allocatorURL, console.Path, d.tokens.admin, d.tokens.tenant["ml"])
	fmt.Fprintf(w, "  metrics: %s/metrics\n", d.allocatorURL)
	for _, s := range d.servers {
		fmt.Fprintf(w, "  metrics: %s/metrics (%s)\n", s.url, s.name)
	}
	fmt.Fprintf(w, "  metrics: http://%s/metrics (adapter)\n", d.adapterMetrics)
	fmt.Fprintf(w, "  external metrics: %s (no authentication: loopback only)\n", d.adapterURL)
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
	gpuUse, leaseUse := d.usage(ctx)
	fmt.Fprintf(w, "gpupool-demo  t=%s  allocator %s  console %s%s\n\n", elapsed.Round(time.Second), d.allocatorURL, d.allocatorURL, console.Path)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVER\tGPU\tMODEL\tLEASED\tUTIL\tMEMORY")
	for _, s := range pool.Servers {
		for _, g := range s.GPUs {
			u := gpuUse[s.Name+"/"+fmt.Sprint(g.Index)]
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", s.Name, g.Index, g.Model, bar(g.Allocated().GPUs()),
				bar(utilization(u)), bar(float64(u.MemoryUsedBytes)/float64(u.MemoryBytes)))
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
			if u, ok := leaseUse[gpuapi.LeaseGPU{Lease: l.ID, GPU: g.Index}]; ok && u.SMUtilization != nil && g.Share > 0 {
				use = fmt.Sprintf("%.0f%%", 100**u.SMUtilization/g.Share.GPUs())
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
	fmt.Fprintf(w, "HPA signal: %s{namespace=ml, app=tf-training} = %s\n", adapter.GPUUtilization, d.hpaSignal(ctx))
}

// usage is the daemons' latest sampling rounds (GET /v1/usage): each
// GPU's reading by server/index, and what each lease uses of each GPU.
func (d *demo) usage(ctx context.Context) (map[string]gpuapi.GPUUsage, map[gpuapi.LeaseGPU]gpuapi.LeaseUsage) {
	gpus, leases := map[string]gpuapi.GPUUsage{}, map[gpuapi.LeaseGPU]gpuapi.LeaseUsage{}
	for _, s := range d.servers {
		u, err := gpuapi.FetchUsage(ctx, d.http, s.url)
		if err != nil {
			continue
		}
		for _, g := range u.GPUs {
			gpus[s.name+"/"+fmt.Sprint(g.Index)] = g
		}
		for _, l := range u.Leases {
			leases[l.Key()] = l
		}
	}
	return gpus, leases
}

// utilization is a GPU's reading, NaN when it has none.
func utilization(g gpuapi.GPUUsage) float64 {
	if g.Utilization == nil {
		return math.NaN()
	}
	return *g.Utilization
}

// hpaSignal is the value the adapter serves the HPA for the training
// group's utilization, as the HPA would read it.
func (d *demo) hpaSignal(ctx context.Context) string {
	query := "/namespaces/ml/" + adapter.GPUUtilization + "?labelSelector=" + url.QueryEscape("app=tf-training")
	var list v1beta1.ExternalMetricValueList
	if err := d.getJSON(ctx, d.adapterURL+query, &list); err != nil || len(list.Items) == 0 {
		return "no value (the HPA would hold)"
	}
	// The HPA compares the quantity (934m); people read 0.934.
	value := list.Items[0].Value
	return fmt.Sprintf("%.3f (the HPA reads %s)", value.AsApproximateFloat64(), value.String())
}

// getJSON decodes what GET address answers with 200 into out.
func (d *demo) getJSON(ctx context.Context, address string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, address, nil)
	if err != nil {
		return err
	}
	resp, err := d.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", address, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
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
