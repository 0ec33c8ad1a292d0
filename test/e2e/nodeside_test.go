package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/metricstest"
	"github.com/gpupool/gpupool/internal/procstat"
	"github.com/gpupool/gpupool/kube"
	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
)

// nodePoolNode is the real node's name, its GPU server's in the pool.
const nodePoolNode = "gpu-node-0"

// nodePool is gpupool on a real control plane (kubePool) whose GPU server
// is a real node: a kubelet over containerd, and beside it, as the
// DaemonSets run them on a GPU host, gpupool-server with simulated GPUs
// that are device files, and gpupool-device-plugin. The test pods run
// gpuload, which holds the device files of the GPUs its container was
// given, so that the daemon finds its processes on them and their pod by
// their real cgroup.
type nodePool struct {
	*kubePool
	Node *e2ekube.KubeletNode
	// DaemonURL is gpupool-server's /metrics and /v1/usage.
	DaemonURL string
	// PluginLogs is gpupool-device-plugin's output.
	PluginLogs *syncBuffer

	gpus       int
	plugin     *exec.Cmd
	workload   string
	daemonArgs []string
	daemon     *exec.Cmd
}

// startNodePool starts the pool, its node with gpus simulated H100s, the
// daemon and the device plugin, and waits until the node offers the GPUs
// as bitfusion.io/gpu. The test is skipped where this machine cannot run
// a kubelet node.
func startNodePool(t *testing.T, ctx context.Context, o kubePoolOptions, gpus int) *nodePool {
	t.Helper()
	skipWithoutNode(t)
	// The daemon heart-beats every 500 ms: a stopped one is seen in 3 s.
	o.AllocatorArgs = append(o.AllocatorArgs, "--heartbeat-timeout", "3s")
	p := &nodePool{kubePool: startKubePool(t, ctx, o), PluginLogs: &syncBuffer{}, gpus: gpus}
	nodeOptions := e2ekube.NodeOptions{Name: nodePoolNode}
	if o.DRANode {
		nodeOptions.Containerd2Dir = filepath.Join(os.Getenv("KUBE_BIN_DIR"), "containerd2")
	}
	p.Node = startNode(ctx, t, p.CP, nodeOptions)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gpupool-device-plugin:\n%s", tail(p.PluginLogs.String(), 40))
		}
	})
	// The articles' nodeSelector.
	// A patch, not an update: the kubelet writes the node meanwhile.
	label := []byte(`{"metadata":{"labels":{"bitfusion-node":"enabled"}}}`)
	if _, err := p.CP.Client.CoreV1().Nodes().Patch(ctx, nodePoolNode, types.MergePatchType, label, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	image, err := e2ekube.BuildProgramImage(ctx, t.TempDir(), gpuloadImage, gpuloadPackage)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Node.ImportImages(ctx, image); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	devices := filepath.Join(dir, "devices")
	p.workload = filepath.Join(dir, "workload.yaml")
	p.setWork(t, "ml", "app=tf-training", 0)
	p.DaemonURL = "http://127.0.0.1:" + freePort(t)
	p.daemonArgs = []string{"--allocator", p.Allocator.URL, "--name", nodePoolNode, "--listen", strings.TrimPrefix(p.DaemonURL, "http://"),
		"--probe-listen", "127.0.0.1:0", "--simulate-gpus", fmt.Sprintf("H100:80Gi:%d", gpus), "--simulated-device-dir", devices,
		"--simulated-workload", p.workload, "--interval", "200ms", "--process-every", "1", "--heartbeat", "500ms"}
	p.startDaemon(t)
	pluginArgs := []string{"--node", nodePoolNode, "--allocator", p.Allocator.URL, "--token-file", p.config.serversTokenFile(t), "--unit", string(p.unit),
		"--kubeconfig", p.CP.Kubeconfig, "--pod-resources-socket", p.Node.PodResourcesSocket(), "--poll", "500ms",
		"--simulated-device-dir", devices}
	if o.DRANode {
		pluginArgs = append(pluginArgs, "--dra", "--kubelet-dir", p.Node.KubeletDir, "--cdi-dir", p.Node.CDIDir)
	}
	p.plugin = startBinary(t, p.PluginLogs, "gpupool-device-plugin", regexp.MustCompile(`registered with the kubelet`), pluginArgs...)
	p.waitAllocatable(t, ctx, p.devicesPerGPU()*int64(gpus))
	return p
}

// startDaemon starts the node's gpupool-server, or starts it again after
// killDaemon.
func (p *nodePool) startDaemon(t testing.TB) {
	p.daemon = startDaemon(t, p.Logs, p.config.Servers, p.daemonArgs...)
}

// killDaemon kills the node's gpupool-server, as a killed DaemonSet pod.
func (p *nodePool) killDaemon() {
	_ = p.daemon.Process.Kill()
	_ = p.daemon.Wait()
}

// setWork sets the work of the pods of namespace ns that selector matches,
// in GPUs kept busy, shared among their leases.
func (p *nodePool) setWork(t testing.TB, ns, selector string, gpus float64) {
	t.Helper()
	body := fmt.Sprintf("- {namespace: %s, selector: %s, gpus: %g}\n", ns, selector, gpus)
	if err := os.WriteFile(p.workload+".tmp", []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p.workload+".tmp", p.workload); err != nil {
		t.Fatal(err)
	}
}

// devicesPerGPU is how many bitfusion.io/gpu one GPU is in the unit.
func (p *nodePool) devicesPerGPU() int64 {
	if p.unit == kube.UnitGPUs {
		return 1
	}
	return 100
}

// waitAllocatable waits until the node's allocatable bitfusion.io/gpu is
// n, as the device plugin reported it to the kubelet.
func (p *nodePool) waitAllocatable(t testing.TB, ctx context.Context, n int64) {
	t.Helper()
	waitNodeAllocatable(t, ctx, p.CP.Client, nodePoolNode, n)
}

// waitNodeAllocatable waits until node's allocatable bitfusion.io/gpu is n:
// the healthy devices its device plugin reported to the kubelet.
func waitNodeAllocatable(t testing.TB, ctx context.Context, c kubernetes.Interface, name string, n int64) {
	t.Helper()
	var got resource.Quantity
	waitForUpTo(t, 30*time.Second, func() bool {
		node, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		got = node.Status.Allocatable[kube.ResourceGPU]
		return got.Value() == n
	})
	if t.Failed() {
		t.Fatalf("node %s: allocatable %s %s, want %d", name, kube.ResourceGPU, &got, n)
	}
}

// waitRunning waits until pod ns/name is Running and returns it.
func (p *nodePool) waitRunning(t testing.TB, ctx context.Context, ns, name string) *corev1.Pod {
	t.Helper()
	return waitPodRunning(t, ctx, p.CP.Client, ns, name)
}

// waitPodRunning waits until pod ns/name is Running and returns it.
func waitPodRunning(t testing.TB, ctx context.Context, c kubernetes.Interface, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	waitForUpTo(t, 60*time.Second, func() bool {
		var err error
		pod, err = c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && pod.Status.Phase == corev1.PodRunning
	})
	if t.Failed() {
		t.Fatalf("pod %s/%s not Running: %+v", ns, name, podStatus(pod))
	}
	return pod
}

// checkLeaseEnv checks that pod holds one lease, on the node, the one its
// annotation names, and that its container was given exactly that lease,
// as checkPodLeaseEnv does.
func (p *nodePool) checkLeaseEnv(t *testing.T, ctx context.Context, pod *corev1.Pod, percent int) api.Lease {
	t.Helper()
	return checkPodLeaseEnv(t, ctx, p.CP, p.Admin, nodePoolNode, pod, percent)
}

// checkPodLeaseEnv checks that pod holds one lease, on node, the one its
// annotation names, and that its container was given exactly that lease:
// its log (gpuload prints its environment) holds the lease's GPU UUIDs in
// NVIDIA_VISIBLE_DEVICES, its ID, and for a fraction MPS's limits. admin
// reads the allocator's leases. It returns the lease.
func checkPodLeaseEnv(t *testing.T, ctx context.Context, cp *e2ekube.ControlPlane, admin *client.Client, node string, pod *corev1.Pod, percent int) api.Lease {
	t.Helper()
	leases := podLeases(t, ctx, admin, pod)
	if len(leases) != 1 {
		t.Fatalf("pod %s holds %d leases, want 1: %+v", pod.Name, len(leases), leases)
	}
	lease := leases[0]
	if lease.Server != node || pod.Annotations[kube.AnnotationLease] != lease.ID {
		t.Errorf("pod %s: lease %s on %s, annotation %q; want its lease on %s", pod.Name, lease.ID, lease.Server, pod.Annotations[kube.AnnotationLease], node)
	}
	var uuids []string
	for _, g := range lease.GPUs {
		uuids = append(uuids, g.UUID)
	}
	want := map[string]string{
		"NVIDIA_VISIBLE_DEVICES": strings.Join(uuids, ","),
		"GPUPOOL_LEASE_ID":       lease.ID,
	}
	if percent < 100 {
		want["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = strconv.Itoa(percent)
	}
	// Every variable of the lease's environment, as gpupool run gives it.
	maps.Copy(want, api.LeaseEnv(lease.Core()))
	env := containerEnv(t, ctx, cp, pod)
	for k, v := range want {
		if env[k] != v {
			t.Errorf("pod %s's container: %s=%q, want %q (lease %s)", pod.Name, k, env[k], v, lease.ID)
		}
	}
	if mps, ok := env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]; percent == 100 && ok {
		t.Errorf("pod %s's container, of whole GPUs, has CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%s", pod.Name, mps)
	}
	return lease
}

// containerEnv is the environment pod's gpuload printed, read from its log
// through the apiserver once gpuload holds its GPUs.
func containerEnv(t testing.TB, ctx context.Context, cp *e2ekube.ControlPlane, pod *corev1.Pod) map[string]string {
	t.Helper()
	var log string
	waitForUpTo(t, 20*time.Second, func() bool {
		b, err := cp.Client.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		log = string(b)
		return err == nil && strings.Contains(log, "gpuload: holding")
	})
	if t.Failed() {
		t.Fatalf("pod %s holds no GPU; its log:\n%s", pod.Name, log)
	}
	env := map[string]string{}
	for line := range strings.SplitSeq(log, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.Contains(k, " ") {
			env[k] = v
		}
	}
	return env
}

// bfkDeployment is the tf-training Deployment as BFK's users write it:
// gpu-amount 1 and gpu-percent, BFK's annotations, gpuload as its image.
func bfkDeployment(replicas int32, percent int) *appsv1.Deployment {
	dep := deployment("tf-training", replicas, corev1.PodSpec{
		TerminationGracePeriodSeconds: ptr.To[int64](5),
		Containers: []corev1.Container{{Name: "trainer", Image: gpuloadImage, ImagePullPolicy: corev1.PullIfNotPresent,
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				kube.ResourceGPUAmount:  resource.MustParse("1"),
				kube.ResourceGPUPercent: *resource.NewQuantity(int64(percent), resource.DecimalSI),
			}}}},
	})
	dep.Spec.Template.Annotations = map[string]string{
		kube.AnnotationAutoManagement: "all", kube.AnnotationClientOS: "ubuntu20", kube.AnnotationClientVersion: "401"}
	return dep
}

// deploymentPods waits until Deployment ns/name has n pods, all Running,
// and returns them.
func (p *nodePool) deploymentPods(t testing.TB, ctx context.Context, ns, selector string, n int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	waitForUpTo(t, 90*time.Second, func() bool {
		list, err := p.CP.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false
		}
		pods = pods[:0]
		for _, pod := range list.Items {
			if pod.DeletionTimestamp == nil && pod.Status.Phase == corev1.PodRunning {
				pods = append(pods, pod)
			}
		}
		return len(pods) == n && len(list.Items) == n
	})
	if t.Failed() {
		t.Fatalf("%s in %s: %d pods Running, want %d", selector, ns, len(pods), n)
	}
	return pods
}

// leaseSeries is the value of the daemon's series name for lease, with the
// pod's name and app label: -1 when there is none.
func (p *nodePool) leaseSeries(t *testing.T, name string, lease api.Lease, app string) float64 {
	t.Helper()
	re := regexp.MustCompile(fmt.Sprintf(`(?m)^%s\{([^}]*)\} (\S+)$`, name))
	for _, m := range re.FindAllStringSubmatch(metricsOf(t, p.DaemonURL), -1) {
		labels := m[1]
		if strings.Contains(labels, `lease="`+lease.ID+`"`) && strings.Contains(labels, `pod="`+lease.Owner.Pod+`"`) &&
			strings.Contains(labels, `label_app="`+app+`"`) {
			v, _ := strconv.ParseFloat(m[2], 64)
			return v
		}
	}
	return -1
}

// TestNodeSide runs BFK's Deployment, unchanged but for its image, on a
// real node of the pool: its pods are admitted, placed on the node by the
// pool, and started by the kubelet with the device plugin's answer, each
// container given exactly its lease's GPUs and MPS limits; the daemon sees
// their processes on those GPUs and names their pods from their real
// cgroups. Then 20 pods one after another, timed from creation to Running
// with their lease and environment, and from deletion to their lease's
// end. The kubelet restarted, the device plugin registers again and the
// running pods keep their leases.
func TestNodeSide(t *testing.T) {
	ctx := t.Context()
	const ns = "ml"
	p := startNodePool(t, ctx, kubePoolOptions{Namespaces: []string{ns}}, 4)
	c := p.CP.Client

	if _, err := c.AppsV1().Deployments(ns).Create(ctx, bfkDeployment(2, 50), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := p.deploymentPods(t, ctx, ns, "app=tf-training", 2)
	leases := map[string]api.Lease{}
	for i := range pods {
		leases[pods[i].Name] = p.checkLeaseEnv(t, ctx, &pods[i], 50)
	}
	env := containerEnv(t, ctx, p.CP, &pods[0])
	t.Logf("pod %s's container: NVIDIA_VISIBLE_DEVICES=%s GPUPOOL_LEASE_ID=%s CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%s CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%s",
		pods[0].Name, env["NVIDIA_VISIBLE_DEVICES"], env["GPUPOOL_LEASE_ID"], env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])

	// The work of tf-training (one GPU busy) runs in its pods' processes:
	// each lease is busy and its series name its pod and app.
	p.setWork(t, ns, "app=tf-training", 1)
	for name, lease := range leases {
		waitForUpTo(t, 20*time.Second, func() bool { return p.leaseSeries(t, "bitfusion_lease_processes", lease, "tf-training") == 1 })
		waitForUpTo(t, 20*time.Second, func() bool { return p.leaseSeries(t, "bitfusion_lease_gpu_utilization", lease, "tf-training") > 0.5 })
		if t.Failed() {
			t.Fatalf("no busy series of pod %s's lease %s with its pod and app:\n%s", name, lease.ID, grep(metricsOf(t, p.DaemonURL), "bitfusion_lease_"))
		}
	}

	// 20 pods one after another, each of a tenth of a GPU.
	const timed = 20
	var toRunning, toReleased []time.Duration
	var started []*corev1.Pod
	for i := range timed {
		pod := bfkPod(fmt.Sprintf("timed-%d", i), 1, 10)
		pod.Namespace = ns
		pod.Spec.Tolerations = nil
		pod.Spec.Containers[0].Image, pod.Spec.Containers[0].ImagePullPolicy = gpuloadImage, corev1.PullIfNotPresent
		pod.Spec.Containers[0].Resources.Requests = nil
		pod.Labels = map[string]string{"app": "timed"}
		pod.Spec.TerminationGracePeriodSeconds = ptr.To[int64](5)
		start := time.Now()
		if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		running := p.waitRunning(t, ctx, ns, pod.Name)
		p.checkLeaseEnv(t, ctx, running, 10)
		toRunning = append(toRunning, time.Since(start))
		started = append(started, running)
	}
	for _, pod := range started {
		start := time.Now()
		if err := c.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool {
			l, err := p.Admin.Leases(ctx, client.LeaseFilter{Namespace: ns, OwnerUID: string(pod.UID)})
			return err == nil && len(l) == 0
		})
		toReleased = append(toReleased, time.Since(start))
	}
	t.Logf("pod created to Running with its lease and GPU environment: %s over %d pods", quantiles(toRunning), timed)
	t.Logf("pod deleted to its lease ended: %s over %d pods", quantiles(toReleased), timed)
	plugin, err := procstat.Read(p.plugin.Process.Pid)
	if err != nil {
		t.Fatalf("gpupool-device-plugin: %v", err)
	}
	t.Logf("gpupool-device-plugin after %d pods: peak RSS %.1f MiB, CPU %v", timed+len(pods), float64(plugin.PeakRSS)/(1<<20), plugin.CPU)
	// Their shares are free again: only tf-training's two halves are held.
	server, err := p.Admin.Server(ctx, nodePoolNode)
	if err != nil {
		t.Fatal(err)
	}
	var held float64
	for _, g := range server.GPUs {
		held += g.AllocatedPercent
	}
	if held != 100 {
		t.Errorf("node's GPUs hold %g%% once the timed pods are gone, want 100 (tf-training's two halves)", held)
	}

	// The kubelet restarted: the device plugin registers again, the node
	// offers its GPUs again, and tf-training's pods run on with their
	// leases.
	containers := containerIDs(ctx, t, c, ns, slices.Sorted(maps.Keys(leases)))
	registered := strings.Count(p.PluginLogs.String(), "registered with the kubelet")
	restart := time.Now()
	if err := p.Node.RestartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	waitForUpTo(t, 30*time.Second, func() bool {
		return strings.Count(p.PluginLogs.String(), "registered with the kubelet") > registered
	})
	p.waitAllocatable(t, ctx, p.devicesPerGPU()*int64(p.gpus))
	t.Logf("kubelet restarted: the device plugin registered again and the node offers %d GPUs again in %v", p.gpus, time.Since(restart).Round(100*time.Millisecond))
	if after := containerIDs(ctx, t, c, ns, slices.Sorted(maps.Keys(leases))); !slices.Equal(after, containers) {
		t.Errorf("tf-training's containers after the kubelet's restart %v, want the same as before, %v", after, containers)
	}
	for i := range pods {
		if got := p.leasesOf(t, ctx, &pods[i]); len(got) != 1 || got[0].ID != leases[pods[i].Name].ID {
			t.Errorf("pod %s after the kubelet's restart holds %+v, want its lease %s", pods[i].Name, got, leases[pods[i].Name].ID)
		}
	}
}

// quantiles says the p50 and p99 (the slowest, under 100 samples) of ds.
func quantiles(ds []time.Duration) string {
	s := slices.Sorted(slices.Values(ds))
	return fmt.Sprintf("p50 %v, p99 %v", s[len(s)/2].Round(time.Millisecond), s[min(len(s)-1, len(s)*99/100)].Round(time.Millisecond))
}

// TestNodeSideArticlesDeployment runs the Bitfusion-on-Kubernetes
// articles' Deployment, unchanged but for its image, in their unit
// (bitfusion.io/gpu: 2 is two GPUs): each pod starts on the labelled node
// with a lease of two whole GPUs, which its container is given, and no MPS
// limit.
func TestNodeSideArticlesDeployment(t *testing.T) {
	ctx := t.Context()
	const ns = "training"
	p := startNodePool(t, ctx, kubePoolOptions{Unit: kube.UnitGPUs, Namespaces: []string{ns}}, 4)
	dep := deployment("resnet50-bf", 2, corev1.PodSpec{
		NodeSelector: map[string]string{"bitfusion-node": "enabled"},
		Containers: []corev1.Container{{Name: "tensorflow", Image: gpuloadImage, ImagePullPolicy: corev1.PullIfNotPresent,
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{kube.ResourceGPU: resource.MustParse("2")}}}},
	})
	if _, err := p.CP.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := p.deploymentPods(t, ctx, ns, "app=resnet50-bf", 2)
	gpus := map[string]bool{}
	for i := range pods {
		lease := p.checkLeaseEnv(t, ctx, &pods[i], 100)
		for _, g := range lease.GPUs {
			if g.Percent != 100 || gpus[g.UUID] {
				t.Errorf("pod %s's lease %s: GPU %s at %g%%, want a whole GPU of its own", pods[i].Name, lease.ID, g.UUID, g.Percent)
			}
			gpus[g.UUID] = true
		}
	}
	if len(gpus) != 4 {
		t.Errorf("the two pods hold %d GPUs, want 4", len(gpus))
	}
}

// TestNodeSideHPA closes the loop on a real node: tf-training, BFK's
// Deployment, scales on bitfusion_gpu_utilization as the adapter reads it
// from the daemon that sees its pods' processes; the real HPA scales it out
// and in, each new pod started with a lease of its own on the node the
// pool chose, each removed pod's lease ended. The daemon killed, the pool
// takes the node's GPUs out of placement, the device plugin reports them
// unhealthy to the kubelet, Prometheus fires GPUPoolServerDown with the
// shipped rules, and the HPA holds; the daemon back, all return.
func TestNodeSideHPA(t *testing.T) {
	ctx := t.Context()
	const sync = 2 * time.Second
	p := startNodePool(t, ctx, kubePoolOptions{Namespaces: []string{hpaNamespace}, HPASyncPeriod: sync}, 4)
	c := p.CP.Client
	prom := metricstest.StartPrometheusWith(t, metricstest.PrometheusConfig{Interval: time.Second, RuleFiles: []string{shortFor(t)}},
		p.Allocator.URL, p.DaemonURL)
	startAPIServiceAdapter(t, p.CP, p.Logs, p.Allocator.URL, p.config.adminTokenFile(t), "", 0)

	const low, high = 0.3, 1.5
	p.setWork(t, hpaNamespace, "app="+hpaApp, low)
	if _, err := c.AppsV1().Deployments(hpaNamespace).Create(ctx, bfkDeployment(1, replicaPercent), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AutoscalingV2().HorizontalPodAutoscalers(hpaNamespace).Create(ctx, tfTrainingHPA(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReplicas(t, c, int32(expectedReplicas(low)), 90*time.Second)
	// One replica holds half a GPU and does 0.3 GPUs' work: 60% of its
	// share, as the adapter answers the HPA through kube-apiserver.
	get, err := newRawGetter(p.CP.Config)
	if err != nil {
		t.Fatal(err)
	}
	var raw []byte
	waitForUpTo(t, 20*time.Second, func() bool {
		raw, err = get(ctx)
		v, ok := externalMetricValue(raw)
		return err == nil && ok && math.Abs(v-0.6) < 0.1
	})
	if t.Failed() {
		t.Fatalf("bitfusion_gpu_utilization{app=%s} is not 0.6 with one replica at %g GPUs' work: %v %s", hpaApp, low, err, raw)
	}

	p.setWork(t, hpaNamespace, "app="+hpaApp, high)
	took := waitReplicas(t, c, int32(expectedReplicas(high)), 120*time.Second)
	t.Logf("work %g GPUs: the HPA wanted %d replicas %v after the step", high, expectedReplicas(high), took.Round(100*time.Millisecond))
	pods := p.deploymentPods(t, ctx, hpaNamespace, "app="+hpaApp, expectedReplicas(high))
	for i := range pods {
		p.checkLeaseEnv(t, ctx, &pods[i], replicaPercent)
	}

	p.setWork(t, hpaNamespace, "app="+hpaApp, low)
	took = waitReplicas(t, c, int32(expectedReplicas(low)), 120*time.Second)
	t.Logf("work %g GPUs: the HPA wanted %d replica %v after the step", low, expectedReplicas(low), took.Round(100*time.Millisecond))
	waitForUpTo(t, 30*time.Second, func() bool {
		l, err := p.Admin.Leases(ctx, client.LeaseFilter{Namespace: hpaNamespace, Selector: "app=" + hpaApp})
		return err == nil && len(l) == expectedReplicas(low)
	})
	if t.Failed() {
		t.Fatalf("the removed replicas' leases did not end")
	}

	// The daemon's pod killed: no heartbeat, no reading.
	killed := time.Now()
	p.killDaemon()
	p.setWork(t, hpaNamespace, "app="+hpaApp, high)
	waitFor(t, func() bool {
		s, err := p.Admin.Server(ctx, nodePoolNode)
		return err == nil && !s.Schedulable
	})
	p.waitAllocatable(t, ctx, 0)
	t.Logf("daemon killed: the pool stopped placing on %s and the kubelet counts its GPUs unhealthy after %v", nodePoolNode, time.Since(killed).Round(100*time.Millisecond))
	waitHPAHolds(t, c, int32(expectedReplicas(low)), sync)
	waitForUpTo(t, 90*time.Second, func() bool { return alertFiring(t, prom, "GPUPoolServerDown", nodePoolNode) })
	if t.Failed() {
		t.Fatalf("GPUPoolServerDown did not fire for %s", nodePoolNode)
	}
	t.Logf("GPUPoolServerDown firing %v after the kill (30 s without heartbeat, for shortened to 5 s)", time.Since(killed).Round(time.Second))
	if h := tfTrainingHPAStatus(t, c); h.Status.CurrentReplicas != int32(expectedReplicas(low)) {
		t.Errorf("while the daemon was down the HPA moved to %d replicas, want it to hold %d", h.Status.CurrentReplicas, expectedReplicas(low))
	}

	back := time.Now()
	p.startDaemon(t)
	p.waitAllocatable(t, ctx, p.devicesPerGPU()*int64(p.gpus))
	waitReplicas(t, c, int32(expectedReplicas(high)), 120*time.Second)
	t.Logf("daemon back: the node's GPUs healthy again and %d replicas Ready %v after its start", expectedReplicas(high), time.Since(back).Round(100*time.Millisecond))
}

// externalMetricValue is the one value of an external metric list, as
// kube-apiserver answers it.
func externalMetricValue(raw []byte) (float64, bool) {
	var list struct {
		Items []struct {
			Value resource.Quantity `json:"value"`
		} `json:"items"`
	}
	if json.Unmarshal(raw, &list) != nil || len(list.Items) != 1 {
		return 0, false
	}
	return list.Items[0].Value.AsApproximateFloat64(), true
}

// alertFiring reports whether the Prometheus at url has alert name firing
// for server.
func alertFiring(t testing.TB, url, name, server string) bool {
	t.Helper()
	resp, err := http.Get(url + "/api/v1/alerts")
	if err != nil {
		return false
	}
	defer func() { _ = resp.Body.Close() }()
	var body struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	for _, a := range body.Data.Alerts {
		if a.Labels["alertname"] == name && a.Labels["server"] == server && a.State == "firing" {
			return true
		}
	}
	return false
}
