package service

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/allocator"
)

// metrics are the allocator's own: events counted as they happen, and the
// pool's state read from one consistent snapshot per scrape (poolCollector).
type metrics struct {
	acquisitions *prometheus.CounterVec
	acquireTime  prometheus.Histogram
	releases     prometheus.Counter
	expirations  prometheus.Counter
	storeApply   prometheus.Histogram
	storeErrors  prometheus.Counter
}

func newMetrics(s *Service, reg prometheus.Registerer) (*metrics, error) {
	storeLabel := prometheus.Labels{"store": s.cfg.Store.Name()}
	m := &metrics{
		acquisitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bitfusion_lease_acquisitions_total",
			Help: "Lease requests answered, by outcome (granted, rejected) and the reason for a rejection.",
		}, []string{"outcome", "reason"}),
		acquireTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "bitfusion_lease_acquisition_duration_seconds",
			Help:    "Time to answer a lease request, durable write and any queueing included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		releases: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bitfusion_lease_releases_total",
			Help: "Leases released by their holders.",
		}),
		expirations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bitfusion_lease_expirations_total",
			Help: "Leases ended because their holder stopped renewing them.",
		}),
		storeApply: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "bitfusion_store_apply_duration_seconds",
			Help:        "Time to make one batch of changes durable.",
			Buckets:     prometheus.ExponentialBuckets(0.0001, 2, 16),
			ConstLabels: storeLabel,
		}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "bitfusion_store_errors_total",
			Help:        "Batches the store failed to make durable; the allocator restarts after one.",
			ConstLabels: storeLabel,
		}),
	}
	// Zero the outcomes a dashboard or alert rates, so they exist from the
	// start: the grants, and the rejections a client causes (4xx).
	m.acquisitions.WithLabelValues("granted", "")
	for _, k := range errorKinds {
		if k.label != "" && k.status < http.StatusInternalServerError {
			m.acquisitions.WithLabelValues("rejected", k.label)
		}
	}
	for _, c := range []prometheus.Collector{m.acquisitions, m.acquireTime, m.releases, m.expirations, m.storeApply, m.storeErrors, &poolCollector{s: s}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// acquired counts an answered lease request: granted when err is nil,
// else rejected with the label of err's kind.
func (m *metrics) acquired(start time.Time, err error) {
	outcome, reason := "granted", ""
	if err != nil {
		outcome, reason = "rejected", kindOf(err).label
		if reason == "" { // a kind no acquisition should meet
			reason = internalError.label
		}
	}
	m.acquisitions.WithLabelValues(outcome, reason).Inc()
	m.acquireTime.Observe(time.Since(start).Seconds())
}

var (
	gpuLabels         = []string{"server", "gpu", "model"}
	descGPUInfo       = prometheus.NewDesc("bitfusion_gpu_info", "GPUs in the pool; 1 per GPU, with its UUID.", []string{"server", "gpu", "model", "uuid"}, nil)
	descGPUAllocated  = prometheus.NewDesc("bitfusion_gpu_allocated_ratio", "Share of the GPU held by leases (0..1).", gpuLabels, nil)
	descGPUMemory     = prometheus.NewDesc("bitfusion_gpu_memory_bytes", "Memory of the GPU.", gpuLabels, nil)
	descGPUMemoryHeld = prometheus.NewDesc("bitfusion_gpu_memory_allocated_bytes", "GPU memory held by leases.", gpuLabels, nil)
	descGPUHealthy    = prometheus.NewDesc("bitfusion_gpu_healthy", "1 when the GPU-server daemon reports the GPU healthy.", gpuLabels, nil)
	descSchedulable   = prometheus.NewDesc("bitfusion_server_schedulable", "1 while the server heart-beats and takes new leases.", []string{"server"}, nil)
	descHeartbeat     = prometheus.NewDesc("bitfusion_server_last_heartbeat_timestamp_seconds", "When the server last checked in.", []string{"server"}, nil)
	descFreeGPUs      = prometheus.NewDesc("bitfusion_pool_free_gpus", "Healthy GPUs on schedulable servers with at least min_free of the GPU unleased.", []string{"min_free"}, nil)
	descFragmentation = prometheus.NewDesc("bitfusion_pool_fragmentation_ratio", "Share of the free GPU share that the recent workload cannot use (FGD's measure, 0..1).", nil, nil)
	descQuota         = prometheus.NewDesc("bitfusion_namespace_quota_gpus", "GPU quota of the namespace, in GPUs (requests.bitfusion.io/gpu / 100).", []string{"namespace"}, nil)
	descNSAllocated   = prometheus.NewDesc("bitfusion_namespace_allocated_gpus", "GPU share held by the namespace's leases, in GPUs.", []string{"namespace"}, nil)
	descLeaseInfo     = prometheus.NewDesc("bitfusion_lease_info", "Live leases; 1 per lease, with its owner.", []string{"lease", "namespace", "pod", "server"}, nil)
	descLeaseGPUs     = prometheus.NewDesc("bitfusion_lease_allocated_gpus", "GPU share the lease holds, in GPUs (summed over its GPUs).", []string{"lease", "namespace", "server"}, nil)
	descLeaseExpiry   = prometheus.NewDesc("bitfusion_lease_expiry_timestamp_seconds", "When the lease expires unless renewed.", []string{"lease", "namespace"}, nil)
	descPending       = prometheus.NewDesc("bitfusion_lease_pending_requests", "Lease requests queued for capacity or quota, by namespace.", []string{"namespace"}, nil)
)

// freeClasses are the min_free values of bitfusion_pool_free_gpus.
var freeClasses = []struct {
	label string
	share allocator.Share
}{{"1", allocator.WholeGPU}, {"0.5", allocator.WholeGPU / 2}, {"0.25", allocator.WholeGPU / 4}, {"0.1", allocator.WholeGPU / 10}}

// poolCollector exports the pool's state from one snapshot per scrape.
type poolCollector struct{ s *Service }

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descGPUInfo, descGPUAllocated, descGPUMemory, descGPUMemoryHeld, descGPUHealthy,
		descSchedulable, descHeartbeat, descFreeGPUs, descFragmentation, descQuota, descNSAllocated,
		descLeaseInfo, descLeaseGPUs, descLeaseExpiry, descPending} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.mu.Lock()
	now := s.clock()
	servers, leases, quotas := s.pool.ServerStates(), s.pool.Leases(now), s.pool.Quotas(now)
	lastSeen := make(map[string]time.Time, len(s.lastSeen))
	for k, v := range s.lastSeen {
		lastSeen[k] = v
	}
	work := s.workloadLocked()
	pending := map[string]int{}
	for r := range s.waiting {
		pending[r.Namespace]++
	}
	s.mu.Unlock()

	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	free := make([]int, len(freeClasses))
	var fragmented, idle float64
	for i := range servers {
		srv, n := &servers[i].Server, &servers[i].Node
		gauge(descSchedulable, boolValue(n.Schedulable), srv.Name)
		if t, ok := lastSeen[srv.Name]; ok {
			gauge(descHeartbeat, float64(t.UnixNano())/1e9, srv.Name)
		}
		for gi, g := range srv.GPUs {
			ng, idx := &n.GPUs[gi], strconv.Itoa(g.Index)
			gauge(descGPUInfo, 1, srv.Name, idx, g.Model, g.UUID)
			gauge(descGPUAllocated, (allocator.WholeGPU - ng.Free).GPUs(), srv.Name, idx, g.Model)
			gauge(descGPUMemory, float64(g.MemoryBytes), srv.Name, idx, g.Model)
			gauge(descGPUMemoryHeld, float64(g.MemoryBytes-ng.FreeBytes), srv.Name, idx, g.Model)
			gauge(descGPUHealthy, boolValue(ng.Healthy), srv.Name, idx, g.Model)
			for k, fc := range freeClasses {
				if n.Schedulable && ng.Healthy && ng.Free >= fc.share {
					free[k]++
				}
			}
		}
		if n.Schedulable {
			fragmented += work.Fragmentation(n)
			idle += float64(n.FreeShare())
		}
	}
	for k, fc := range freeClasses {
		gauge(descFreeGPUs, float64(free[k]), fc.label)
	}
	if idle > 0 {
		gauge(descFragmentation, fragmented/idle)
	} else {
		gauge(descFragmentation, 0)
	}
	for _, q := range quotas {
		pending[q.Namespace] += 0
		if q.Limited {
			gauge(descQuota, q.Hard.GPUs(), q.Namespace)
		}
		gauge(descNSAllocated, q.Used.GPUs(), q.Namespace)
	}
	for _, l := range leases {
		gauge(descLeaseInfo, 1, l.ID, l.Namespace, l.Owner.Pod, l.Server)
		gauge(descLeaseGPUs, l.Share().GPUs(), l.ID, l.Namespace, l.Server)
		gauge(descLeaseExpiry, float64(l.ExpiresAt.UnixNano())/1e9, l.ID, l.Namespace)
	}
	for ns, n := range pending {
		gauge(descPending, float64(n), ns)
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
