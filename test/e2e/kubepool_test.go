package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/etcdtest"
	"github.com/gpupool/gpupool/kube"
	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
)

// kubePoolOptions configure startKubePool.
type kubePoolOptions struct {
	// Unit is the cluster's unit of bitfusion.io/gpu, the webhook's and
	// gpupool-scheduler's --unit; empty is kube.UnitPercent.
	Unit kube.Unit
	// Namespaces are created, each with its token in the allocator's
	// config and no quota there (the lease controller sets it from the
	// namespace's ResourceQuotas), and the webhook admits their pods.
	Namespaces []string
	// AllocatorArgs are more flags for the allocator, such as --policy.
	AllocatorArgs []string
	// AllocatorReplicas above 1 runs that many allocators on a 3-member
	// etcd, as controller.replicas deploys them: one leads, the others
	// stand by, and gpupool-scheduler and Admin are given every address.
	AllocatorReplicas int
	// SchedulerArgs are more flags for gpupool-scheduler, such as
	// --log-level.
	SchedulerArgs []string
	// ExtenderTimeout is kube-scheduler's httpTimeout for the extender;
	// zero is its default, 5 s.
	ExtenderTimeout time.Duration
	// HPASyncPeriod is the HPA controller's; zero is the harness's default.
	HPASyncPeriod time.Duration
	// IdlePolicies are namespaces' idle policies in the allocator's
	// config, as YAML flow maps ({useBelow: 0.1, window: 1m, ...}).
	IdlePolicies map[string]string
	// Extender places the pool's pods through gpupool-scheduler's extender
	// and the upstream kube-scheduler, the way for a cluster that must run
	// that binary; by default they are placed as deployed, by
	// gpupool-kube-scheduler's GPUPool plugin, beside gpupool-scheduler's
	// lease controller.
	Extender bool
	// DRANode runs startNodePool's node on containerd 2, which applies CDI
	// specs, and its device plugin as DRA's kubelet plugin too (--dra).
	DRANode bool
}

// kubePool is gpupool deployed on a real control plane as users deploy
// it, tokens on: the allocator, gpupool-webhook registered with
// kube-apiserver, gpupool-scheduler (the lease controller) and
// gpupool-kube-scheduler, whose gpupool profile runs the GPUPool plugin
// (or gpupool-scheduler's extender and the upstream kube-scheduler). No node is added: tests
// add kwok nodes and register those that are GPU servers.
type kubePool struct {
	CP *e2ekube.ControlPlane
	// Admin is an operator's allocator client; Servers registers GPU
	// servers, as their daemons do.
	Admin, Servers *client.Client
	// Allocator is the running allocator, the leading one of replicas;
	// restartAllocator replaces it.
	Allocator *allocatorProcess
	// Replicas are every allocator replica, Allocator among them.
	Replicas []*allocatorProcess
	// Logs gather gpupool-webhook's and gpupool-scheduler's output.
	Logs *syncBuffer
	// plugin: the pods are placed by gpupool-kube-scheduler's plugin, whose
	// lines are in kube-scheduler's log.
	plugin bool
	// AllocatorForScheduler, when set, is where gpupool-scheduler and
	// gpupool-kube-scheduler started from then on find the allocator, such
	// as a proxy that slows it.
	AllocatorForScheduler string
	// pluginArgs are the GPUPool plugin's, but the allocator's address.
	pluginArgs map[string]any

	unit            kube.Unit
	config          *poolConfig
	allocatorArgs   []string
	extender        string
	extenderTimeout time.Duration
	schedulerArgs   []string
	scheduler       *exec.Cmd
	webhook         *exec.Cmd
}

// startKubePool starts a control plane and gpupool on it, until the test
// ends; it skips the test where KUBE_BIN_DIR does not name the control
// plane's binaries.
func startKubePool(t testing.TB, ctx context.Context, o kubePoolOptions) *kubePool {
	t.Helper()
	bins := os.Getenv("KUBE_BIN_DIR")
	if bins == "" {
		t.Skip("KUBE_BIN_DIR is not set: `make e2e` builds the control plane (test/e2e/kube/build.sh) and sets it")
	}
	if o.Unit == "" {
		o.Unit = kube.UnitPercent
	}
	dir := t.TempDir()
	cp, err := e2ekube.Start(ctx, e2ekube.Options{BinDir: bins, Dir: dir, HPASyncPeriod: o.HPASyncPeriod})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	p := &kubePool{CP: cp, Logs: &syncBuffer{}, unit: o.Unit, schedulerArgs: o.SchedulerArgs, plugin: !o.Extender}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("control plane:\n%s\nallocator:\n%s\ngpupool:\n%s", cp.Logs(20), tail(p.Allocator.logs.String(), 20), tail(p.Logs.String(), 40))
		}
	})

	namespaces := map[string]int64{}
	for _, ns := range o.Namespaces {
		namespaces[ns] = noQuota
	}
	p.config = writePoolConfig(t, namespaces)
	for ns, policy := range o.IdlePolicies {
		p.config.setIdlePolicy(t, ns, policy)
	}
	// A port of its own, so that a restarted allocator serves where
	// gpupool-scheduler looks for it.
	p.allocatorArgs = []string{"--listen", "127.0.0.1:" + freePort(t), "--data-dir", t.TempDir(), "--config", p.config.Path, "--heartbeat-timeout", "1h"}
	p.allocatorArgs = append(p.allocatorArgs, o.AllocatorArgs...)
	if o.AllocatorReplicas > 1 {
		p.startReplicas(t, o.AllocatorReplicas, o.AllocatorArgs)
	} else {
		p.Allocator = startAllocator(t, p.allocatorArgs...)
		p.Replicas = []*allocatorProcess{p.Allocator}
	}
	p.Admin, p.Servers = p.allocatorClient(t, p.config.Admin), p.allocatorClient(t, p.config.Servers)

	certFile, keyFile := writeServingCert(t, cp, dir)
	webhook := "127.0.0.1:" + freePort(t)
	p.webhook = startBinary(t, p.Logs, "gpupool-webhook", regexp.MustCompile(`webhook serving`), "--listen", webhook, "--unit", string(o.Unit),
		"--tls-cert-file", certFile, "--tls-private-key-file", keyFile)
	registerWebhook(t, cp.Client, "gpupool", "https://"+webhook, cp.CA, o.Namespaces)
	for _, ns := range o.Namespaces {
		if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitForWebhook(t, cp.Client, ns)
	}

	// gpupool-scheduler's own namespace, where its replicas' election
	// Lease lives, as deployed.
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gpupool"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if o.Extender {
		p.extender = "127.0.0.1:" + freePort(t)
	} else {
		p.pluginArgs = map[string]any{"tokenFile": p.config.adminTokenFile(t), "unboundLeaseTimeout": pluginUnboundLeaseTimeout(o.SchedulerArgs)}
	}
	p.extenderTimeout = o.ExtenderTimeout
	p.startScheduler(t)
	p.startKubeScheduler(t, ctx)
	return p
}

// startKubeScheduler starts the kube-scheduler that places the pool's
// pods, or starts it again after killKubeScheduler: gpupool-kube-scheduler
// with the GPUPool plugin reaching the allocator (or AllocatorForScheduler),
// or the upstream one calling the extender.
func (p *kubePool) startKubeScheduler(t testing.TB, ctx context.Context) {
	t.Helper()
	o := e2ekube.SchedulerOptions{ExtenderURL: "http://" + p.extender, ExtenderTimeout: p.extenderTimeout}
	if p.plugin {
		args := maps.Clone(p.pluginArgs)
		args["allocator"] = p.schedulerAllocator()
		raw, err := json.Marshal(args)
		if err != nil {
			t.Fatal(err)
		}
		// The plugin's record of each call is at -v=2, as kube-scheduler logs each bind, read as JSON
		// (extenderCalls).
		o = e2ekube.SchedulerOptions{Plugin: &e2ekube.SchedulerPlugin{Binary: gpupoolKubeScheduler(t), Args: raw,
			Flags: []string{"--logging-format=json", "-v=2"}}}
	}
	if err := p.CP.StartScheduler(ctx, o); err != nil {
		t.Fatal(err)
	}
}

// killKubeScheduler kills the kube-scheduler that places the pool's pods
// with SIGKILL, mid-cycle.
func (p *kubePool) killKubeScheduler() {
	p.CP.KillScheduler()
}

// schedulingLog is where the lines of the pool's placement are: the
// plugin's in kube-scheduler's log, the extender's in gpupool-scheduler's.
func (p *kubePool) schedulingLog(t testing.TB) string {
	t.Helper()
	if !p.plugin {
		return p.Logs.String()
	}
	b, err := p.CP.Log("kube-scheduler")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// kubeSchedulerBuild is gpupool-kube-scheduler, built into binDir by the
// first test that needs it: a module of its own, which TestMain's build
// does not reach, and over a minute to link.
var kubeSchedulerBuild struct {
	once sync.Once
	err  error
}

func gpupoolKubeScheduler(t testing.TB) string {
	t.Helper()
	kubeSchedulerBuild.once.Do(func() {
		out, err := exec.Command("../../cmd/gpupool-kube-scheduler/build.sh", binDir).CombinedOutput()
		if err != nil {
			kubeSchedulerBuild.err = fmt.Errorf("building gpupool-kube-scheduler: %w\n%s", err, out)
		}
	})
	if kubeSchedulerBuild.err != nil {
		t.Fatal(kubeSchedulerBuild.err)
	}
	return filepath.Join(binDir, "gpupool-kube-scheduler")
}

// pluginUnboundLeaseTimeout is gpupool-scheduler's --unbound-lease-timeout
// among args, for the plugin; "" for its default.
func pluginUnboundLeaseTimeout(args []string) string {
	for i, a := range args {
		if a == "--unbound-lease-timeout" && i+1 < len(args) {
			return args[i+1]
		}
	}
	return "0s"
}

// startReplicas starts n allocators on a 3-member etcd and waits until
// one leads: it is p.Allocator.
func (p *kubePool) startReplicas(t testing.TB, n int, args []string) {
	t.Helper()
	endpoints := etcdtest.Endpoints(etcdtest.StartCluster(t, 3))
	for range n {
		p.Replicas = append(p.Replicas, startAllocator(t, append([]string{"--listen", "127.0.0.1:" + freePort(t), "--store", "etcd",
			"--etcd-endpoints", endpoints, "--etcd-session-ttl", "2s", "--config", p.config.Path, "--heartbeat-timeout", "1h"}, args...)...))
	}
	for deadline := time.Now().Add(servedAgainWithin); p.Allocator == nil; time.Sleep(50 * time.Millisecond) {
		for _, r := range p.Replicas {
			if isServing(r.URL) {
				p.Allocator = r
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no allocator replica leads")
		}
	}
}

// allocatorURLs are every replica's address, as the deployment's clients
// have them: a standby answers 503 and the client tries the next.
func (p *kubePool) allocatorURLs() []string {
	urls := make([]string, len(p.Replicas))
	for i, r := range p.Replicas {
		urls[i] = r.URL
	}
	return urls
}

func (p *kubePool) allocatorClient(t testing.TB, token string) *client.Client {
	t.Helper()
	c, err := client.New(p.allocatorURLs(), token)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startScheduler starts gpupool-scheduler as deployed (the lease
// controller, the allocator's admin token), with the extender in plain
// HTTP on loopback where the pool places through it, or starts it again,
// where it served, after killScheduler. It runs until t ends, hence no
// subtest restarts it for the tests after it.
func (p *kubePool) startScheduler(t testing.TB) {
	t.Helper()
	ready := regexp.MustCompile(`extender serving`)
	if p.plugin {
		ready = regexp.MustCompile(`the lease controller and /metrics only`)
	}
	p.scheduler = startBinary(t, p.Logs, "gpupool-scheduler", ready, p.schedulerFlags(t, p.extender, "127.0.0.1:0")...)
}

// schedulerAllocator is where gpupool-scheduler and the plugin find the
// allocator.
func (p *kubePool) schedulerAllocator() string {
	if p.AllocatorForScheduler != "" {
		return p.AllocatorForScheduler
	}
	return strings.Join(p.allocatorURLs(), ",")
}

// schedulerFlags are the flags of a gpupool-scheduler replica serving
// /metrics on metricsListen, and the extender on listen unless it is
// empty.
func (p *kubePool) schedulerFlags(t testing.TB, listen, metricsListen string) []string {
	args := []string{"--listen", listen, "--metrics-listen", metricsListen, "--allocator", p.schedulerAllocator(),
		"--token-file", p.config.adminTokenFile(t), "--kubeconfig", p.CP.Kubeconfig, "--unit", string(p.unit)}
	return append(args, p.schedulerArgs...)
}

// killScheduler kills gpupool-scheduler: the lease controller stops, and
// kube-scheduler's calls to the extender, if any, fail until
// startScheduler.
func (p *kubePool) killScheduler() {
	_ = p.scheduler.Process.Kill()
	_ = p.scheduler.Wait()
}

// restartAllocator starts the allocator again, once killed, on its port
// and data directory: it keeps the leases, servers and quotas it had.
func (p *kubePool) restartAllocator(t *testing.T) {
	t.Helper()
	p.Allocator = startAllocator(t, p.allocatorArgs...)
	p.Replicas = []*allocatorProcess{p.Allocator}
}

// addNodes adds a kwok node for each name, with labels, and registers each
// as a GPU server of gpus GPUs (none: a node that is no GPU server).
func (p *kubePool) addNodes(t *testing.T, ctx context.Context, gpus int, labels map[string]string, names ...string) {
	t.Helper()
	nodes := make([]e2ekube.Node, len(names))
	for i, name := range names {
		nodes[i] = e2ekube.Node{Name: name, Labels: labels, Capacity: map[string]string{"cpu": "96", "memory": "512Gi", "pods": "110"}}
	}
	if err := p.CP.AddKwokNodes(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	if gpus == 0 {
		return
	}
	for _, name := range names {
		register(t, p.Servers, gpuServer(name, gpus))
	}
}

// bfkPod is a pod as BFK's users write it, for the kwok nodes: amount
// GPUs, percent of each (0: whole GPUs), and 2 CPUs.
func bfkPod(name string, amount, percent int) *corev1.Pod {
	limits := corev1.ResourceList{kube.ResourceGPUAmount: *resource.NewQuantity(int64(amount), resource.DecimalSI)}
	if percent != 0 {
		limits[kube.ResourceGPUPercent] = *resource.NewQuantity(int64(percent), resource.DecimalSI)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "tf-training"}},
		Spec: corev1.PodSpec{
			Tolerations: []corev1.Toleration{e2ekube.KwokToleration},
			Containers: []corev1.Container{{Name: "trainer", Image: "trainer", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}, Limits: limits}}},
		},
	}
}

// leasesOf is the leases that pod holds, found by its UID.
func (p *kubePool) leasesOf(t *testing.T, ctx context.Context, pod *corev1.Pod) []api.Lease {
	t.Helper()
	return podLeases(t, ctx, p.Admin, pod)
}

// podLeases is the leases that pod holds, found by its UID, as admin reads
// them.
func podLeases(t *testing.T, ctx context.Context, admin *client.Client, pod *corev1.Pod) []api.Lease {
	t.Helper()
	leases, err := admin.Leases(ctx, client.LeaseFilter{Namespace: pod.Namespace, OwnerUID: string(pod.UID)})
	if err != nil {
		t.Fatal(err)
	}
	return leases
}

// waitFailedScheduling waits for a FailedScheduling event of pod whose
// message holds why.
func (p *kubePool) waitFailedScheduling(t *testing.T, ctx context.Context, pod *corev1.Pod, why string) {
	t.Helper()
	selector := fields.Set{"involvedObject.name": pod.Name, "reason": "FailedScheduling"}.String()
	var seen []string
	defer func() {
		if t.Failed() {
			t.Logf("FailedScheduling events of %s: %q", pod.Name, seen)
		}
	}()
	waitFor(t, func() bool {
		events, err := p.CP.Client.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: selector})
		seen = seen[:0]
		for _, e := range events.Items {
			seen = append(seen, e.Message)
		}
		return err == nil && strings.Contains(strings.Join(seen, "\n"), why)
	})
}

// writeServingCert writes, into dir, a serving certificate for loopback
// that the control plane's CA signs, the webhook's, and its key.
func writeServingCert(t testing.TB, cp *e2ekube.ControlPlane, dir string) (certFile, keyFile string) {
	t.Helper()
	cert, key, err := cp.ServingCert()
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "webhook.crt"), filepath.Join(dir, "webhook.key")
	for path, b := range map[string][]byte{certFile: cert, keyFile: key} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}

// waitBound waits until pod is bound to a node, and returns it then.
// kube-scheduler retries a pod it could not place after a backoff of up to
// 10 s, hence the longer wait.
func (p *kubePool) waitBound(t *testing.T, ctx context.Context, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	var bound *corev1.Pod
	waitForUpTo(t, 30*time.Second, func() bool {
		var err error
		bound, err = p.CP.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		return err == nil && bound.Spec.NodeName != ""
	})
	return bound
}
