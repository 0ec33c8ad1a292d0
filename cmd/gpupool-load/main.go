// Command gpupool-load plays many GPU servers and clients against a
// running allocator (and adapter) to measure how it holds up: it is an
// operator's tool, kept out of the gpupool client that every pod carries.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/allocator/service"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/httpserver"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options are the command line's.
type options struct {
	allocator, allocatorCA, poolConfig, namePrefix, usageListen, adapter, summaryJSON string
	servers, gpusPerServer, leases, percent, group, concurrency                       int
	allocatorPID                                                                      int
	ttl, heartbeat, duration, progress                                                time.Duration
	keep, adapterInsecure                                                             bool
}

const usage = `Usage: gpupool-load [flags]

Plays --servers GPU servers and --leases clients against a running allocator
for --duration. Each server registers, heart-beats every --heartbeat and lists
its leases after each heartbeat, as gpupool-server does, and serves simulated
usage (GET /v1/usage) on --usage-listen for the adapter's direct backend. Each
client acquires a lease of one GPU at --percent, renews it every third of
--ttl as gpupool run does, and releases it at the end (unless --keep). The
tokens are those of --pool-config, the allocator's own config: the servers
token for the servers, each namespace's token for its clients.

Every --progress it prints a line; at the end a summary: call latencies
(p50/p99, as measured here), errors by call and reason, live leases, the
allocator's /metrics size and scrape time, its CPU seconds per second and
resident memory (with --allocator-pid), and the adapter's answer time for the
first group of leases (with --adapter). Exits 1 when any call failed.

Flags:
`

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpupool-load", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.allocator, "allocator", cli.EnvOr("GPUPOOL_ALLOCATOR", "http://127.0.0.1:8470"), "allocator URL (env GPUPOOL_ALLOCATOR)")
	fs.StringVar(&o.allocatorCA, cli.AllocatorCAFlag, os.Getenv(cli.AllocatorCAEnv), cli.AllocatorCAUsage)
	fs.StringVar(&o.poolConfig, "pool-config", "", "the allocator's --config file, for its servers token and namespace tokens; empty for an allocator without tokens (clients then use namespace default)")
	fs.IntVar(&o.servers, "servers", 20, "GPU servers to play")
	fs.IntVar(&o.gpusPerServer, "gpus-per-server", 8, "GPUs of each server")
	fs.IntVar(&o.leases, "leases", 50, "clients, each holding one lease")
	fs.IntVar(&o.percent, "percent", 10, "each lease's share of one GPU, in percent")
	fs.DurationVar(&o.ttl, "ttl", 2*time.Minute, "each lease's TTL; it is renewed every third of it")
	fs.DurationVar(&o.heartbeat, "heartbeat", 5*time.Second, "time between a server's heartbeats (gpupool-server's default)")
	fs.DurationVar(&o.duration, "duration", time.Minute, "how long the whole run lasts, ramp-up included")
	fs.DurationVar(&o.progress, "progress", 10*time.Second, "time between progress lines (and /metrics scrapes and process samples)")
	fs.IntVar(&o.group, "group", 1000, "leases per owner label value (app=load-<n>): the adapter is asked about group 0")
	fs.IntVar(&o.concurrency, "concurrency", 32, "registrations and acquisitions in flight at once, during the ramp-up")
	fs.BoolVar(&o.keep, "keep", false, "leave the leases held at the end (they expire after --ttl) instead of releasing them")
	fs.StringVar(&o.namePrefix, "name-prefix", "load-", "prefix of the servers' names (<prefix>00000, ...)")
	fs.StringVar(&o.usageListen, "usage-listen", "127.0.0.1:0", "address serving the simulated daemons' GET /v1/usage (each server's daemon URL is under it)")
	fs.IntVar(&o.allocatorPID, "allocator-pid", 0, "the allocator's process ID, on this host: its CPU time and RSS are read from /proc (0: not measured)")
	fs.StringVar(&o.adapter, "adapter", "", "the adapter's external metrics API, e.g. https://127.0.0.1:6443/apis/external.metrics.k8s.io/v1beta1, asked every second for bitfusion_gpu_utilization of group 0 (empty: not asked)")
	fs.BoolVar(&o.adapterInsecure, "adapter-insecure", false, "do not verify the adapter's certificate (a self-signed loopback one)")
	fs.StringVar(&o.summaryJSON, "summary-json", "", "also write the summary to this file as JSON")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if exit, ok := cli.Parse(fs, args, stdout, stderr); !ok {
		return exit
	}
	if err := o.check(); err != nil {
		fmt.Fprintln(stderr, "gpupool-load:", err)
		return cli.ExitUsage
	}
	tokens, err := readTokens(o.poolConfig)
	if err != nil {
		fmt.Fprintln(stderr, "gpupool-load: --pool-config:", err)
		return cli.ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := runLoad(ctx, &o, tokens, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "gpupool-load:", err)
		return 1
	}
	s.write(stdout)
	if o.summaryJSON != "" {
		b, _ := json.MarshalIndent(s, "", "  ")
		if err := os.WriteFile(o.summaryJSON, append(b, '\n'), 0o600); err != nil {
			fmt.Fprintln(stderr, "gpupool-load: --summary-json:", err)
			return 1
		}
	}
	if len(s.Errors) > 0 {
		return 1
	}
	return 0
}

// Limits on the flags: a run beyond them is a mistake, not a larger test.
const (
	maxServers       = 100_000
	maxGPUsPerServer = 64
	maxLeases        = 1_000_000
	minTTL           = 3 * time.Second
)

// check refuses flags out of range, naming the flag, its value and the
// limit.
func (o *options) check() error {
	ints := []struct {
		flag      string
		v, lo, hi int
	}{
		{"--servers", o.servers, 1, maxServers},
		{"--gpus-per-server", o.gpusPerServer, 1, maxGPUsPerServer},
		{"--leases", o.leases, 0, maxLeases},
		{"--percent", o.percent, 1, 100},
		{"--group", o.group, 1, maxLeases},
		{"--concurrency", o.concurrency, 1, 10_000},
		{"--allocator-pid", o.allocatorPID, 0, 1 << 22},
	}
	for _, f := range ints {
		if f.v < f.lo || f.v > f.hi {
			return fmt.Errorf("%s %d out of range %d..%d", f.flag, f.v, f.lo, f.hi)
		}
	}
	durations := []struct {
		flag string
		v    time.Duration
		min  time.Duration
	}{
		{"--ttl", o.ttl, minTTL}, {"--heartbeat", o.heartbeat, time.Millisecond},
		{"--duration", o.duration, time.Second}, {"--progress", o.progress, 100 * time.Millisecond},
	}
	for _, f := range durations {
		if f.v < f.min {
			return fmt.Errorf("%s %s is below the minimum %s", f.flag, f.v, f.min)
		}
	}
	if capacity := o.servers * o.gpusPerServer * (100 / o.percent); o.leases > capacity {
		return fmt.Errorf("--leases %d over the %d leases of %d%% that --servers %d × --gpus-per-server %d hold", o.leases, capacity, o.percent, o.servers, o.gpusPerServer)
	}
	return nil
}

// tokens are the bearer tokens the servers and each namespace's clients
// use.
type tokens struct {
	servers    string
	namespaces []namespaceToken
}

type namespaceToken struct{ namespace, token string }

// readTokens takes the servers' first token and each namespace's first
// from the allocator's config, in namespace order; no config, no tokens.
func readTokens(path string) (tokens, error) {
	if path == "" {
		return tokens{namespaces: []namespaceToken{{namespace: "default"}}}, nil
	}
	c, err := service.LoadConfig(path)
	if err != nil {
		return tokens{}, err
	}
	if len(c.Servers.Tokens) == 0 {
		return tokens{}, fmt.Errorf("%s: servers.tokens is empty: the servers need a token shared by all", path)
	}
	t := tokens{servers: c.Servers.Tokens[0]}
	for ns, nc := range c.Namespaces {
		if len(nc.Tokens) > 0 {
			t.namespaces = append(t.namespaces, namespaceToken{ns, nc.Tokens[0]})
		}
	}
	if len(t.namespaces) == 0 {
		return tokens{}, fmt.Errorf("%s: no namespace has a token: the clients need one", path)
	}
	slices.SortFunc(t.namespaces, func(a, b namespaceToken) int { return strings.Compare(a.namespace, b.namespace) })
	return t, nil
}

// newClient is a client that fails a call at once rather than retrying it
// for seconds, so that every failure is counted.
func newClient(url, caFile, token string) (*client.Client, error) {
	c, err := client.New([]string{url}, token)
	if err != nil {
		return nil, fmt.Errorf("--allocator: %w", err)
	}
	if err := c.TrustCAFile(caFile); err != nil {
		return nil, fmt.Errorf("--allocator-ca-file: %w", err)
	}
	c.Retries = 1
	return c, nil
}

// runLoad runs the servers and the clients until the duration is over or
// ctx ends, printing progress, and returns the summary.
func runLoad(ctx context.Context, o *options, tk tokens, stdout io.Writer) (*summary, error) {
	serversClient, err := newClient(o.allocator, o.allocatorCA, tk.servers)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", o.usageListen)
	if err != nil {
		return nil, fmt.Errorf("--usage-listen: %w", err)
	}
	var st stats
	servers := map[string]*simServer{}
	var order []*simServer
	for i := range o.servers {
		name := fmt.Sprintf("%s%05d", o.namePrefix, i)
		s := newSimServer(name, o.gpusPerServer, "http://"+ln.Addr().String()+"/servers/"+name)
		servers[name] = s
		order = append(order, s)
	}
	usageSrv := httpserver.New(usageHandler(servers, &st.servers), httpserver.Default)
	go func() { _ = usageSrv.Serve(ln) }()
	defer func() { _ = usageSrv.Close() }()

	holders := make([]*holder, o.leases)
	clients := map[string]*client.Client{}
	for i := range holders {
		g := i / o.group
		nt := tk.namespaces[g%len(tk.namespaces)]
		if clients[nt.namespace] == nil {
			if clients[nt.namespace], err = newClient(o.allocator, o.allocatorCA, nt.token); err != nil {
				return nil, err
			}
		}
		holders[i] = &holder{client: clients[nt.namespace], namespace: nt.namespace, group: fmt.Sprintf("load-%d", g), index: i}
	}

	fmt.Fprintf(stdout, "gpupool-load: %d servers (%d GPUs), %d leases of %d%% in %d namespaces, for %s against %s\n",
		o.servers, o.servers*o.gpusPerServer, o.leases, o.percent, min(len(tk.namespaces), (o.leases+o.group-1)/o.group), o.duration, o.allocator)
	runCtx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	w := newWatcher(o, &st, stdout)
	if o.leases > 0 {
		w.adapterQuery = adapterQuery{base: o.adapter, namespace: holders[0].namespace, selector: groupLabel + "=" + holders[0].group, insecure: o.adapterInsecure}
	}
	done := make(chan struct{})
	go func() { w.watch(runCtx); close(done) }()
	start := time.Now()
	st.run(runCtx, o, order, serversClient, holders)
	<-done
	return w.summarize(o, time.Since(start)), nil
}

// stats are everything the run counts.
type stats struct {
	servers serverStats
	clients clientStats
	errors  errorCounts
	// liveAtEnd is the live leases when the duration ended, before any
	// release.
	liveAtEnd int64
}

// run starts the servers, then, once they all registered, the clients, and
// waits for them all after ctx ends.
func (st *stats) run(ctx context.Context, o *options, servers []*simServer, c *client.Client, holders []*holder) {
	registering := make(chan struct{}, o.concurrency)
	done := make(chan struct{}, len(servers)+len(holders))
	var registrations sync.WaitGroup
	for _, s := range servers {
		registrations.Add(1)
		go func() {
			defer func() { done <- struct{}{} }()
			registering <- struct{}{}
			ok := s.register(ctx, c, &st.servers, &st.errors)
			<-registering
			registrations.Done()
			if ok {
				s.beat(ctx, c, o.heartbeat, &st.servers, &st.errors)
			}
		}()
	}
	registered := make(chan struct{})
	go func() { registrations.Wait(); close(registered) }()
	select {
	case <-registered:
	case <-ctx.Done():
	}
	acquiring := make(chan struct{}, o.concurrency)
	for _, h := range holders {
		go func() {
			defer func() { done <- struct{}{} }()
			h.hold(ctx, o, acquiring, &st.clients, &st.errors)
		}()
	}
	<-ctx.Done()
	st.liveAtEnd = st.clients.live.Load()
	for range len(servers) + len(holders) {
		<-done
	}
}

// adapterClient is the HTTP client of the adapter's API.
func adapterClient(insecure bool) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{InsecureSkipVerify: insecure} //nolint:gosec // only with --adapter-insecure, for a self-signed loopback adapter
	return &http.Client{Transport: t, Timeout: 10 * time.Second}
}
