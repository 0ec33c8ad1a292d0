package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/metricstest"
	"github.com/gpupool/gpupool/test/e2e/kube"
)

// The HPA tests need the control plane test/e2e/kube/build.sh builds;
// `make e2e` sets KUBE_BIN_DIR to it. Without it they are skipped.

const (
	hpaNamespace = "ml"
	hpaApp       = "tf-training"
	gpuNode      = "gpu-node-0"
	// Each replica of tf-training holds half a GPU; the HPA aims at 60%
	// of what the replicas hold busy.
	replicaPercent = 50
	hpaTarget      = "600m"
)

// expectedReplicas is what the HPA settles on for work (in GPUs): the
// replicas whose shares the work keeps 60% busy, rounded up.
func expectedReplicas(work float64) int {
	n := int(work/(allocator.SharePercent(replicaPercent).GPUs()*0.6) + 0.999)
	return min(max(n, 1), 6)
}

// hpaRig is the whole loop on one machine: a real control plane (etcd,
// kube-apiserver, kube-controller-manager, kwok), the allocator, one
// simulated GPU server whose load follows a workload file, the adapter
// registered as the external-metrics APIService, and the tf-training
// Deployment with its HPA. Each Ready replica holds a lease, so scaling
// out spreads the same work thinner: the loop is closed.
type hpaRig struct {
	cp        *kube.ControlPlane
	client    *client.Client
	allocURL  string
	workload  string
	dir       string
	serverArg []string
	config    *poolConfig
	serverMu  sync.Mutex
	server    *exec.Cmd
	logs      *syncBuffer
	// scaler is the address of gpupool-adapter's KEDA external scaler,
	// adapter its process, kedaCert the client certificate KEDA presents
	// it; promURL is Prometheus's, for KEDA's prometheus trigger.
	scaler, promURL string
	adapter         *exec.Cmd
	kedaCert        tls.Certificate
}

type rigOptions struct {
	syncPeriod time.Duration
	backend    string // direct or prometheus
	scrape     time.Duration
	// keda, when set, has KEDA scale tf-training, from zero, with this
	// trigger (hpaRig.kedaTrigger), instead of gpupool's APIService and an
	// HPA, polling every kedaPolling (KEDA's default, 30 s, when 0).
	keda        string
	kedaPolling time.Duration
}

func startHPARig(t testing.TB, o rigOptions) *hpaRig {
	t.Helper()
	bins := os.Getenv("KUBE_BIN_DIR")
	if bins == "" {
		t.Skip("KUBE_BIN_DIR is not set: `make e2e` builds the control plane (test/e2e/kube/build.sh) and sets it")
	}
	ctx := context.Background()
	dir := t.TempDir()
	cp, err := kube.Start(ctx, kube.Options{BinDir: bins, Dir: dir, HPASyncPeriod: o.syncPeriod})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	r := &hpaRig{cp: cp, dir: dir, workload: filepath.Join(dir, "workload.yaml"), logs: &syncBuffer{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("control plane:\n%s\npool:\n%s", cp.Logs(20), tail(r.logs.String(), 40))
		}
	})
	r.setLoad(t, 0.25)

	// Tokens on, as deployed: the daemon holds the servers token, each
	// replica's `gpupool run` ml's, the adapter the admin token.
	r.config = writePoolConfig(t, map[string]int64{hpaNamespace: noQuota})
	if o.keda != "" {
		r.config.setIdlePolicy(t, hpaNamespace, kedaIdlePolicy)
	}
	a := startAllocator(t, "--data-dir", t.TempDir(), "--heartbeat-timeout", "5s", "--config", r.config.Path)
	r.allocURL, r.client = a.URL, newClient(t, a.URL, r.config.Tenant[hpaNamespace])
	daemonAddr := "127.0.0.1:" + freePort(t)
	r.serverArg = []string{"--allocator", a.URL, "--name", "gpu-0", "--listen", daemonAddr, "--probe-listen", "127.0.0.1:0",
		"--simulate-gpus", "H100:80Gi:8", "--simulated-workload", r.workload, "--interval", "200ms", "--process-every", "1",
		"--heartbeat", "500ms", "--metric-labels-allowlist", "app"}
	r.startServer(t)

	var promURL string
	if o.backend == "prometheus" {
		// Its queries read gpupool's recording rules, which their group
		// evaluates every 5 s whatever the scrape interval.
		promURL = metricstest.StartPrometheusWith(t, metricstest.PrometheusConfig{Interval: o.scrape, RuleFiles: []string{metricstest.GpupoolRules(t)}},
			a.URL, "http://"+daemonAddr)
	}
	if o.keda == "" {
		startAPIServiceAdapter(t, cp, r.logs, a.URL, r.config.adminTokenFile(t), promURL, o.scrape)
	} else {
		r.startKEDA(t, promURL)
	}

	if err := cp.AddKwokNode(ctx, gpuNode, map[string]string{"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}); err != nil {
		t.Fatal(err)
	}
	r.createWorkload(t, o)
	followCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.followReplicas(followCtx) }()
	t.Cleanup(func() { stop(); <-done })
	return r
}

func tail(s string, lines int) string {
	n := 0
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			if n++; n > lines {
				return s[i+1:]
			}
		}
	}
	return s
}

// startBinary runs one of gpupool's binaries until the test ends, its
// output in logs, and waits until it logs a line matching ready.
func startBinary(t testing.TB, logs *syncBuffer, name string, ready *regexp.Regexp, args ...string) *exec.Cmd {
	t.Helper()
	return startBinaryEnv(t, logs, nil, name, ready, args...)
}

// startBinaryEnv is startBinary with env added to the binary's environment.
func startBinaryEnv(t testing.TB, logs *syncBuffer, env []string, name string, ready *regexp.Regexp, args ...string) *exec.Cmd {
	t.Helper()
	return startCommand(t, logs, env, filepath.Join(binDir, name), ready, args...)
}

// startCommand runs the program at path as startBinaryEnv runs a binary of
// gpupool's: until the test ends, its output in logs under its base name,
// waiting until it logs a line matching ready.
func startCommand(t testing.TB, logs *syncBuffer, env []string, path string, ready *regexp.Regexp, args ...string) *exec.Cmd {
	t.Helper()
	name := filepath.Base(path)
	cmd := exec.Command(path, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	out, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	seen := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		once := sync.Once{}
		for sc.Scan() {
			fmt.Fprintf(logs, "%s: %s\n", name, sc.Text())
			if ready.MatchString(sc.Text()) {
				once.Do(func() { close(seen) })
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	select {
	case <-seen:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not start:\n%s", name, tail(logs.String(), 30))
	}
	return cmd
}

// startAPIServiceAdapter runs gpupool-adapter as the external-metrics APIService of
// cp, until the test ends, and waits until the aggregator finds it
// Available: the allocator's leases name the pods, and the values come
// from the daemons directly, or from Prometheus at promURL (scraping every
// scrape) when it is set.
func startAPIServiceAdapter(t testing.TB, cp *kube.ControlPlane, logs *syncBuffer, allocatorURL, adminTokenFile, promURL string, scrape time.Duration) {
	t.Helper()
	ctx := context.Background()
	port, _ := startClusterAdapter(t, cp, logs, allocatorURL, adminTokenFile, promURL, scrape)
	if err := cp.RegisterAPIService(ctx, "external.metrics.k8s.io", "v1beta1", "gpupool", "gpupool-adapter", port); err != nil {
		t.Fatal(err)
	}
	if err := cp.WaitAPIServiceAvailable(ctx, "v1beta1.external.metrics.k8s.io"); err != nil {
		t.Fatal(err)
	}
}

// startClusterAdapter runs gpupool-adapter as deployed in cp, until the test ends, with
// extra flags, and returns its secure port and its process: its serving certificate is
// the cluster CA's, for the Service name the aggregator and KEDA check,
// and its authentication and authorization are delegated to kube-apiserver.
func startClusterAdapter(t testing.TB, cp *kube.ControlPlane, logs *syncBuffer, allocatorURL, adminTokenFile, promURL string, scrape time.Duration, extra ...string) (int32, *exec.Cmd) {
	t.Helper()
	dir := t.TempDir()
	cert, key, err := cp.ServingCert("gpupool-adapter.gpupool.svc")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "adapter.crt"), filepath.Join(dir, "adapter.key")
	if err := os.WriteFile(certFile, cert, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	// Values older than 10 s are refused, so that a stopped daemon shows
	// soon; the Prometheus backend dates a value by its oldest sample, so
	// there --max-age stays well over the scrape interval (docs/adapter.md:
	// 15 s against 30 s).
	maxAge, backend := 10*time.Second, "direct"
	if promURL != "" {
		maxAge, backend = max(maxAge, 2*scrape), "prometheus"
	}
	args := []string{"--secure-port", port, "--bind-address", "127.0.0.1", "--tls-cert-file", certFile,
		"--tls-private-key-file", keyFile, "--kubeconfig", cp.Kubeconfig, "--authentication-kubeconfig", cp.Kubeconfig,
		"--authorization-kubeconfig", cp.Kubeconfig, "--max-age", maxAge.String(), "--metrics-listen", "127.0.0.1:0",
		"--backend", backend, "--allocator", allocatorURL, "--allocator-token-file", adminTokenFile}
	if promURL != "" {
		args = append(args, "--prometheus-url", promURL)
	}
	cmd := startBinary(t, logs, "gpupool-adapter", regexp.MustCompile(`Serving securely`), append(args, extra...)...)
	portNum, _ := strconv.Atoi(port)
	return int32(portNum), cmd
}

func (r *hpaRig) startServer(t testing.TB) {
	cmd := startDaemon(t, r.logs, r.config.Servers, r.serverArg...)
	r.serverMu.Lock()
	r.server = cmd
	r.serverMu.Unlock()
}

// stopServer kills the GPU server's daemon: its readings stop.
func (r *hpaRig) stopServer() {
	r.serverMu.Lock()
	defer r.serverMu.Unlock()
	_ = r.server.Process.Kill()
	_ = r.server.Wait()
}

// setLoad sets the work tf-training has, in GPUs kept busy.
func (r *hpaRig) setLoad(t testing.TB, gpus float64) {
	t.Helper()
	body := fmt.Sprintf("- {namespace: %s, selector: app=%s, gpus: %g}\n", hpaNamespace, hpaApp, gpus)
	tmp := r.workload + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, r.workload); err != nil {
		t.Fatal(err)
	}
}

// createWorkload creates the tf-training Deployment on the kwok GPU node:
// one replica and its HPA on bitfusion_gpu_utilization, or none and
// KEDA's ScaledObject with the trigger o.keda.
func (r *hpaRig) createWorkload(t testing.TB, o rigOptions) {
	t.Helper()
	ctx := context.Background()
	c := r.cp.Client
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: hpaNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	replicas := int32(1)
	if o.keda != "" {
		replicas = 0
	}
	dep := deployment(hpaApp, replicas, corev1.PodSpec{
		NodeName:    gpuNode, // no scheduler runs: kwok's node takes them
		Tolerations: []corev1.Toleration{{Key: "kwok.x-k8s.io/node", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		Containers:  []corev1.Container{{Name: "trainer", Image: "tf-training:fake"}},
	})
	if _, err := c.AppsV1().Deployments(hpaNamespace).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if o.keda != "" {
		r.createScaledObject(t, o.keda, o.kedaPolling)
		return
	}
	if _, err := c.AutoscalingV2().HorizontalPodAutoscalers(hpaNamespace).Create(ctx, tfTrainingHPA(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// deployment is a Deployment of replicas pods of spec, labelled app=<name>.
func deployment(name string, replicas int32, spec corev1.PodSpec) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
		},
	}
}

// tfTrainingHPA is tf-training's HPA on bitfusion_gpu_utilization of its
// pods (hpaTarget each, 1 to 6 replicas), reacting at once both ways so
// that the tests need not wait out the default stabilization.
func tfTrainingHPA() *autoscalingv2.HorizontalPodAutoscaler {
	fast := &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To[int32](0),
		Policies: []autoscalingv2.HPAScalingPolicy{{Type: autoscalingv2.PercentScalingPolicy, Value: 400, PeriodSeconds: 1}}}
	return &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Name: hpaApp, Namespace: hpaNamespace},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: hpaApp},
			MinReplicas:    ptr.To[int32](1),
			MaxReplicas:    6,
			Metrics: []autoscalingv2.MetricSpec{{
				Type: autoscalingv2.ExternalMetricSourceType,
				External: &autoscalingv2.ExternalMetricSource{
					Metric: autoscalingv2.MetricIdentifier{Name: "bitfusion_gpu_utilization", Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": hpaApp}}},
					Target: autoscalingv2.MetricTarget{Type: autoscalingv2.ValueMetricType, Value: ptr.To(resource.MustParse(hpaTarget))},
				},
			}},
			Behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{ScaleUp: fast, ScaleDown: fast},
		},
	}
}

// followReplicas is what each replica's `gpupool run` does with the
// namespace's token: a Ready pod holds a lease of half a GPU, owned by the
// pod (its UID is how the daemon attributes the work); a pod that is gone
// releases it.
func (r *hpaRig) followReplicas(ctx context.Context) {
	held := map[string]string{} // pod UID -> lease ID
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		pods, err := r.cp.Client.CoreV1().Pods(hpaNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + hpaApp})
		if err != nil {
			continue
		}
		ready := map[string]bool{}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || !podReady(&p) {
				continue
			}
			uid := string(p.UID)
			ready[uid] = true
			if held[uid] != "" {
				continue
			}
			l, err := r.client.Acquire(ctx, api.AcquireRequest{Namespace: hpaNamespace, GPUAmount: 1, GPUPercent: replicaPercent, TTL: "1h",
				IdempotencyKey: uid, Owner: api.Owner{Pod: p.Name, UID: uid, Labels: p.Labels}})
			if err == nil {
				held[uid] = l.ID
			}
		}
		for uid, id := range held {
			if !ready[uid] {
				if err := r.client.Release(ctx, id); err == nil {
					delete(held, uid)
				}
			}
		}
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// tfTrainingHPAStatus is tf-training's HPA as c reads it now.
func tfTrainingHPAStatus(t testing.TB, c kubernetes.Interface) *autoscalingv2.HorizontalPodAutoscaler {
	t.Helper()
	h, err := c.AutoscalingV2().HorizontalPodAutoscalers(hpaNamespace).Get(context.Background(), hpaApp, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func condition(h *autoscalingv2.HorizontalPodAutoscaler, typ autoscalingv2.HorizontalPodAutoscalerConditionType) (corev1.ConditionStatus, string) {
	for _, c := range h.Status.Conditions {
		if c.Type == typ {
			return c.Status, c.Reason
		}
	}
	return corev1.ConditionUnknown, ""
}

// waitReplicas waits until tf-training's HPA wants n replicas and the
// Deployment has n Ready, and returns how long the HPA took to want them.
func waitReplicas(t testing.TB, c kubernetes.Interface, n int32, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var desired time.Duration
	for deadline := start.Add(within); ; time.Sleep(250 * time.Millisecond) {
		h := tfTrainingHPAStatus(t, c)
		if h.Status.DesiredReplicas == n && desired == 0 {
			desired = time.Since(start)
		}
		dep, err := c.AppsV1().Deployments(hpaNamespace).Get(context.Background(), hpaApp, metav1.GetOptions{})
		if err == nil && desired > 0 && dep.Status.ReadyReplicas == n && h.Status.DesiredReplicas == n {
			return desired
		}
		if time.Now().After(deadline) {
			active, why := condition(h, autoscalingv2.ScalingActive)
			t.Fatalf("after %v the HPA wants %d replicas (current %d), want %d; ScalingActive=%s (%s); metrics %+v",
				within, h.Status.DesiredReplicas, h.Status.CurrentReplicas, n, active, why, h.Status.CurrentMetrics)
		}
	}
}

// waitHPAHolds waits until tf-training's HPA finds its metric gone
// (ScalingActive False), then checks, three sync periods later, that it
// held n replicas rather than scale on a missing value.
func waitHPAHolds(t *testing.T, c kubernetes.Interface, n int32, syncPeriod time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		if active, _ := condition(tfTrainingHPAStatus(t, c), autoscalingv2.ScalingActive); active == corev1.ConditionFalse {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ScalingActive did not turn False with the metric gone: %+v", tfTrainingHPAStatus(t, c).Status.Conditions)
		}
	}
	time.Sleep(3 * syncPeriod)
	h := tfTrainingHPAStatus(t, c)
	if h.Status.DesiredReplicas != n || h.Status.CurrentReplicas != n {
		t.Errorf("with the metric stale the HPA moved to %d/%d replicas, want it to hold %d", h.Status.DesiredReplicas, h.Status.CurrentReplicas, n)
	}
	_, why := condition(h, autoscalingv2.ScalingActive)
	t.Logf("metric stale: ScalingActive=False (%s), held at %d", why, h.Status.CurrentReplicas)
}

// rawMetric reads the external metric through the kube-apiserver, as
// `kubectl get --raw` does.
func (r *hpaRig) rawMetric(ctx context.Context) ([]byte, error) {
	get, err := newRawGetter(r.cp.Config)
	if err != nil {
		return nil, err
	}
	return get(ctx)
}

// newRawGetter returns a reader of tf-training's utilization through the
// kube-apiserver at cfg.
func newRawGetter(cfg *rest.Config) (func(context.Context) ([]byte, error), error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) ([]byte, error) {
		return cs.RESTClient().Get().AbsPath("/apis/external.metrics.k8s.io/v1beta1/namespaces", hpaNamespace, "bitfusion_gpu_utilization").
			Param("labelSelector", "app="+hpaApp).DoRaw(ctx)
	}, nil
}

// TestHPAScalesOnGPUUtilization: the real HPA controller scales
// tf-training out when its work rises, back in when it falls, holds its
// size while the metric is stale, and resumes when it returns.
func TestHPAScalesOnGPUUtilization(t *testing.T) {
	r := startHPARig(t, rigOptions{syncPeriod: 2 * time.Second, backend: "direct"})
	ctx := context.Background()

	waitReplicas(t, r.cp.Client, 1, 60*time.Second)
	raw, err := r.rawMetric(ctx)
	if err != nil || !regexp.MustCompile(`"metricName":\s*"bitfusion_gpu_utilization"`).Match(raw) {
		t.Fatalf("get --raw: %v\n%s", err, raw)
	}
	t.Logf("kubectl get --raw: %s", regexp.MustCompile(`\s+`).ReplaceAll(raw, []byte(" ")))

	const high, low = 1.5, 0.3
	r.setLoad(t, high)
	took := waitReplicas(t, r.cp.Client, int32(expectedReplicas(high)), 120*time.Second)
	t.Logf("load %g GPUs: scaled out to %d (the HPA wanted them %v after the step)", high, expectedReplicas(high), took.Round(time.Second))

	r.setLoad(t, low)
	took = waitReplicas(t, r.cp.Client, int32(expectedReplicas(low)), 120*time.Second)
	t.Logf("load %g GPUs: scaled in to %d (%v)", low, expectedReplicas(low), took.Round(time.Second))

	// The daemon stops: no reading, so the HPA must hold, not scale on a
	// zero, even though the work rose meanwhile.
	r.stopServer()
	r.setLoad(t, high)
	waitHPAHolds(t, r.cp.Client, int32(expectedReplicas(low)), 2*time.Second)
	if _, err := r.rawMetric(ctx); err == nil {
		t.Error("get --raw answered a value while the daemon is down")
	}

	r.startServer(t)
	took = waitReplicas(t, r.cp.Client, int32(expectedReplicas(high)), 120*time.Second)
	t.Logf("metric back: scaled out to %d (%v)", expectedReplicas(high), took.Round(time.Second))
	if active, _ := condition(tfTrainingHPAStatus(t, r.cp.Client), autoscalingv2.ScalingActive); active != corev1.ConditionTrue {
		t.Errorf("ScalingActive = %s after the metric returned", active)
	}
}
