package service

import (
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/internal/metricdef"
	"github.com/gpupool/gpupool/inventory"
)

// The allocator's table: the service builds its series from these rows,
// the binary its leader gauge, and docs/metrics.md's allocator section is
// checked against them.
var (
	serverLabels    = metricdef.Labels{"server"}
	namespaceLabels = metricdef.Labels{"namespace"}
	storeLabels     = metricdef.Labels{"store"}

	acquisitionsTotal = metricdef.Counter("bitfusion_lease_acquisitions_total", "requests", metricdef.Labels{"outcome", "reason"},
		"Lease requests answered, by outcome (granted, rejected) and the reason for a rejection.")
	acquisitionDuration = metricdef.Histogram("bitfusion_lease_acquisition_duration_seconds", "seconds", nil,
		"Time to answer a lease request, any queueing included, and its durable write unless it asked for the answer before (answerBeforeDurable, the scheduler's filter).", prometheus.ExponentialBuckets(0.0005, 2, 16))
	releasesTotal = metricdef.Counter("bitfusion_lease_releases_total", "leases", nil,
		"Leases released by their holders.")
	expirationsTotal = metricdef.Counter("bitfusion_lease_expirations_total", "leases", nil,
		"Leases ended because their holder stopped renewing them.")
	storeApplyDuration = metricdef.Histogram("bitfusion_store_apply_duration_seconds", "seconds", storeLabels,
		"Time to make one batch of changes durable.", prometheus.ExponentialBuckets(0.0001, 2, 16))
	storeErrorsTotal = metricdef.Counter("bitfusion_store_errors_total", "attempts", storeLabels,
		"Attempts to make a batch durable that failed; one that may pass (an etcd election) is retried.")

	gpuInfo = metricdef.Gauge("bitfusion_gpu_info", "1", metricdef.GPULabels.With("uuid"),
		"GPUs in the pool; 1 per GPU, with its UUID.")
	gpuAllocated = metricdef.Gauge("bitfusion_gpu_allocated_ratio", "ratio 0..1", metricdef.GPULabels,
		"Share of the GPU held by leases (0..1).")
	gpuMemory = metricdef.Gauge("bitfusion_gpu_memory_bytes", "bytes", metricdef.GPULabels,
		"Memory of the GPU.")
	gpuMemoryAllocated = metricdef.Gauge("bitfusion_gpu_memory_allocated_bytes", "bytes", metricdef.GPULabels,
		"GPU memory held by leases.")
	gpuHealthy = metricdef.Gauge("bitfusion_gpu_healthy", "0/1", metricdef.GPULabels,
		"1 when the GPU-server daemon reports the GPU healthy.")
	serverSchedulable = metricdef.Gauge("bitfusion_server_schedulable", "0/1", serverLabels,
		"1 while the server heart-beats and takes new leases.")
	serverHeartbeat = metricdef.Gauge("bitfusion_server_last_heartbeat_timestamp_seconds", "seconds since epoch", serverLabels,
		"When the server last checked in.")
	poolFreeGPUs = metricdef.Gauge("bitfusion_pool_free_gpus", "GPUs", metricdef.Labels{"min_free"},
		"Healthy GPUs on schedulable servers with at least min_free of the GPU unleased.")
	poolFragmentation = metricdef.Gauge("bitfusion_pool_fragmentation_ratio", "ratio 0..1", nil,
		"Share of the free GPU share that the recent workload cannot use (FGD's measure, 0..1).")
	namespaceQuota = metricdef.Gauge("bitfusion_namespace_quota_gpus", "GPUs", namespaceLabels,
		"GPU quota of the namespace, in GPUs (requests.bitfusion.io/gpu / 100).")
	namespaceAllocated = metricdef.Gauge("bitfusion_namespace_allocated_gpus", "GPUs", namespaceLabels,
		"GPU share held by the namespace's leases, in GPUs.")
	namespaceMultiGPULeases = metricdef.Gauge("bitfusion_namespace_multi_gpu_leases", "leases", metricdef.Labels{"namespace", "link"},
		"Live leases of more than one GPU, by the link all their GPUs have (any, socket, pcie-switch, nvlink).")
	leaseInfo = metricdef.Gauge("bitfusion_lease_info", "1", metricdef.Labels{"lease", "namespace", "pod", "server"},
		"Live leases; 1 per lease, with its owner.")
	leaseAllocated = metricdef.Gauge("bitfusion_lease_allocated_gpus", "GPUs", metricdef.Labels{"lease", "namespace", "server"},
		"GPU share the lease holds, in GPUs (summed over its GPUs).")
	leaseExpiry = metricdef.Gauge("bitfusion_lease_expiry_timestamp_seconds", "seconds since epoch", metricdef.Labels{"lease", "namespace"},
		"When the lease expires unless renewed; none for a lease that lives until released.")
	leasePending = metricdef.Gauge("bitfusion_lease_pending_requests", "requests", namespaceLabels,
		"Lease requests queued for capacity or quota, by namespace.")
	leaseIdle = metricdef.Gauge("bitfusion_lease_idle_seconds", "seconds", metricdef.Labels{"lease", "namespace"},
		"How long the lease has been measured idle, every sample under its namespace's idle policy's bar; 0 while it is in use; none while its use is not known (unknown is never idle).")
	namespaceIdleHeld = metricdef.Gauge("bitfusion_namespace_idle_held_gpus", "GPUs", namespaceLabels,
		"GPU share held by the namespace's leases measured idle for their idle policy's whole window, in GPUs.")

	// LeaderFamily is the binary's gauge, not the service's: a replica
	// reports it while it stands by, before any service exists.
	LeaderFamily = metricdef.Gauge("bitfusion_allocator_leader", "0/1", nil,
		"1 while this allocator replica leads and serves; 0 while it stands by.")
)

// poolFamilies are what poolCollector exports.
var poolFamilies = []*metricdef.Family{gpuInfo, gpuAllocated, gpuMemory, gpuMemoryAllocated, gpuHealthy,
	serverSchedulable, serverHeartbeat, poolFreeGPUs, poolFragmentation, namespaceQuota, namespaceAllocated,
	namespaceMultiGPULeases, leaseInfo, leaseAllocated, leaseExpiry, leasePending, leaseIdle, namespaceIdleHeld}

// MetricFamilies is the table of the allocator binary's metrics.
var MetricFamilies = slices.Concat([]*metricdef.Family{acquisitionsTotal, acquisitionDuration, releasesTotal, expirationsTotal,
	storeApplyDuration, storeErrorsTotal, LeaderFamily}, poolFamilies)

// metrics are the allocator's own: events counted as they happen, and the
// pool's state read from one consistent snapshot per scrape (poolCollector).
type metrics struct {
	acquisitions *prometheus.CounterVec
	acquireTime  prometheus.Observer
	releases     prometheus.Counter
	expirations  prometheus.Counter
	storeApply   prometheus.Observer
	storeErrors  prometheus.Counter
}

// newMetrics registers the service's collectors, which it returns for
// Close to unregister.
func newMetrics(s *Service, reg prometheus.Registerer) (*metrics, []prometheus.Collector, error) {
	acquisitions, acquireTime := acquisitionsTotal.NewCounterVec(), acquisitionDuration.NewHistogramVec()
	releases, expirations := releasesTotal.NewCounterVec(), expirationsTotal.NewCounterVec()
	storeApply, storeErrors := storeApplyDuration.NewHistogramVec(), storeErrorsTotal.NewCounterVec()
	store := s.cfg.Store.Name()
	m := &metrics{acquisitions: acquisitions, acquireTime: acquireTime.WithLabelValues(),
		releases: releases.WithLabelValues(), expirations: expirations.WithLabelValues(),
		storeApply: storeApply.WithLabelValues(store), storeErrors: storeErrors.WithLabelValues(store)}
	// Zero the outcomes a dashboard or alert rates, so they exist from the
	// start: the grants, and the rejections a client causes (4xx).
	m.acquisitions.WithLabelValues("granted", "")
	for _, k := range errorKinds {
		if k.label != "" && k.status < http.StatusInternalServerError {
			m.acquisitions.WithLabelValues("rejected", k.label)
		}
	}
	collectors := []prometheus.Collector{acquisitions, acquireTime, releases, expirations, storeApply, storeErrors, &poolCollector{s: s}}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return nil, nil, err
		}
	}
	return m, collectors, nil
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

// freeClasses are the min_free values of bitfusion_pool_free_gpus.
var freeClasses = []struct {
	label string
	share allocator.Share
}{{"1", allocator.WholeGPU}, {"0.5", allocator.WholeGPU / 2}, {"0.25", allocator.WholeGPU / 4}, {"0.1", allocator.WholeGPU / 10}}

// poolCollector exports the pool's state from one snapshot per scrape.
type poolCollector struct{ s *Service }

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range poolFamilies {
		ch <- f.Desc()
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
	work := s.estimate.Current()
	pending := map[string]int{}
	for r := range s.waiting {
		pending[r.Namespace]++
	}
	idleSeconds := make(map[string]float64, len(leases)) // of the leases measured now
	idleHeld := map[string]float64{}
	for i := range leases {
		l := &leases[i]
		if _, known := s.useOf(l, now); !known {
			continue
		}
		idleSeconds[l.ID] = 0
		if v := s.idleVerdict(l, now); v != nil {
			idleSeconds[l.ID] = v.Seconds
			if v.Whole {
				idleHeld[l.Namespace] += l.Share().GPUs()
			}
		}
	}
	s.mu.Unlock()

	gauge := func(f *metricdef.Family, v float64, labels ...string) { ch <- f.Metric(v, labels...) }
	free := make([]int, len(freeClasses))
	var fragmented, idle float64
	for i := range servers {
		srv, n := &servers[i].Server, &servers[i].Node
		gauge(serverSchedulable, boolValue(n.Schedulable), srv.Name)
		if t, ok := lastSeen[srv.Name]; ok {
			gauge(serverHeartbeat, float64(t.UnixNano())/1e9, srv.Name)
		}
		for gi, g := range srv.GPUs {
			ng, idx := &n.GPUs[gi], strconv.Itoa(g.Index)
			gauge(gpuInfo, 1, srv.Name, idx, g.Model, g.UUID)
			gauge(gpuAllocated, (allocator.WholeGPU - ng.Free).GPUs(), srv.Name, idx, g.Model)
			gauge(gpuMemory, float64(g.MemoryBytes), srv.Name, idx, g.Model)
			gauge(gpuMemoryAllocated, float64(g.MemoryBytes-ng.FreeBytes), srv.Name, idx, g.Model)
			gauge(gpuHealthy, boolValue(ng.Healthy), srv.Name, idx, g.Model)
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
		gauge(poolFreeGPUs, float64(free[k]), fc.label)
	}
	if idle > 0 {
		gauge(poolFragmentation, fragmented/idle)
	} else {
		gauge(poolFragmentation, 0)
	}
	for _, q := range quotas {
		pending[q.Namespace] += 0
		if q.Limited {
			gauge(namespaceQuota, q.Hard.GPUs(), q.Namespace)
		}
		gauge(namespaceAllocated, q.Used.GPUs(), q.Namespace)
		gauge(namespaceIdleHeld, idleHeld[q.Namespace], q.Namespace)
	}
	c.collectLinks(ch, servers, leases)
	for _, l := range leases {
		gauge(leaseInfo, 1, l.ID, l.Namespace, l.Owner.Pod, l.Server)
		gauge(leaseAllocated, l.Share().GPUs(), l.ID, l.Namespace, l.Server)
		if !l.UntilReleased() {
			gauge(leaseExpiry, float64(l.ExpiresAt.UnixNano())/1e9, l.ID, l.Namespace)
		}
		if seconds, known := idleSeconds[l.ID]; known {
			gauge(leaseIdle, seconds, l.ID, l.Namespace)
		}
	}
	for ns, n := range pending {
		gauge(leasePending, float64(n), ns)
	}
}

// collectLinks counts the multi-GPU leases by namespace and the link all
// their GPUs have on their server.
func (c *poolCollector) collectLinks(ch chan<- prometheus.Metric, servers []allocator.ServerState, leases []allocator.Lease) {
	byName := make(map[string]*inventory.Server, len(servers))
	for i := range servers {
		byName[servers[i].Server.Name] = &servers[i].Server
	}
	type key struct {
		namespace string
		link      inventory.Link
	}
	count := map[key]int{}
	for _, l := range leases {
		if len(l.GPUs) < 2 {
			continue
		}
		gpus := make([]int, len(l.GPUs))
		for i, g := range l.GPUs {
			gpus[i] = g.Index
		}
		count[key{l.Namespace, byName[l.Server].LinkOf(gpus)}]++
	}
	for k, n := range count {
		ch <- namespaceMultiGPULeases.Metric(float64(n), k.namespace, k.link.String())
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
