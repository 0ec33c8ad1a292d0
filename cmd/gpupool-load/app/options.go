package app

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gpupool/gpupool/allocator/service"
	"github.com/gpupool/gpupool/internal/cli"
)

// Options are gpupool-load's flags.
type Options struct {
	Allocator, AllocatorCA, PoolConfig, NamePrefix, UsageListen, Adapter, SummaryJSON string
	Servers, GPUsPerServer, Leases, Percent, Group, Concurrency                       int
	AllocatorPID                                                                      int
	TTL, Heartbeat, Duration, Progress                                                time.Duration
	Keep, AdapterInsecure                                                             bool

	// tokens are PoolConfig's, read by Validate.
	tokens tokens
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		Allocator: cli.EnvOr("GPUPOOL_ALLOCATOR", "http://127.0.0.1:8470"), AllocatorCA: os.Getenv(cli.AllocatorCAEnv),
		Servers: 20, GPUsPerServer: 8, Leases: 50, Percent: 10, TTL: 2 * time.Minute, Heartbeat: 5 * time.Second,
		Duration: time.Minute, Progress: 10 * time.Second, Group: 1000, Concurrency: 32, NamePrefix: "load-", UsageListen: "127.0.0.1:0",
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Allocator, "allocator", o.Allocator, "allocator URL (env GPUPOOL_ALLOCATOR)")
	fs.StringVar(&o.AllocatorCA, cli.AllocatorCAFlag, o.AllocatorCA, cli.AllocatorCAUsage)
	fs.StringVar(&o.PoolConfig, "pool-config", o.PoolConfig, "the allocator's --config file, for its servers token and namespace tokens; empty for an allocator without tokens (clients then use namespace default)")
	fs.IntVar(&o.Servers, "servers", o.Servers, "GPU servers to play")
	fs.IntVar(&o.GPUsPerServer, "gpus-per-server", o.GPUsPerServer, "GPUs of each server")
	fs.IntVar(&o.Leases, "leases", o.Leases, "clients, each holding one lease")
	fs.IntVar(&o.Percent, "percent", o.Percent, "each lease's share of one GPU, in percent")
	fs.DurationVar(&o.TTL, "ttl", o.TTL, "each lease's TTL; it is renewed every third of it")
	fs.DurationVar(&o.Heartbeat, "heartbeat", o.Heartbeat, "time between a server's heartbeats (gpupool-server's default)")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "how long the whole run lasts, ramp-up included")
	fs.DurationVar(&o.Progress, "progress", o.Progress, "time between progress lines (and /metrics scrapes and process samples)")
	fs.IntVar(&o.Group, "group", o.Group, "leases per owner label value (app=load-<n>): the adapter is asked about group 0")
	fs.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "registrations and acquisitions in flight at once, during the ramp-up")
	fs.BoolVar(&o.Keep, "keep", o.Keep, "leave the leases held at the end (they expire after --ttl) instead of releasing them")
	fs.StringVar(&o.NamePrefix, "name-prefix", o.NamePrefix, "prefix of the servers' names (<prefix>00000, ...)")
	fs.StringVar(&o.UsageListen, "usage-listen", o.UsageListen, "address serving the simulated daemons' GET /v1/usage (each server's daemon URL is under it)")
	fs.IntVar(&o.AllocatorPID, "allocator-pid", o.AllocatorPID, "the allocator's process ID, on this host: its CPU time and RSS are read from /proc (0: not measured)")
	fs.StringVar(&o.Adapter, "adapter", o.Adapter, "the adapter's external metrics API, e.g. https://127.0.0.1:6443/apis/external.metrics.k8s.io/v1beta1, asked every second for bitfusion_gpu_utilization of group 0 (empty: not asked)")
	fs.BoolVar(&o.AdapterInsecure, "adapter-insecure", o.AdapterInsecure, "do not verify the adapter's certificate (a self-signed loopback one)")
	fs.StringVar(&o.SummaryJSON, "summary-json", o.SummaryJSON, "also write the summary to this file as JSON")
}

// Limits on the flags: a run beyond them is a mistake, not a larger test.
const (
	maxServers       = 100_000
	maxGPUsPerServer = 64
	maxLeases        = 1_000_000
	minTTL           = 3 * time.Second
)

// Validate refuses flags out of range, naming the flag, its value and the
// limit, and reads the tokens of --pool-config.
func (o *Options) Validate() error {
	ints := []struct {
		flag      string
		v, lo, hi int
	}{
		{"--servers", o.Servers, 1, maxServers},
		{"--gpus-per-server", o.GPUsPerServer, 1, maxGPUsPerServer},
		{"--leases", o.Leases, 0, maxLeases},
		{"--percent", o.Percent, 1, 100},
		{"--group", o.Group, 1, maxLeases},
		{"--concurrency", o.Concurrency, 1, 10_000},
		{"--allocator-pid", o.AllocatorPID, 0, 1 << 22},
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
		{"--ttl", o.TTL, minTTL}, {"--heartbeat", o.Heartbeat, time.Millisecond},
		{"--duration", o.Duration, time.Second}, {"--progress", o.Progress, 100 * time.Millisecond},
	}
	for _, f := range durations {
		if f.v < f.min {
			return fmt.Errorf("%s %s is below the minimum %s", f.flag, f.v, f.min)
		}
	}
	if capacity := o.Servers * o.GPUsPerServer * (100 / o.Percent); o.Leases > capacity {
		return fmt.Errorf("--leases %d over the %d leases of %d%% that --servers %d × --gpus-per-server %d hold", o.Leases, capacity, o.Percent, o.Servers, o.GPUsPerServer)
	}
	var err error
	if o.tokens, err = readTokens(o.PoolConfig); err != nil {
		return fmt.Errorf("--pool-config: %w", err)
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
