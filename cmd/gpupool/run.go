package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	vmmetrics "github.com/VictoriaMetrics/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
	"github.com/gpupool/gpupool/internal/cli"
)

// runUsage is what `gpupool run --help` says above the flags.
const runUsage = `Usage: gpupool run -n N [-p P | -m M] [flags] -- command [args...]

Acquires a lease on N GPUs of one server (each at P percent or M memory;
with neither, whole GPUs), runs the command with the lease in its
environment, renews the lease while it runs and releases it when it exits;
SIGINT, SIGTERM and SIGHUP go to the command. Exits with the command's
status, or when the command did not run: 2 bad usage, 69 allocator
unreachable, 75 no capacity (retry, or --wait), 77 quota exceeded or not
allowed.

The command sees GPUPOOL_LEASE_ID, GPUPOOL_SERVER, GPUPOOL_GPU_UUIDS,
GPUPOOL_GPU_PERCENT, GPUPOOL_GPU_MEMORY_BYTES, and CUDA_VISIBLE_DEVICES and
NVIDIA_VISIBLE_DEVICES set to the GPUs' UUIDs; with -p or -m, also MPS's
limits CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT,
which bind where the host runs the MPS control daemon. A pod's container
gets the same from the device plugin.

Flags:
`

// runOptions are gpupool run's flags.
type runOptions struct {
	clientFlags
	amount, percent                             int
	memory, model, topology                     string
	ttl, wait                                   time.Duration
	namespace, pod, podUID, labelsFile, pushURL string
	percentSet                                  bool // -p given, so that -p 0 is refused rather than taken for whole GPUs
}

func (o *runOptions) register(fs *flag.FlagSet) {
	o.clientFlags.register(fs)
	fs.IntVar(&o.amount, "n", 1, "bitfusion.io/gpu-amount: GPUs to use, all on one server")
	fs.IntVar(&o.percent, "p", 0, "bitfusion.io/gpu-percent: share of each GPU, 1..100 (without -p or -m: whole GPUs)")
	fs.StringVar(&o.memory, "m", "", "bitfusion.io/gpu-memory: GPU memory of each GPU, e.g. 8000M or 16Gi (instead of -p)")
	fs.StringVar(&o.model, "model", "", "allowed GPU models, '|'-separated (e.g. A100|H100)")
	// No default in the request, so that an allocator that predates
	// topologies still takes the requests that ask for none.
	fs.StringVar(&o.topology, "topology", "", "the least link between each pair of the GPUs: any (when not given), socket, pcie-switch or nvlink")
	fs.DurationVar(&o.ttl, "ttl", 30*time.Second, "lease lifetime; the lease is renewed every third of it while the command runs")
	fs.DurationVar(&o.wait, "wait", 0, "queue up to this long for capacity or quota instead of failing")
	fs.StringVar(&o.namespace, "namespace", cli.EnvOr("GPUPOOL_NAMESPACE", "default"), "namespace to charge (env GPUPOOL_NAMESPACE)")
	fs.StringVar(&o.pod, "pod", cli.EnvOr("POD_NAME", ""), "pod that owns the lease, for attribution (env POD_NAME)")
	fs.StringVar(&o.podUID, "pod-uid", os.Getenv("POD_UID"), "UID of that pod: the daemon attributes the pod's GPU processes to the lease by it (env POD_UID, from the downward API's metadata.uid)")
	fs.StringVar(&o.labelsFile, "pod-labels-file", os.Getenv("POD_LABELS_FILE"), "the pod's labels as the downward API writes them (key=\"value\" lines); HPA selectors select leases by them (env POD_LABELS_FILE)")
	fs.StringVar(&o.pushURL, "metrics-push-url", os.Getenv("GPUPOOL_METRICS_PUSH_URL"), "push this client's metrics (its measured data-path round trips) here, e.g. VictoriaMetrics' /api/v1/import/prometheus (env GPUPOOL_METRICS_PUSH_URL)")
}

// request is the acquisition the parsed flags ask for, checked as the
// allocator will check it; an error names the flag.
func (o *runOptions) request() (api.AcquireRequest, error) {
	if o.ttl < 3*time.Second {
		return api.AcquireRequest{}, fmt.Errorf("--ttl %s is below the minimum 3s", o.ttl)
	}
	var podLabels map[string]string
	if o.labelsFile != "" {
		var err error
		if podLabels, err = readPodLabels(o.labelsFile); err != nil {
			return api.AcquireRequest{}, fmt.Errorf("--pod-labels-file: %w", err)
		}
	}
	req := api.AcquireRequest{
		Namespace: o.namespace, GPUAmount: o.amount, GPUPercent: o.percent, GPUMemory: o.memory,
		Topology: o.topology, TTL: o.ttl.String(), Owner: api.Owner{Pod: o.pod, UID: o.podUID, Labels: podLabels},
	}
	if o.model != "" {
		req.Models = strings.Split(o.model, "|")
	}
	if o.wait > 0 {
		req.Wait = o.wait.String()
	}
	return req, checkRequest(req, o.percentSet)
}

func runCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var o runOptions
	o.register(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), runUsage)
		fs.PrintDefaults()
	}
	if exit, ok := cli.Parse(fs, args, stdout, stderr); !ok {
		return exit
	}
	command := fs.Args()
	if len(command) == 0 {
		fmt.Fprintln(stderr, "gpupool run: no command given (gpupool run -n 1 -p 50 -- python3 train.py)")
		return exitUsage
	}
	fs.Visit(func(f *flag.Flag) { o.percentSet = o.percentSet || f.Name == "p" })
	req, err := o.request()
	if err != nil {
		fmt.Fprintln(stderr, "gpupool run:", err)
		return exitUsage
	}
	cl, ok := o.client(stderr)
	if !ok {
		return exitUsage
	}
	ctx := context.Background()
	lease, err := cl.Acquire(ctx, req)
	if client.IsReason(err, api.ReasonNoCapacity) {
		hint := " (pass --wait 10m to queue for it)"
		if o.wait > 0 {
			hint = fmt.Sprintf(" after waiting %s", o.wait)
		}
		fmt.Fprintf(stderr, "gpupool run: %v%s\n", err, hint)
		return exitNoCapacity
	}
	if err != nil {
		return allocatorFailed(stderr, "run", err)
	}
	return runLeased(ctx, cl, o.token, lease.Core(), o.ttl, o.pushURL, command, stdout, stderr)
}

// requestFlags names the flag of `gpupool run` behind each field of a
// request that the allocator checks.
var requestFlags = map[string]string{
	"namespace": "--namespace", "gpu-amount": "-n", "gpu-percent": "-p", "gpu-memory": "-m", "models": "--model", "topology": "--topology",
	"ttl": "--ttl", "wait": "--wait", "owner.pod": "--pod", "owner.uid": "--pod-uid", "owner.labels": "--pod-labels-file",
}

// checkRequest checks req as the allocator will, so that a bad flag is
// refused at once, naming the flag, its value and the limit, rather than
// after a round trip to the allocator, or a time-out when there is none.
// percentSet tells -p 0, which is out of range, from no -p at all, which
// asks for whole GPUs.
func checkRequest(req api.AcquireRequest, percentSet bool) error {
	if percentSet && req.GPUPercent == 0 {
		return errors.New("-p: gpu-percent 0 out of range 1..100 (leave -p out for whole GPUs)")
	}
	_, _, err := req.Parse()
	var field *allocator.FieldError
	if !errors.As(err, &field) {
		return err
	}
	name := field.Field
	if strings.HasPrefix(name, "owner.labels") { // owner.labels.<key>: one label's value
		name = "owner.labels"
	}
	if flagName := requestFlags[name]; flagName != "" {
		return fmt.Errorf("%s: %w", flagName, err)
	}
	return err
}

// runLeased runs the command under the lease and releases it afterwards;
// token is the one cl acquired it with.
func runLeased(ctx context.Context, cl *client.Client, token string, lease allocator.Lease, ttl time.Duration, pushURL string, command []string, stdout, stderr io.Writer) int {
	release := func() {
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := cl.Release(rctx, lease.ID); err != nil {
			fmt.Fprintf(stderr, "gpupool run: releasing %s: %v (it expires by itself within %s)\n", lease.ID, err, ttl)
		}
	}
	cmd := exec.CommandContext(ctx, command[0], command[1:]...) //nolint:gosec // running the user's command is the point
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.Env = os.Environ()
	env := api.LeaseEnv(lease)
	for _, k := range slices.Sorted(maps.Keys(env)) {
		cmd.Env = append(cmd.Env, k+"="+env[k])
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(signals)
	if err := cmd.Start(); err != nil {
		release()
		fmt.Fprintln(stderr, "gpupool run:", err)
		return exitNotFound
	}
	attachCtx, detach := context.WithCancel(ctx)
	var attached sync.WaitGroup
	defer func() { detach(); attached.Wait() }() // the last push goes out before exit
	// Off the way of renewal: looking the server up may take a while.
	attached.Go(func() { attach(attachCtx, &attached, cl, token, lease, pushURL, stderr) })
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	lost := make(chan struct{})
	renewCtx, stopRenewing := context.WithCancel(ctx)
	defer stopRenewing()
	go keepRenewing(renewCtx, cl, lease.ID, ttl, lost, stderr)
	var kill <-chan time.Time
	for {
		select {
		case sig := <-signals:
			_ = cmd.Process.Signal(sig)
		case <-lost:
			lost = nil
			fmt.Fprintf(stderr, "gpupool run: lease %s is gone (expired or released elsewhere); stopping the command\n", lease.ID)
			_ = cmd.Process.Signal(syscall.SIGTERM)
			kill = time.After(killGrace)
		case <-kill:
			_ = cmd.Process.Kill()
		case err := <-exited:
			stopRenewing()
			release()
			return exitStatus(err)
		}
	}
}

// killGrace is how long a command may take to stop after SIGTERM when its
// lease is gone, before SIGKILL.
const killGrace = 10 * time.Second

// keepRenewing renews every third of the TTL, off the loop that forwards
// signals; it closes lost when the lease is gone.
func keepRenewing(ctx context.Context, cl *client.Client, id string, ttl time.Duration, lost chan<- struct{}, stderr io.Writer) {
	t := time.NewTicker(ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, ttl/3)
		_, err := cl.Renew(rctx, id, ttl)
		cancel()
		switch {
		case client.IsReason(err, api.ReasonNotFound):
			close(lost)
			return
		case err != nil && ctx.Err() == nil:
			fmt.Fprintf(stderr, "gpupool run: renewing %s: %v (will retry)\n", id, err)
		}
	}
}

// attach tells the lease's GPU-server daemon, over its process socket,
// that this process runs under the lease, so it attributes the GPU use of
// the command (a descendant) to it, and probes the data-path round trip to
// the server while the command runs, pushing what it measures when pushURL
// is set. Best effort: a pool without daemons works, its leases just show
// no use.
//
// The report names no PID: the daemon takes this process's from the
// socket, in its own PID namespace, which is right from a container too,
// where the command's PID as this process sees it is not.
func attach(ctx context.Context, wg *sync.WaitGroup, cl *client.Client, token string, lease allocator.Lease, pushURL string, stderr io.Writer) {
	lookup, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pool, err := cl.Pool(lookup)
	if err != nil {
		return
	}
	i := slices.IndexFunc(pool.Servers, func(s api.ServerStatus) bool { return s.Name == lease.Server })
	if i < 0 {
		return
	}
	labels := pool.Servers[i].Labels
	if socket := labels[gpuapi.LabelProcessSocket]; socket != "" {
		// The daemon asks the allocator, which may take its own 5 s.
		report, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := gpuapi.ReportProcess(report, socket, token, gpuapi.ProcessReport{Lease: lease.ID}); err != nil {
			fmt.Fprintf(stderr, "gpupool run: telling the daemon of %s about the command: %v (its use will not be attributed)\n", lease.Server, err)
		}
	}
	addr := labels[gpuapi.LabelProbeAddress]
	if addr == "" {
		return
	}
	node := cli.EnvOr("NODE_NAME", hostname())
	hist := gpuapi.LatencyFamily.NewHistogramVec()
	obs := hist.WithLabelValues(lease.Server, node, gpuapi.TransportTCP)
	go func() {
		_ = gpuapi.DialProbe(ctx, addr, node, time.Second, func(d time.Duration) { obs.Observe(d.Seconds()) })
	}()
	if pushURL != "" {
		wg.Go(func() { pushLatency(ctx, pushURL, hist, lease) })
	}
}

// pushLatency pushes the client's round-trip histogram every 10 s and once
// more when the command ends, with VictoriaMetrics' push client.
func pushLatency(ctx context.Context, url string, hist *prometheus.HistogramVec, lease allocator.Lease) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(hist)
	write := func(w io.Writer) {
		families, err := reg.Gather()
		if err != nil {
			return
		}
		for _, f := range families {
			_, _ = expfmt.MetricFamilyToText(w, f)
		}
	}
	opts := &vmmetrics.PushOptions{ExtraLabels: fmt.Sprintf(`job="gpupool-run",lease=%q,namespace=%q`, lease.ID, lease.Namespace)}
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = vmmetrics.PushMetricsExt(final, url, write, opts)
			cancel()
			return
		case <-t.C:
			_ = vmmetrics.PushMetricsExt(ctx, url, write, opts)
		}
	}
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// exitStatus is the shell's view of how the command ended.
func exitStatus(err error) int {
	if err == nil {
		return 0
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return exit.ExitCode()
	}
	return 1
}

// readPodLabels reads labels in the downward API's format: one
// key="value" per line, the value quoted as in Go.
func readPodLabels(path string) (map[string]string, error) {
	b, err := os.ReadFile(path) //nolint:gosec // the pod's own downward API file
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		k, quoted, ok := strings.Cut(line, "=")
		v, err := strconv.Unquote(quoted)
		if !ok || err != nil || k == "" {
			return nil, fmt.Errorf("%s:%d: %q is not key=\"value\"", path, i+1, line)
		}
		out[k] = v
	}
	return out, nil
}
