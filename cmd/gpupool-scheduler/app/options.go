package app

import (
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/httpserver"
	"github.com/gpupool/gpupool/kube/admission"
	"github.com/gpupool/gpupool/kube/leases"
	"github.com/gpupool/gpupool/kube/scheduler"
)

// Options are gpupool-scheduler's flags.
type Options struct {
	Listen string
	// TLSServingFlags are the extender's serving certificate.
	cli.TLSServingFlags
	ClientCAFile  string
	MetricsListen string
	// Allocator is one address or several, comma-separated.
	Allocator, AllocatorCAFile, TokenFile string
	Kubeconfig                            string
	admission.UnitFlags
	Resync, UnboundLeaseTimeout time.Duration
	KubeAPIQPS                  float64
	KubeAPIBurst                int
	// ResyncUnboundLeaseTimeout is the lease controller's
	// leases.Config.UnboundLeaseTimeout.
	ResyncUnboundLeaseTimeout time.Duration
	// LeaderElect runs the lease controller in the replica that holds the
	// Lease leases.DefaultElectionName in LeaderElectNamespace only.
	LeaderElect          bool
	LeaderElectNamespace string
	// ResourceSlicesEvery is how often the pool's servers are read to
	// publish them as DRA's ResourceSlices; 0: not published.
	ResourceSlicesEvery time.Duration
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		MetricsListen: "127.0.0.1:9474", Allocator: "http://127.0.0.1:8470",
		UnitFlags: admission.NewUnitFlags(), Resync: leases.DefaultResync, UnboundLeaseTimeout: scheduler.DefaultUnboundLeaseTimeout,
		ResyncUnboundLeaseTimeout: leases.DefaultUnboundLeaseTimeout, KubeAPIQPS: 200, KubeAPIBurst: 400, LeaderElect: true, LeaderElectNamespace: "gpupool",
		ResourceSlicesEvery: 30 * time.Second,
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Listen, "listen", o.Listen, "address of kube-scheduler's extender (POST /filter, POST /bind), such as 127.0.0.1:8474: plain HTTP on a loopback address only, else TLS with client certificates; empty (the default, as deployed): no extender, the lease controller alone (gpupool-kube-scheduler's plugin places the pods)")
	o.TLSServingFlags.AddFlags(fs, "serving certificate (PEM) of the extender; read again when it changes")
	fs.StringVar(&o.ClientCAFile, "client-ca-file", o.ClientCAFile, "CA (PEM) that signs kube-scheduler's client certificate; required off loopback")
	fs.StringVar(&o.MetricsListen, "metrics-listen", o.MetricsListen, "address of /metrics and /healthz (plain HTTP)")
	fs.StringVar(&o.Allocator, "allocator", o.Allocator, "allocator address(es), comma-separated")
	cli.AllocatorCAFlagVar(fs, &o.AllocatorCAFile)
	fs.StringVar(&o.TokenFile, "token-file", o.TokenFile, "file holding an allocator admin token: the lease controller releases and acquires leases, and sets quotas, in every namespace, as the extender acquires")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig of the cluster; empty uses the in-cluster config")
	o.UnitFlags.AddFlags(fs, "what one bitfusion.io/gpu stands for, the webhook's --unit: percent (100 is one GPU, as BFK), gpus, or memory:<size> (a slice of GPU memory, memory:8Gi); the unit the ResourceQuotas' requests.bitfusion.io/gpu are read in",
		"one GPU's memory, the webhook's --gpu-memory: in a unit of memory, how much of a GPU a quota's memory is")
	fs.DurationVar(&o.Resync, "resync", o.Resync, "how often every lease is compared with its pod and every quota with its ResourceQuotas (and once at start)")
	fs.Float64Var(&o.KubeAPIQPS, "kube-api-qps", o.KubeAPIQPS, "requests per second to kube-apiserver (a bind reads the pod and creates its binding)")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", o.KubeAPIBurst, "burst of requests to kube-apiserver above --kube-api-qps")
	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect, "reconcile leases and quotas in one replica at a time, the holder of the coordination.k8s.io Lease "+leases.DefaultElectionName+" (the others stand by, serving the extender with --listen, and take over within 15 s of the leader's loss); false only where one replica runs")
	fs.DurationVar(&o.ResourceSlicesEvery, "resource-slices-every", o.ResourceSlicesEvery, "how often the leading replica reads the pool's servers and publishes their healthy GPUs as Dynamic Resource Allocation's ResourceSlices of driver gpu.gpupool.io (what ResourceClaims of DeviceClass gpu.gpupool.io are placed among); 0: none published")
	fs.StringVar(&o.LeaderElectNamespace, "leader-elect-namespace", o.LeaderElectNamespace, "namespace of the election's Lease, gpupool-scheduler's own")
	fs.DurationVar(&o.UnboundLeaseTimeout, "unbound-lease-timeout", o.UnboundLeaseTimeout, "with --listen, how long a lease the extender's filter took waits for its pod's bind: then, the pod still unbound, it is released (kube-scheduler's cycle failed after the filter, which the extender protocol does not report); the resync at start releases such leases too, the extender's waits lost with the restart")
	fs.DurationVar(&o.ResyncUnboundLeaseTimeout, "resync-unbound-lease-timeout", o.ResyncUnboundLeaseTimeout, "every resync releases a lease whose pod is still unbound this long after its grant: its scheduling cycle died with kube-scheduler (the plugin's wait for the bind is in memory); longer than any bind takes, a PreBind provisioning a volume (up to 10 minutes) included")
}

// Validate checks the options and parses the unit.
func (o *Options) Validate() error {
	if err := o.UnitFlags.Validate(); err != nil {
		return err
	}
	if _, err := servingMode(o.Listen, o.TLSServingFlags, o.ClientCAFile); err != nil {
		return err
	}
	for name, d := range map[string]time.Duration{"--resync": o.Resync, "--unbound-lease-timeout": o.UnboundLeaseTimeout, "--resync-unbound-lease-timeout": o.ResyncUnboundLeaseTimeout} {
		if d <= 0 {
			return fmt.Errorf("%s %v: must be more than 0", name, d)
		}
	}
	switch {
	case o.KubeAPIQPS <= 0:
		return fmt.Errorf("--kube-api-qps %v: must be more than 0", o.KubeAPIQPS)
	case o.KubeAPIBurst < 1:
		return fmt.Errorf("--kube-api-burst %d: must be at least 1", o.KubeAPIBurst)
	case strings.TrimSpace(o.Allocator) == "":
		return errors.New("--allocator: no address")
	case o.ResourceSlicesEvery < 0:
		return fmt.Errorf("--resource-slices-every %v: must not be negative (0 publishes none)", o.ResourceSlicesEvery)
	case o.LeaderElect && o.LeaderElectNamespace == "":
		return errors.New("--leader-elect-namespace: empty, while --leader-elect is on")
	}
	return nil
}

// servingMode says whether the extender serves plain HTTP (false) or TLS
// (true): plain HTTP on a loopback address only, since anyone who reaches
// /bind binds pods and anyone who reaches /filter takes GPUs; off
// loopback, TLS with client certificates from clientCAFile.
func servingMode(listen string, serving cli.TLSServingFlags, clientCAFile string) (tls bool, err error) {
	certFile := serving.CertFile
	if listen == "" {
		if certFile != "" || serving.KeyFile != "" || clientCAFile != "" {
			return false, errors.New("--tls-cert-file, --tls-private-key-file and --client-ca-file are the extender's: they need --listen")
		}
		return false, nil
	}
	loopback, err := httpserver.IsLoopback(listen)
	if err != nil {
		return false, err
	}
	if err := serving.Validate(); err != nil {
		return false, err
	}
	switch {
	case certFile == "" && clientCAFile != "":
		return false, errors.New("--client-ca-file needs --tls-cert-file and --tls-private-key-file")
	case certFile == "" && loopback:
		return false, nil
	case certFile == "":
		return false, fmt.Errorf("--listen %s is not a loopback address: serving there needs --tls-cert-file, --tls-private-key-file and --client-ca-file", listen)
	case clientCAFile == "" && !loopback:
		return false, fmt.Errorf("--listen %s is not a loopback address: --client-ca-file must name the CA of kube-scheduler's client certificate", listen)
	}
	return true, nil
}

// election is the lease controller's election, nil without --leader-elect.
// A replica is its pod's name (the hostname) and a random suffix, so that
// a pod restarted under the same name is told from the one it replaces.
func (o *Options) election() (*leases.Election, error) {
	if !o.LeaderElect {
		return nil, nil
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("--leader-elect: naming this replica: %w", err)
	}
	return &leases.Election{Namespace: o.LeaderElectNamespace, Name: leases.DefaultElectionName, Identity: host + "_" + rand.Text()[:8]}, nil
}
