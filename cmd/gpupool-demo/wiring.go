package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/klog/v2"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/cmd/options"

	"github.com/gpupool/gpupool/adapter"
	"github.com/gpupool/gpupool/allocator"
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
		_ = gpuapi.DialProbe(ctx, ln.Addr().String(), "demo-client-0", time.Second, func(time.Duration) {})
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
