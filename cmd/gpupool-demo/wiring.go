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
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/klog/v2"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/cmd/options"

	"github.com/gpupool/gpupool/adapter"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/allocator/service"
	"github.com/gpupool/gpupool/allocator/store"
	"github.com/gpupool/gpupool/fakegpu"
	"github.com/gpupool/gpupool/gpuserver"
	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
	"github.com/gpupool/gpupool/internal/httpserver"
)

// demoServers are the simulated GPU servers of the demo: mixed models.
var demoServers = []struct{ name, gpus string }{
	{"sim-h100-0", "H100:80Gi:8"},
	{"sim-a100-0", "A100:40Gi:4"},
	{"sim-t4-0", "T4:16Gi:4"},
}

// demoQuotas are the demo's namespace quotas, in percent of one GPU.
var demoQuotas = map[string]int64{"ml": 400, "team-b": 300}

// demoServer is one simulated GPU server: a gpupool-server daemon on the
// simulated source.
type demoServer struct {
	name, url string
	host      *gpuserver.Host
}

// demo is the pool running on this machine.
type demo struct {
	allocatorURL, adapterURL string
	// logFile is where the parts log; it stays after the demo.
	logFile string
	tokens  *demoTokens
	// client holds the admin token: the view is the operator's.
	client *client.Client
	// tenants is each namespace's client, with its token: the workload's.
	tenants   map[string]*client.Client
	servers   []*demoServer
	adapter   *adapter.Provider
	log       *slog.Logger
	logWriter io.Writer
	// stop ends the parts' loops, running on parts, which close waits
	// for before it closes what they use.
	parts   context.Context
	stop    context.CancelFunc
	running sync.WaitGroup
	closers []func()
}

// startWorkload takes a step of w every interval until the demo closes.
func (d *demo) startWorkload(w *workload, interval time.Duration) {
	d.running.Go(func() { w.run(d.parts, interval) })
}

// close stops the demo and removes its files, the log aside.
func (d *demo) close() {
	d.stop()
	d.running.Wait()
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
}

// serve serves h on a loopback port until the demo closes, and returns
// its URL.
func (d *demo) serve(h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := httpserver.New(h, httpserver.Default)
	go func() { _ = srv.Serve(ln) }()
	d.closers = append(d.closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return "http://" + ln.Addr().String(), nil
}

// startDemo starts the allocator, the GPU servers and the adapter, which
// run until ctx ends or the demo closes; the workload is the caller's to
// start (startWorkload). The servers register one after the other, so that the pool
// orders them alike on every run: placement breaks ties by that order.
func startDemo(ctx context.Context, seed uint64) (_ *demo, err error) {
	d := &demo{}
	d.parts, d.stop = context.WithCancel(ctx)
	ctx = d.parts
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	dir, err := os.MkdirTemp("", "gpupool-demo-")
	if err != nil {
		return nil, err
	}
	d.closers = append(d.closers, func() { _ = os.RemoveAll(dir) })
	// Outside dir, so that it can be read after the demo.
	logf, err := os.CreateTemp("", "gpupool-demo-*.log")
	if err != nil {
		return nil, err
	}
	d.closers = append(d.closers, func() { _ = logf.Close() })
	d.logFile, d.logWriter = logf.Name(), logf
	d.log = slog.New(slog.NewTextHandler(logf, nil))

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
		HeartbeatTimeout: 10 * time.Second, Quotas: config.Quotas(), Registry: reg, Logger: d.log,
	})
	if err != nil {
		return nil, err
	}
	d.running.Go(func() { svc.Run(ctx, time.Second) })
	if d.allocatorURL, err = d.serve(service.Handler(svc, service.NewAuthenticator(config), reg, d.log)); err != nil {
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
	d.tenants = map[string]*client.Client{}
	for ns, token := range tokens.tenant {
		if d.tenants[ns], err = client.New([]string{d.allocatorURL}, token); err != nil {
			return nil, err
		}
	}
	for i, spec := range demoServers {
		if err := d.startServer(ctx, spec.name, spec.gpus, seed+uint64(i), servers); err != nil {
			return nil, fmt.Errorf("starting %s: %w", spec.name, err)
		}
	}
	if err := d.startAdapter(ctx, dir, reg); err != nil {
		return nil, fmt.Errorf("starting the adapter: %w", err)
	}
	return d, nil
}

// startServer starts a GPU server's daemon on simulated GPUs (gpus, as
// --simulate-gpus) and waits until it registered. A client node probes its
// data path, as `gpupool run` does, so that the latency series have data.
func (d *demo) startServer(ctx context.Context, name, gpus string, seed uint64, servers *client.Client) error {
	simulated, err := fakegpu.ParseGPUs(gpus)
	if err != nil {
		return err
	}
	httpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	probeLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	s := &demoServer{name: name, url: "http://" + httpLn.Addr().String()}
	sim := &fakegpu.Source{Server: name, Seed: seed, GPUs: simulated, Demand: demoDemand}
	n := int64(len(simulated))
	s.host, err = gpuserver.NewHost(gpuserver.HostConfig{
		Config: gpuserver.Config{Inventory: sim.Inventory(n*16000, n*(64<<30), map[string]string{gpuapi.LabelDaemonURL: s.url}),
			Client: servers, Heartbeat: 2 * time.Second, LabelAllowlist: []string{"app"}, Log: d.log},
		Source: sim, Interval: time.Second, ProcessEvery: 2,
	})
	if err != nil {
		return err
	}
	d.running.Go(func() {
		if err := s.host.Serve(ctx, gpuserver.Listeners{HTTP: httpLn, Probes: probeLn}); err != nil {
			d.log.Error("serving", "server", name, "err", err)
		}
	})
	d.running.Go(func() {
		_ = gpuapi.DialProbe(ctx, probeLn.Addr().String(), "demo-client-0", time.Second, func(time.Duration) {})
	})
	d.servers = append(d.servers, s)
	return d.awaitRegistered(ctx, name)
}

// registerTimeout bounds the wait for a server to register.
const registerTimeout = 30 * time.Second

// awaitRegistered waits until the pool lists the server, at most
// registerTimeout.
func (d *demo) awaitRegistered(ctx context.Context, name string) error {
	wait, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	for {
		if pool, err := d.client.Pool(wait); err == nil && slices.ContainsFunc(pool.Servers, func(s api.ServerStatus) bool { return s.Name == name }) {
			return nil
		}
		select {
		case <-wait.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("not registered with the allocator after %s (%s says why)", registerTimeout, d.logFile)
		case <-time.After(20 * time.Millisecond):
		}
	}
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
	d.running.Go(func() {
		if err := srv.GenericAPIServer.PrepareRun().RunWithContext(ctx); err != nil {
			d.log.Error("adapter", "err", err)
		}
	})
	d.adapterURL = "https://" + ln.Addr().String() + "/apis/external.metrics.k8s.io/v1beta1"
	return nil
}
