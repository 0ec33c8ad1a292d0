package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/cmd/options"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"

	"github.com/gpupool/gpupool/adapter"
	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/allocator/service"
	"github.com/gpupool/gpupool/allocator/store"
	"github.com/gpupool/gpupool/collector"
	"github.com/gpupool/gpupool/gpuserver"
	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
)

// demoServers are the simulated GPU servers of the demo: mixed models.
var demoServers = []struct{ name, gpus string }{
	{"sim-h100-0", "H100:80Gi:8"},
	{"sim-a100-0", "A100:40Gi:4"},
	{"sim-t4-0", "T4:16Gi:4"},
}

// demoQuotas are the demo's namespace quotas, in percent of one GPU.
var demoQuotas = map[string]int64{"ml": 400, "team-b": 300}

func demoCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	duration := fs.Duration("duration", 0, "how long to run; 0 runs until Ctrl-C")
	refresh := fs.Duration("refresh", time.Second, "time between views")
	seed := fs.Uint64("seed", 1, "seed of the simulated GPUs and the workload")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: gpupool demo [flags]

Runs the whole pool on this machine, no cluster and no GPU: the allocator
(embedded store in a temp dir), simulated GPU servers with mixed models
(each a real gpupool-server daemon on the simulated source), and a workload:
a training group (app=tf-training in namespace ml) whose load rises and
falls, and other tenants taking fractional leases. Tokens are on, as
deployed: the allocator's config in the temp dir has random tokens for an
admin, the GPU servers and each namespace, and each part holds its own.
Prints where each /metrics is and how to use the tokens, then a live view
every second.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	d, err := startDemo(ctx, *seed)
	if err != nil {
		fmt.Fprintln(stderr, "gpupool demo:", err)
		return 1
	}
	defer d.close()
	fmt.Fprintf(stdout, "gpupool demo: allocator %s (tokens on: %s); logs in %s\n", d.allocatorURL, d.tokens.configFile, d.logFile)
	fmt.Fprintf(stdout, "  metrics: %s/metrics\n", d.allocatorURL)
	for _, s := range d.servers {
		fmt.Fprintf(stdout, "  metrics: %s/metrics (%s)\n", s.url, s.name)
	}
	fmt.Fprintf(stdout, "  external metrics: %s (no authentication: loopback only; its own metrics are on the allocator's)\n", d.adapterURL)
	fmt.Fprintf(stdout, "  try: curl -sk '%s/namespaces/ml/bitfusion_gpu_utilization?labelSelector=app%%3Dtf-training'\n", d.adapterURL)
	fmt.Fprintf(stdout, "  try: GPUPOOL_ALLOCATOR=%s GPUPOOL_TOKEN=%s GPUPOOL_NAMESPACE=ml gpupool pool status   (namespace ml's token: gpupool leases, quota and run act in ml only)\n",
		d.allocatorURL, d.tokens.tenant["ml"])
	fmt.Fprintf(stdout, "  try: curl -s -H 'Authorization: Bearer %s' %s/v1/leases   (admin token: every namespace)\n\n", d.tokens.admin, d.allocatorURL)
	clear := isTerminal(stdout)
	t := time.NewTicker(*refresh)
	defer t.Stop()
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(stdout, "gpupool demo: stopped")
			return 0
		case <-t.C:
			if clear {
				fmt.Fprint(stdout, "\033[H\033[2J")
			}
			d.view(ctx, stdout, time.Since(start))
		}
	}
}

type demoServer struct {
	name, url string
	sampler   *collector.Sampler
	daemon    *gpuserver.Daemon
}

type demo struct {
	allocatorURL, logFile, adapterURL string
	tokens                            *demoTokens
	// client holds the admin token: the view is the operator's.
	client    *client.Client
	servers   []*demoServer
	adapter   *adapter.Provider
	log       *slog.Logger
	logWriter io.Writer
	closers   []func()
}

func (d *demo) close() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
}

// serve serves h on a loopback port and returns its URL.
func (d *demo) serve(h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	d.serveOn(ln, h)
	return "http://" + ln.Addr().String(), nil
}

// serveOn serves h on ln until the demo closes.
func (d *demo) serveOn(ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	d.closers = append(d.closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
}

func startDemo(ctx context.Context, seed uint64) (*demo, error) {
	dir, err := os.MkdirTemp("", "gpupool-demo-")
	if err != nil {
		return nil, err
	}
	d := &demo{logFile: filepath.Join(dir, "demo.log")}
	d.closers = append(d.closers, func() { _ = os.RemoveAll(dir) })
	logf, err := os.Create(d.logFile)
	if err != nil {
		return nil, err
	}
	d.closers = append(d.closers, func() { _ = logf.Close() })
	log := slog.New(slog.NewTextHandler(logf, nil))
	d.log, d.logWriter = log, logf

	tokens, config, err := writeDemoConfig(dir)
	if err != nil {
		return nil, err
	}
	d.tokens = tokens
	st, err := store.OpenBolt(filepath.Join(dir, "allocator"), time.Second)
	if err != nil {
		return nil, err
	}
	d.closers = append(d.closers, func() { _ = st.Close() })
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	svc, err := service.New(ctx, service.Config{
		Store: st, Policy: "fgd-cpu", Seed: seed, DefaultTTL: 30 * time.Second, MaxTTL: time.Hour,
		HeartbeatTimeout: 10 * time.Second, Quotas: config.Quotas(), Registry: reg, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	go svc.Run(ctx, time.Second)
	if d.allocatorURL, err = d.serve(service.Handler(svc, service.NewAuthenticator(config), reg, log)); err != nil {
		return nil, err
	}
	if d.client, err = client.New([]string{d.allocatorURL}, tokens.admin); err != nil {
		return nil, err
	}
	// The daemons share the servers token; each namespace's workload holds
	// its own.
	servers, err := client.New([]string{d.allocatorURL}, tokens.servers)
	if err != nil {
		return nil, err
	}
	tenants := map[string]*client.Client{}
	for ns, token := range tokens.tenant {
		if tenants[ns], err = client.New([]string{d.allocatorURL}, token); err != nil {
			return nil, err
		}
	}

	for i, spec := range demoServers {
		gpus, err := collector.ParseSimulatedGPUs(spec.gpus)
		if err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		s := &demoServer{name: spec.name, url: "http://" + ln.Addr().String()}
		sim := &collector.Simulated{Server: spec.name, Seed: seed + uint64(i), GPUs: gpus, Clock: time.Now, Demand: demoDemand,
			Leases: func() []allocator.Lease { return s.daemon.Leases() }}
		s.sampler = collector.NewSampler(sim, time.Second, 2, nil)
		s.daemon = gpuserver.New(gpuserver.Config{
			Inventory: sim.Inventory(int64(len(gpus))*16000, int64(len(gpus))*(64<<30), map[string]string{gpuapi.LabelDaemonURL: s.url}),
			Client:    servers, Samplers: []*collector.Sampler{s.sampler}, Heartbeat: 2 * time.Second, LabelAllowlist: []string{"app"}, Log: log,
		})
		d.serveOn(ln, gpuserver.Handler(s.daemon, gpuserver.Registry(s.daemon)))
		go s.sampler.Run(ctx)
		go s.daemon.Run(ctx)
		if err := d.probe(ctx, s.daemon); err != nil {
			return nil, err
		}
		d.servers = append(d.servers, s)
	}
	if err := d.startAdapter(ctx, dir, reg); err != nil {
		return nil, fmt.Errorf("starting the adapter: %w", err)
	}
	go runWorkload(ctx, tenants, seed, log)
	return d, nil
}

// probe has the server answer data-path probes on loopback and a client
// node probe it, as `gpupool run` does, so the latency series have data.
func (d *demo) probe(ctx context.Context, daemon *gpuserver.Daemon) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go daemon.ServeProbes(ctx, ln, time.Second)
	go func() {
		_ = gpuserver.DialProbe(ctx, ln.Addr().String(), "demo-client-0", time.Second, func(time.Duration) {})
	}()
	return nil
}

// startAdapter serves the external metrics API on loopback with the
// direct backend, which reads the pool with the admin token. There is no
// cluster to delegate authentication to, so it serves everyone: the demo
// says so.
func (d *demo) startAdapter(ctx context.Context, dir string, reg prometheus.Registerer) error {
	// The API server logs through klog; keep it in the demo's log.
	klog.LogToStderr(false)
	klog.SetOutput(d.logWriter)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	opts := options.NewCustomMetricsAdapterServerOptions()
	opts.SecureServing.Listener = ln
	opts.SecureServing.BindPort = ln.Addr().(*net.TCPAddr).Port
	opts.SecureServing.ServerCert.CertDirectory = filepath.Join(dir, "adapter-certs")
	d.adapter = adapter.NewProvider(adapter.NewDirect(d.client, 500*time.Millisecond, d.log), 30*time.Second,
		adapter.NewMetrics(reg), nil, d.log)
	srv, err := adapter.NewServer(opts, nil, d.adapter)
	if err != nil {
		return err
	}
	go func() { _ = srv.GenericAPIServer.PrepareRun().RunWithContext(ctx) }()
	d.adapterURL = "https://" + ln.Addr().String() + "/apis/external.metrics.k8s.io/v1beta1"
	return nil
}

// demoDemand drives the simulated GPUs: the training group's load rises
// and falls over two minutes; other leases follow a faster wave.
func demoDemand(leases []allocator.Lease, t time.Time) map[string]float64 {
	out := make(map[string]float64, len(leases))
	for _, l := range leases {
		if l.Owner.Labels["app"] == "tf-training" {
			out[l.ID] = 0.55 + 0.4*math.Sin(2*math.Pi*float64(t.UnixMilli()%120000)/120000)
		} else {
			out[l.ID] = 0.3 + 0.2*math.Sin(2*math.Pi*float64(t.UnixMilli()%45000)/45000)
		}
	}
	return out
}

// runWorkload holds the training group's leases and lets other tenants
// come and go, renewing what it holds as `gpupool run` does, each with
// its namespace's client (tenants).
func runWorkload(ctx context.Context, tenants map[string]*client.Client, seed uint64, log *slog.Logger) {
	rng := rand.New(rand.NewPCG(seed, 99))
	type held struct {
		id, pod string
		c       *client.Client
		until   time.Time
	}
	var leases []held
	acquire := func(r api.AcquireRequest, hold time.Duration) {
		c := tenants[r.Namespace]
		l, err := c.Acquire(ctx, r)
		if err != nil {
			log.Info("workload request refused", "namespace", r.Namespace, "pod", r.Owner.Pod, "err", err)
			return
		}
		leases = append(leases, held{l.ID, r.Owner.Pod, c, time.Now().Add(hold)})
	}
	// The training group is a Deployment of three replicas: each holds a
	// lease, and a replica without one asks again.
	training := func() {
		for i := range 3 {
			pod := fmt.Sprint("tf-training-", i)
			if !slices.ContainsFunc(leases, func(h held) bool { return h.pod == pod }) {
				acquire(api.AcquireRequest{Namespace: "ml", GPUAmount: 1, GPUPercent: 50, TTL: "30s",
					Owner: allocator.Owner{Pod: pod, UID: "uid-" + pod, Labels: map[string]string{"app": "tf-training"}}}, 24*time.Hour)
			}
		}
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		kept := leases[:0]
		for _, h := range leases {
			if time.Now().After(h.until) {
				_ = h.c.Release(ctx, h.id)
				continue
			}
			if _, err := h.c.Renew(ctx, h.id, 30*time.Second); err == nil {
				kept = append(kept, h)
			}
		}
		leases = kept
		training()
		if rng.IntN(2) == 0 {
			pod := fmt.Sprint("job-", n)
			r := api.AcquireRequest{Namespace: "team-b", GPUAmount: 1, TTL: "30s",
				Owner: allocator.Owner{Pod: pod, UID: "uid-" + pod, Labels: map[string]string{"app": "batch"}}}
			switch rng.IntN(3) {
			case 0:
				r.GPUPercent = 25
			case 1:
				r.GPUMemory = "8Gi"
			default:
				r.GPUAmount, r.GPUPercent = 2, 100
			}
			acquire(r, time.Duration(5+rng.IntN(20))*time.Second)
		}
		if rng.IntN(4) == 0 {
			pod := fmt.Sprint("notebook-", n)
			acquire(api.AcquireRequest{Namespace: "ml", GPUAmount: 1, GPUPercent: 10, TTL: "30s",
				Owner: allocator.Owner{Pod: pod, UID: "uid-" + pod, Labels: map[string]string{"app": "notebook"}}}, 20*time.Second)
		}
	}
}

// view prints servers and GPUs, leases with their use, and quota use.
func (d *demo) view(ctx context.Context, w io.Writer, elapsed time.Duration) {
	pool, err := d.client.Pool(ctx)
	if err != nil {
		return
	}
	leases, _ := d.client.Leases(ctx, client.LeaseFilter{})
	quotas, _ := d.client.Quotas(ctx)
	gpuUse := map[string]collector.GPU{}
	leaseUse := map[string]*gpuserver.LeaseUse{}
	for _, s := range d.servers {
		for _, g := range s.sampler.Latest().GPUs {
			gpuUse[s.name+"/"+fmt.Sprint(g.Index)] = g
		}
		use, _ := s.daemon.Usage()
		for k, u := range use {
			leaseUse[k[0]+"/"+k[1]] = u
		}
	}
	fmt.Fprintf(w, "gpupool demo  t=%s  allocator %s\n\n", elapsed.Round(time.Second), d.allocatorURL)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVER\tGPU\tMODEL\tLEASED\tUTIL\tMEMORY")
	for _, s := range pool.Servers {
		for _, g := range s.GPUs {
			u := gpuUse[s.Name+"/"+fmt.Sprint(g.Index)]
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", s.Name, g.Index, g.Model, bar(float64(g.AllocatedMilli)/1000),
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
			if u := leaseUse[l.ID+"/"+fmt.Sprint(g.Index)]; u != nil && u.SMKnown && g.Milli > 0 {
				use = fmt.Sprintf("%.0f%%", 100*u.ShareUtilization(g.Milli))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s/%d\t%s%%\t%s\n", l.ID, l.Namespace, l.Owner.Pod, l.Owner.Labels["app"],
				l.Server, g.Index, api.FormatMilli(int64(g.Milli)), use)
		}
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	for _, q := range quotas {
		hard := "no quota"
		if q.Limited {
			hard = fmt.Sprintf("of %g", q.Hard)
		}
		fmt.Fprintf(w, "quota %s: %g %s   ", q.Namespace, q.Used, hard)
	}
	fmt.Fprintln(w)
	sel := labels.SelectorFromSet(labels.Set{"app": "tf-training"})
	signal := "no value (the HPA would hold)"
	if v, err := d.adapter.GetExternalMetric(ctx, "ml", sel, provider.ExternalMetricInfo{Metric: adapter.GPUUtilization}); err == nil && len(v.Items) > 0 {
		signal = v.Items[0].Value.String()
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

// isTerminal reports whether w is a terminal, to redraw in place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
