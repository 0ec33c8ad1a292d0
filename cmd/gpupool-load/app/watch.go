package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"time"
)

// watcher follows a run: it prints progress, scrapes the allocator's
// /metrics, samples its process and, once every lease is live, asks the
// adapter.
type watcher struct {
	o      *Options
	st     *stats
	stdout io.Writer
	start  time.Time

	adapterQuery adapterQuery
	adapter      latencies
	scrape       latencies
	metricsBytes int

	// first is the allocator's first sample, steady the one when every
	// lease was live (zero before), last the latest; maxRSS the largest.
	first, steady, last processSample
	maxRSS              int64
	steadyAt            time.Duration
}

func newWatcher(o *Options, st *stats, stdout io.Writer) *watcher {
	return &watcher{o: o, st: st, stdout: stdout, start: time.Now()}
}

// watch runs until ctx ends, then takes the last sample and scrape.
func (w *watcher) watch(ctx context.Context) {
	w.sample()
	w.first = w.last
	progress := time.NewTicker(w.o.Progress)
	defer progress.Stop()
	second := time.NewTicker(time.Second)
	defer second.Stop()
	adapter := adapterClient(w.adapterQuery.insecure)
	for {
		select {
		case <-ctx.Done():
			w.sample()
			w.scrapeMetrics()
			return
		case <-second.C:
			if w.steadyAt == 0 && w.isSteady() {
				w.steadyAt = time.Since(w.start)
				w.sample()
				w.steady = w.last
				fmt.Fprintf(w.stdout, "[%5.0fs] every server registered and every lease live\n", w.steadyAt.Seconds())
			}
			if w.steadyAt > 0 && w.adapterQuery.base != "" {
				w.askAdapter(ctx, adapter)
			}
		case <-progress.C:
			w.sample()
			w.scrapeMetrics()
			w.printProgress()
		}
	}
}

func (w *watcher) isSteady() bool {
	return int(w.st.servers.registered.Load()) == w.o.Servers && int(w.st.clients.live.Load()) == w.o.Leases
}

// sample reads the allocator's process, when its PID was given.
func (w *watcher) sample() {
	if w.o.AllocatorPID == 0 {
		return
	}
	s, err := sampleProcess(w.o.AllocatorPID)
	if err != nil {
		w.st.errors.add("allocator-process", err)
		return
	}
	w.last, w.maxRSS = s, max(w.maxRSS, s.rss)
}

func (w *watcher) scrapeMetrics() {
	t0 := time.Now()
	resp, err := http.Get(w.o.Allocator + "/metrics")
	if err != nil {
		w.st.errors.add("metrics", err)
		return
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = kindError(resp.Status)
	}
	if err != nil {
		w.st.errors.add("metrics", err)
		return
	}
	w.scrape.add(time.Since(t0))
	w.metricsBytes = int(n)
}

func (w *watcher) printProgress() {
	cpu := ""
	if w.o.AllocatorPID != 0 {
		cpu = fmt.Sprintf("  allocator %.2f CPU s/s since start, RSS %d MiB", cpuPerSecond(w.first, w.last), w.last.rss>>20)
	}
	fmt.Fprintf(w.stdout, "[%5.0fs] servers %d/%d  leases %d/%d  heartbeats %d  acquisitions %d  renewals %d  errors %d  /metrics %d bytes%s\n",
		time.Since(w.start).Seconds(), w.st.servers.registered.Load(), w.o.Servers, w.st.clients.live.Load(), w.o.Leases,
		w.st.servers.heartbeat.quantiles().Count, w.st.clients.acquire.quantiles().Count, w.st.clients.renew.quantiles().Count,
		w.st.errors.total(), w.metricsBytes, cpu)
}

// adapterQuery is the external metric asked of the adapter: the GPU
// utilization of one group's leases, as an HPA scaling that group asks.
type adapterQuery struct {
	base, namespace, selector string
	insecure                  bool
}

// kindError is a failure named by its kind alone.
type kindError string

func (e kindError) Error() string { return string(e) }

func (w *watcher) askAdapter(ctx context.Context, c *http.Client) {
	q := w.adapterQuery
	u := fmt.Sprintf("%s/namespaces/%s/bitfusion_gpu_utilization?labelSelector=%s", q.base, q.namespace, url.QueryEscape(q.selector))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		w.st.errors.add("adapter", err)
		return
	}
	t0 := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			w.st.errors.add("adapter", err)
		}
		return
	}
	defer resp.Body.Close()
	var list struct {
		Items []json.RawMessage `json:"items"`
	}
	switch {
	case resp.StatusCode != http.StatusOK:
		w.st.errors.add("adapter", kindError(resp.Status))
	case json.NewDecoder(resp.Body).Decode(&list) != nil || len(list.Items) != 1:
		w.st.errors.add("adapter", kindError("no value"))
	default:
		w.adapter.add(time.Since(t0))
	}
}

// summary is what a run measured.
type summary struct {
	Servers, GPUs, Leases int
	Ran                   time.Duration
	// SteadyAfter is when every server was registered and every lease
	// live (0: never).
	SteadyAfter       time.Duration
	RegisteredServers int64
	// LiveLeases is the leases held when the duration ended.
	LiveLeases                        int64
	Register, Heartbeat, ListLeases   Quantiles
	Acquire, Renew, Release           Quantiles
	UsageReads                        int64
	Adapter                           Quantiles
	AdapterNamespace, AdapterSelector string
	MetricsBytes                      int
	MetricsScrape                     Quantiles
	AllocatorCPUPerSecond             float64
	AllocatorRSSBytes                 int64
	Errors                            map[string]int
}

func (w *watcher) summarize(o *Options, ran time.Duration) *summary {
	st := w.st
	s := &summary{
		Servers: o.Servers, GPUs: o.Servers * o.GPUsPerServer, Leases: o.Leases, Ran: ran, SteadyAfter: w.steadyAt,
		RegisteredServers: st.servers.registered.Load(), LiveLeases: st.liveAtEnd,
		Register: st.servers.register.quantiles(), Heartbeat: st.servers.heartbeat.quantiles(), ListLeases: st.servers.listLeases.quantiles(),
		Acquire: st.clients.acquire.quantiles(), Renew: st.clients.renew.quantiles(), Release: st.clients.release.quantiles(),
		UsageReads: st.servers.usageReads.Load(), Adapter: w.adapter.quantiles(),
		AdapterNamespace: w.adapterQuery.namespace, AdapterSelector: w.adapterQuery.selector,
		MetricsBytes: w.metricsBytes, MetricsScrape: w.scrape.quantiles(), AllocatorRSSBytes: w.maxRSS,
		Errors: st.errors.snapshot(),
	}
	// The steady phase's CPU, when there was one: the ramp-up's
	// registrations and acquisitions are another load.
	from := w.first
	if w.steadyAt > 0 {
		from = w.steady
	}
	s.AllocatorCPUPerSecond = cpuPerSecond(from, w.last)
	return s
}

func (s *summary) write(out io.Writer) {
	steady := "never"
	if s.SteadyAfter > 0 {
		steady = fmt.Sprintf("after %.1fs", s.SteadyAfter.Seconds())
	}
	fmt.Fprintf(out, "\nsummary after %.1fs (%d servers, %d GPUs, %d leases asked):\n", s.Ran.Seconds(), s.Servers, s.GPUs, s.Leases)
	rows := [][2]string{
		{"registered servers", fmt.Sprint(s.RegisteredServers)},
		{"live leases", fmt.Sprintf("%d (when the duration ended)", s.LiveLeases)},
		{"steady", steady + " (every server registered, every lease live)"},
		{"register", s.Register.String()},
		{"heartbeat", s.Heartbeat.String()},
		{"list leases", s.ListLeases.String()},
		{"acquire", s.Acquire.String()},
		{"renew", s.Renew.String()},
		{"release", s.Release.String()},
		{"usage reads", fmt.Sprintf("%d (the adapter's reads of the simulated daemons)", s.UsageReads)},
		{"adapter answer", fmt.Sprintf("%s  (bitfusion_gpu_utilization, namespace %s, selector %s)", s.Adapter, s.AdapterNamespace, s.AdapterSelector)},
		{"/metrics", fmt.Sprintf("%d bytes, scrape %s", s.MetricsBytes, s.MetricsScrape)},
	}
	if s.AllocatorRSSBytes > 0 {
		rows = append(rows, [2]string{"allocator", fmt.Sprintf("%.3f CPU s/s (steady phase, or whole run), RSS %d MiB (max)", s.AllocatorCPUPerSecond, s.AllocatorRSSBytes>>20)})
	}
	errs := "none"
	if len(s.Errors) > 0 {
		errs = ""
		for _, k := range slices.Sorted(maps.Keys(s.Errors)) {
			errs += fmt.Sprintf("%s: %d  ", k, s.Errors[k])
		}
	}
	rows = append(rows, [2]string{"errors", errs})
	for _, r := range rows {
		fmt.Fprintf(out, "  %-20s %s\n", r[0], r[1])
	}
}
