package app

import (
	"flag"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/service"
	"github.com/gpupool/gpupool/internal/cli"
)

// Options are gpupool-allocator's flags.
type Options struct {
	Listen string
	cli.TLSServingFlags
	InsecureHTTP bool
	// Store is bolt (in DataDir) or etcd (at EtcdEndpoints, comma-separated).
	Store, DataDir                     string
	EtcdEndpoints, EtcdPrefix          string
	EtcdSessionTTL                     time.Duration
	ConfigFile                         string
	Policy                             string
	DefaultTTL, MaxTTL                 time.Duration
	HeartbeatTimeout, Tick             time.Duration
	MaxWaiting, MaxWaitingPerNamespace int
	// Check verifies the store and exits (Check) instead of serving.
	Check bool

	// Listener and Seed have no flag: a caller that runs the allocator in
	// its own process sets them (gpupool-demo). Listener, when set, is
	// where Run serves in place of Listen, and its address is the one that
	// must be loopback to serve plain HTTP; Seed breaks placement's ties
	// (allocator.PolicyOptions), 0 for the command.
	Listener net.Listener
	Seed     uint64
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		Listen: "127.0.0.1:8470", Store: "bolt", DataDir: "gpupool-data",
		EtcdEndpoints: "http://127.0.0.1:2379", EtcdPrefix: "/gpupool", EtcdSessionTTL: 5 * time.Second,
		Policy: "fgd-cpu", DefaultTTL: 30 * time.Second, MaxTTL: time.Hour, HeartbeatTimeout: 15 * time.Second, Tick: time.Second,
		MaxWaiting: service.DefaultMaxWaiting, MaxWaitingPerNamespace: service.DefaultMaxWaitingPerNamespace,
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Listen, "listen", o.Listen, "address to serve the API and /metrics on; off loopback it needs --tls-cert-file (or --insecure-http)")
	o.TLSServingFlags.AddFlags(fs, "serving certificate (PEM) for HTTPS; read again when it changes, as when cert-manager renews it")
	fs.BoolVar(&o.InsecureHTTP, "insecure-http", o.InsecureHTTP, "serve plain HTTP on a --listen address off loopback: every client's bearer token then crosses the network in clear text")
	fs.StringVar(&o.Store, "store", o.Store, "where state lives: bolt (embedded, one file in --data-dir) or etcd (replicas with leader election)")
	fs.StringVar(&o.DataDir, "data-dir", o.DataDir, "directory of the embedded store (one bbolt file)")
	fs.StringVar(&o.EtcdEndpoints, "etcd-endpoints", o.EtcdEndpoints, "etcd endpoints, comma-separated (--store etcd)")
	fs.StringVar(&o.EtcdPrefix, "etcd-prefix", o.EtcdPrefix, "key prefix in etcd (--store etcd)")
	fs.DurationVar(&o.EtcdSessionTTL, "etcd-session-ttl", o.EtcdSessionTTL, "how long after a leader dies a standby takes over (--store etcd)")
	fs.StringVar(&o.ConfigFile, "config", o.ConfigFile, "config file with namespace quotas and bearer tokens; without one, no quotas and NO AUTHENTICATION (loopback demos only)")
	fs.StringVar(&o.Policy, "policy", o.Policy, "placement policy: "+strings.Join(allocator.PolicyNames(), ", "))
	fs.DurationVar(&o.DefaultTTL, "default-ttl", o.DefaultTTL, "lifetime of a lease whose request names none")
	fs.DurationVar(&o.MaxTTL, "max-ttl", o.MaxTTL, "longest lease lifetime a request may ask for")
	fs.DurationVar(&o.HeartbeatTimeout, "heartbeat-timeout", o.HeartbeatTimeout, "silence after which a server's GPUs take no new leases")
	fs.DurationVar(&o.Tick, "tick", o.Tick, "how often leases are expired and heartbeats checked")
	fs.IntVar(&o.MaxWaiting, "max-waiting", o.MaxWaiting, "most acquisitions queued at once for capacity or quota (\"wait\"); past it one is refused with 429")
	fs.IntVar(&o.MaxWaitingPerNamespace, "max-waiting-per-namespace", o.MaxWaitingPerNamespace, "most acquisitions of one namespace queued at once; past it one is refused with 429")
	fs.BoolVar(&o.Check, "check", o.Check, "verify the store (--store, --data-dir or --etcd-*) without changing it, print what it holds, and exit: 0 sound, 1 damaged or inconsistent")
}

// Validate checks the options a served allocator uses (--check validates
// its own). It refuses up front what would otherwise fail each term's
// start: on etcd, a replica would campaign and step down forever.
func (o *Options) Validate() error {
	if err := validStore(o.Store); err != nil {
		return err
	}
	if err := o.TLSServingFlags.Validate(); err != nil {
		return err
	}
	switch {
	case !slices.Contains(allocator.PolicyNames(), o.Policy):
		return fmt.Errorf("--policy %q is not one of %s", o.Policy, strings.Join(allocator.PolicyNames(), ", "))
	case o.DefaultTTL <= 0:
		return fmt.Errorf("--default-ttl %v: must be more than 0", o.DefaultTTL)
	case o.MaxTTL < o.DefaultTTL:
		return fmt.Errorf("--max-ttl %v: must be at least --default-ttl %v", o.MaxTTL, o.DefaultTTL)
	case o.Tick <= 0:
		return fmt.Errorf("--tick %v: must be more than 0", o.Tick)
	case o.MaxWaiting < 0:
		return fmt.Errorf("--max-waiting %d: must be at least 0 (0 takes the default)", o.MaxWaiting)
	case o.MaxWaitingPerNamespace < 0:
		return fmt.Errorf("--max-waiting-per-namespace %d: must be at least 0 (0 takes the default)", o.MaxWaitingPerNamespace)
	}
	return nil
}

// validStore refuses a --store that is neither bolt nor etcd.
func validStore(kind string) error {
	if kind != "bolt" && kind != "etcd" {
		return fmt.Errorf("--store %q is not one of bolt, etcd", kind)
	}
	return nil
}

// listenAddress is where Run serves: Listener's address, else Listen.
func (o *Options) listenAddress() string {
	if o.Listener != nil {
		return o.Listener.Addr().String()
	}
	return o.Listen
}

// etcdEndpoints are --etcd-endpoints, split.
func (o *Options) etcdEndpoints() []string { return strings.Split(o.EtcdEndpoints, ",") }
