package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpupool/gpupool/adapter"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	adapterapp "github.com/gpupool/gpupool/cmd/gpupool-adapter/app"
	allocatorapp "github.com/gpupool/gpupool/cmd/gpupool-allocator/app"
	serverapp "github.com/gpupool/gpupool/cmd/gpupool-server/app"
	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
	"github.com/gpupool/gpupool/internal/cli"
)

// demoServers are the simulated GPU servers of the demo: mixed models,
// with 16 cores per GPU.
var demoServers = []struct {
	name, gpus string
	cpuMilli   int64
}{
	{"sim-h100-0", "H100:80Gi:8", 8 * 16000},
	{"sim-a100-0", "A100:40Gi:4", 4 * 16000},
	{"sim-t4-0", "T4:16Gi:4", 4 * 16000},
}

// demoQuotas are the demo's namespace quotas, in percent of one GPU.
var demoQuotas = map[string]int64{"ml": 400, "team-b": 300}

// demoServer is one simulated GPU server: a gpupool-server daemon on the
// simulated source, at the URL it registered with.
type demoServer struct{ name, url string }

// demo is the pool running on this machine: each part is its binary's
// app.Run, which the demo reaches over HTTP as the other parts do.
type demo struct {
	allocatorURL, adapterURL string
	// adapterMetrics is the adapter's own /metrics, host and port.
	adapterMetrics string
	// logFile is where the parts log; it stays after the demo.
	logFile string
	tokens  *demoTokens
	// client holds the admin token: the view is the operator's.
	client *client.Client
	// tenants is each namespace's client, with its token: the workload's.
	tenants map[string]*client.Client
	servers []demoServer
	// http reads the daemons' usage and the adapter, whose certificate it
	// trusts.
	http *http.Client
	log  *slog.Logger
	// stop ends the parts, running on parts, which close waits for
	// before it closes what they use; a part that fails stops them all,
	// with its error as the cause.
	parts   context.Context
	stop    context.CancelCauseFunc
	running sync.WaitGroup
	closers []func()
}

// startWorkload takes a step of w every interval until the demo closes.
func (d *demo) startWorkload(w *workload, interval time.Duration) {
	d.running.Go(func() { w.run(d.parts, interval) })
}

// close stops the demo and removes its files, the log aside.
func (d *demo) close() {
	d.stop(nil)
	d.running.Wait()
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
}

// startDemo starts the allocator, the GPU servers and the adapter, which
// run until ctx ends, the demo closes or one of them fails; the workload
// is the caller's to start (startWorkload). The servers register one
// after the other, so that the pool orders them alike on every run:
// placement breaks ties by that order.
func startDemo(ctx context.Context, seed uint64) (_ *demo, err error) {
	d := &demo{}
	d.parts, d.stop = context.WithCancelCause(ctx)
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
	d.logFile, d.log = logf.Name(), slog.New(slog.NewTextHandler(logf, nil))
	// The adapter's API server logs through klog; keep it in the demo's log.
	klog.LogToStderr(false)
	klog.SetOutput(logf)
	if d.tokens, err = writeDemoTokens(dir); err != nil {
		return nil, err
	}
	if err := d.startAllocator(dir, seed); err != nil {
		return nil, fmt.Errorf("starting the allocator: %w", err)
	}
	for i, s := range demoServers {
		if err := d.startServer(s.name, s.gpus, s.cpuMilli, seed+uint64(i)); err != nil {
			return nil, fmt.Errorf("starting %s: %w", s.name, err)
		}
	}
	if err := d.startAdapter(dir); err != nil {
		return nil, fmt.Errorf("starting the adapter: %w", err)
	}
	return d, nil
}

// startPart validates a part's options and runs it (its binary's app.Run)
// until the demo closes; a part that fails stops the demo.
func startPart[O interface{ Validate() error }](d *demo, name string, o O, run func(context.Context, O, *slog.Logger) error) error {
	if err := o.Validate(); err != nil {
		return err
	}
	d.running.Go(func() {
		if err := run(d.parts, o, d.log); err != nil {
			d.log.Error("stopping", "part", name, "err", err)
			d.stop(fmt.Errorf("%s: %w", name, err))
		}
	})
	return nil
}

// startAllocator starts the allocator on a loopback port, with its store
// and config in dir, and makes the clients of the view and the workload.
func (d *demo) startAllocator(dir string, seed uint64) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	o := allocatorapp.NewOptions()
	o.Listener, o.DataDir, o.ConfigFile, o.Seed = ln, filepath.Join(dir, "allocator"), d.tokens.configFile, seed
	o.HeartbeatTimeout = 10 * time.Second
	if err := startPart(d, "allocator", o, allocatorapp.Run); err != nil {
		return err
	}
	d.allocatorURL = "http://" + ln.Addr().String()
	if d.client, err = client.New([]string{d.allocatorURL}, d.tokens.admin); err != nil {
		return err
	}
	d.tenants = map[string]*client.Client{}
	for ns, token := range d.tokens.tenant {
		if d.tenants[ns], err = client.New([]string{d.allocatorURL}, token); err != nil {
			return err
		}
	}
	return nil
}

// startServer starts a GPU server's daemon on simulated GPUs (gpus, as
// --simulate-gpus) on loopback ports, and waits until it registered,
// saying where. A client node probes its data path, as `gpupool run`
// does, so that the latency series have data.
func (d *demo) startServer(name, gpus string, cpuMilli int64, seed uint64) error {
	o := serverapp.NewOptions()
	o.Name, o.Allocator, o.Tokens = name, d.allocatorURL, cli.TokenFile(d.tokens.serversFile)
	o.Listen, o.ProbeListen, o.ProcessSocket = "127.0.0.1:0", "127.0.0.1:0", ""
	o.SimulateGPUs, o.SimulateTopology, o.Seed, o.SimulatedDemand, o.CPUMilli = gpus, "none", seed, demoDemand, cpuMilli
	o.Heartbeat, o.ProcessEvery = 2*time.Second, 2
	if err := startPart(d, name, o, serverapp.Run); err != nil {
		return err
	}
	registered, err := d.awaitRegistered(name)
	if err != nil {
		return err
	}
	d.servers = append(d.servers, demoServer{name: name, url: registered.Labels[gpuapi.LabelDaemonURL]})
	d.running.Go(func() {
		_ = gpuapi.DialProbe(d.parts, registered.Labels[gpuapi.LabelProbeAddress], "demo-client-0", time.Second, func(time.Duration) {})
	})
	return nil
}

// registerTimeout bounds the wait for a server to register.
const registerTimeout = 30 * time.Second

// awaitRegistered waits until the pool lists the server, at most
// registerTimeout, and returns it as listed.
func (d *demo) awaitRegistered(name string) (api.ServerStatus, error) {
	wait, cancel := context.WithTimeout(d.parts, registerTimeout)
	defer cancel()
	for {
		if pool, err := d.client.Pool(wait); err == nil {
			if i := slices.IndexFunc(pool.Servers, func(s api.ServerStatus) bool { return s.Name == name }); i >= 0 {
				return pool.Servers[i], nil
			}
		}
		select {
		case <-wait.Done():
			if d.parts.Err() != nil {
				return api.ServerStatus{}, context.Cause(d.parts)
			}
			return api.ServerStatus{}, fmt.Errorf("not registered with the allocator after %s (%s says why)", registerTimeout, d.logFile)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// startAdapter serves the external metrics API on a loopback port with
// the direct backend, which reads the pool with the admin token. There is
// no cluster to delegate authentication to, so it serves everyone: the
// demo says so. Its certificate is made here, for the view to trust it.
func (d *demo) startAdapter(dir string) error {
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	metricsLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	o := adapterapp.NewOptions()
	o.Allocator, o.AllocatorTokenFile, o.NoDelegation, o.MetricsListener = d.allocatorURL, d.tokens.adminFile, true, metricsLn
	serving := o.Serving.SecureServing
	serving.Listener, serving.BindAddress, serving.BindPort = apiLn, net.IPv4(127, 0, 0, 1), apiLn.Addr().(*net.TCPAddr).Port
	serving.ServerCert.CertDirectory = filepath.Join(dir, "adapter-certs")
	if err := adapter.SelfSignedCert(o.Serving); err != nil {
		return err
	}
	cert, err := os.ReadFile(serving.ServerCert.CertKey.CertFile)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(cert) {
		return fmt.Errorf("%s holds no certificate", serving.ServerCert.CertKey.CertFile)
	}
	d.http = &http.Client{Timeout: 2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	if err := startPart(d, "adapter", o, adapterapp.Run); err != nil {
		return err
	}
	d.adapterURL = "https://" + apiLn.Addr().String() + "/apis/external.metrics.k8s.io/v1beta1"
	d.adapterMetrics = metricsLn.Addr().String()
	return nil
}
