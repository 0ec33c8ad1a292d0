// The test starts a real control plane, so it needs the binaries build.sh
// builds: it runs when KUBE_BIN_DIR names their directory, as the
// Makefile's e2e target sets it to build.sh's output, and skips otherwise:
//
//	KUBE_BIN_DIR=$(test/e2e/kube/build.sh | tail -1) go test ./test/e2e/kube

package kube

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"k8s.io/utils/ptr"

	gpukube "github.com/gpupool/gpupool/kube"
)

func TestControlPlane(t *testing.T) {
	binDir := os.Getenv("KUBE_BIN_DIR")
	if binDir == "" {
		t.Skip("KUBE_BIN_DIR is not set: run test/e2e/kube/build.sh and set it to the directory it prints")
	}
	ctx := t.Context()
	start := time.Now()
	cp, err := Start(ctx, Options{BinDir: binDir, Dir: t.TempDir(), HPASyncPeriod: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(cp.Logs(30))
		}
	})
	t.Logf("control plane up in %v at %s", time.Since(start).Round(100*time.Millisecond), cp.URL)

	version, err := cp.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if want := kubeVersion(t); version.GitVersion != want {
		t.Errorf("server version %s, want %s (the version cmd/gpupool-kube-scheduler pins)", version.GitVersion, want)
	}

	t.Run("PID", func(t *testing.T) {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cp.PID("kube-apiserver")))
		if err != nil || strings.TrimSpace(string(comm)) != "kube-apiserver" {
			t.Errorf("PID(kube-apiserver) names %q (%v), want the running kube-apiserver", comm, err)
		}
		if pid := cp.PID("kube-proxy"); pid != 0 {
			t.Errorf("PID(kube-proxy) = %d, want 0: no such component runs", pid)
		}
	})

	t.Run("kwok runs pods", func(t *testing.T) {
		const node = "gpu-node-0"
		err := cp.AddKwokNode(ctx, node, map[string]string{
			"nvidia.com/gpu": "8", "cpu": "32", "memory": "256Gi", "pods": "110",
		})
		if err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{"app": "workload"}
		deployment := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "workload"},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](2),
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{
						NodeName:    node,
						Tolerations: []corev1.Toleration{KwokToleration},
						Containers:  []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}},
					},
				},
			},
		}
		if _, err := cp.Client.AppsV1().Deployments("default").Create(ctx, deployment, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var ready int
		err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
			pods, err := cp.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=workload"})
			if err != nil {
				return false, err
			}
			ready = 0
			for _, pod := range pods.Items {
				for _, cond := range pod.Status.Conditions {
					if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
						ready++
					}
				}
			}
			return ready == 2, nil
		})
		if err != nil {
			t.Fatalf("%d of 2 pods Ready: %v", ready, err)
		}
	})

	// The pool's nodes: the scheduler and the training operator's tests
	// place pods on them.
	pool := make([]Node, 8)
	poolNames := make([]string, len(pool))
	for i := range pool {
		poolNames[i] = fmt.Sprintf("pool-node-%d", i)
		pool[i] = Node{
			Name:     poolNames[i],
			Capacity: map[string]string{"cpu": "16", "memory": "64Gi", "pods": "110"},
			Labels:   map[string]string{"bitfusion-node": "enabled"},
		}
	}
	t.Run("kwok nodes", func(t *testing.T) {
		if err := cp.AddKwokNodes(ctx, pool); err != nil {
			t.Fatal(err)
		}
		nodes, err := cp.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "bitfusion-node=enabled,type=kwok"})
		if err != nil {
			t.Fatal(err)
		}
		var ready []string
		for _, node := range nodes.Items {
			if nodeSchedulable(&node) && node.Status.Allocatable.Cpu().Cmp(resource.MustParse("16")) == 0 {
				ready = append(ready, node.Name)
			}
		}
		slices.Sort(ready)
		if !slices.Equal(ready, poolNames) {
			t.Errorf("Ready nodes without a taint but kwok's, labelled bitfusion-node=enabled with 16 CPUs: %v, want %v", ready, poolNames)
		}
	})

	t.Run("kube-scheduler", func(t *testing.T) {
		// The extender places GPU pods on a node of its choice, not one
		// that kube-scheduler's scoring would pick.
		const chosen = "pool-node-5"
		var (
			mu       sync.Mutex
			filtered []string // the pods the extender was asked about
			bound    []string // and those it bound
		)
		extender := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/filter":
				var args extenderv1.ExtenderArgs
				if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				mu.Lock()
				filtered = append(filtered, args.Pod.Name)
				mu.Unlock()
				result := extenderv1.ExtenderFilterResult{Error: fmt.Sprintf("%s is not among the feasible nodes %v", chosen, args.NodeNames)}
				if args.NodeNames != nil && slices.Contains(*args.NodeNames, chosen) {
					result = extenderv1.ExtenderFilterResult{NodeNames: &[]string{chosen}}
				}
				_ = json.NewEncoder(w).Encode(result)
			case "/bind":
				var args extenderv1.ExtenderBindingArgs
				if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				binding := &corev1.Binding{
					ObjectMeta: metav1.ObjectMeta{Name: args.PodName, Namespace: args.PodNamespace, UID: args.PodUID},
					Target:     corev1.ObjectReference{Kind: "Node", Name: args.Node},
				}
				var result extenderv1.ExtenderBindingResult
				if err := cp.Client.CoreV1().Pods(args.PodNamespace).Bind(r.Context(), binding, metav1.CreateOptions{}); err != nil {
					result.Error = err.Error()
				}
				mu.Lock()
				bound = append(bound, args.PodName)
				mu.Unlock()
				_ = json.NewEncoder(w).Encode(result)
			default:
				http.NotFound(w, r)
			}
		}))
		certPEM, keyPEM, err := cp.ServingCert()
		if err != nil {
			t.Fatal(err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		extender.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
		extender.StartTLS()
		t.Cleanup(extender.Close)
		if err := cp.StartScheduler(ctx, SchedulerOptions{ExtenderURL: extender.URL}); err != nil {
			t.Fatal(err)
		}

		plain := kwokPod("plain", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")})
		gpu := kwokPod("gpu", corev1.ResourceList{gpukube.ResourceGPU: resource.MustParse("50")})
		gpu.Spec.SchedulerName = gpukube.SchedulerName
		for _, pod := range []*corev1.Pod{plain, gpu} {
			if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		// Running: kube-scheduler bound them, as no pod names its node.
		nodes := waitPodsRunning(ctx, t, cp, "default", plain.Name, gpu.Name)
		if nodes[gpu.Name] != chosen {
			t.Errorf("pod gpu runs on %q, want %s, the extender's choice", nodes[gpu.Name], chosen)
		}
		// Its metrics, which BenchmarkKubeScale reads, count the two.
		metrics, err := cp.SchedulerMetrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^scheduler_schedule_attempts_total\{profile="` + gpukube.SchedulerName + `",result="scheduled"\} 1$`).Match(metrics) {
			t.Errorf("kube-scheduler's metrics count no attempt of %s that scheduled a pod", gpukube.SchedulerName)
		}
		mu.Lock()
		defer mu.Unlock()
		if filtered = slices.Compact(filtered); len(filtered) != 1 || filtered[0] != gpu.Name {
			t.Errorf("the extender filtered pods %v, want %s alone: kube-scheduler asks it about pods that ask for %s", filtered, gpu.Name, gpukube.ResourceGPU)
		}
		if !slices.Equal(bound, []string{gpu.Name}) {
			t.Errorf("the extender bound pods %v, want %s alone", bound, gpu.Name)
		}
	})

	t.Run("training operator", func(t *testing.T) {
		if err := cp.StartTrainingOperator(ctx); err != nil {
			t.Fatal(err)
		}
		tfJobs := cp.dynamic.Resource(TFJobs).Namespace("default")
		// The operator's webhook refuses a TFJob without a container
		// named tensorflow.
		_, err := tfJobs.Create(ctx, tfJob("unnamed", "main"), metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), "must have at least one container with name tensorflow") {
			t.Errorf("creating a TFJob without a container named tensorflow: %v, want the operator's webhook to deny it", err)
		}
		if _, err := tfJobs.Create(ctx, tfJob("smoke", "tensorflow"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The operator names its pods <job>-<replica type>-<index>; the
		// default scheduler places them.
		waitPodsRunning(ctx, t, cp, "default", "smoke-worker-0", "smoke-worker-1")
	})

	t.Run("aggregated API", func(t *testing.T) {
		const groupVersion = "external.metrics.k8s.io/v1beta1"
		certPEM, keyPEM, err := cp.ServingCert("gpupool-adapter.gpupool.svc")
		if err != nil {
			t.Fatal(err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		discovery := metav1.APIResourceList{
			TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
			GroupVersion: groupVersion,
			APIResources: []metav1.APIResource{{
				Name: "gpu_pool_util", Namespaced: true, Kind: "ExternalMetricValueList", Verbs: []string{"get"},
			}},
		}
		backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/apis/"+groupVersion {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(discovery)
		}))
		backend.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
		backend.StartTLS()
		t.Cleanup(backend.Close)

		port := backend.Listener.Addr().(*net.TCPAddr).Port
		if err := cp.RegisterAPIService(ctx, "external.metrics.k8s.io", "v1beta1", "gpupool", "gpupool-adapter", int32(port)); err != nil {
			t.Fatal(err)
		}
		if err := cp.WaitAPIServiceAvailable(ctx, "v1beta1.external.metrics.k8s.io"); err != nil {
			t.Fatal(err)
		}
		// The apiserver proxies to the backend.
		resources, err := cp.Client.Discovery().ServerResourcesForGroupVersion(groupVersion)
		if err != nil {
			t.Fatal(err)
		}
		if len(resources.APIResources) != 1 || resources.APIResources[0].Name != "gpu_pool_util" {
			t.Errorf("discovery of %s through the apiserver: %+v", groupVersion, resources.APIResources)
		}
	})
}

// kwokPod is a pod for kwok's nodes, asking for resources, for
// kube-scheduler to place.
func kwokPod(name string, resources corev1.ResourceList) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			Tolerations: []corev1.Toleration{KwokToleration},
			Containers: []corev1.Container{{
				Name:      "main",
				Image:     "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Requests: resources, Limits: resources},
			}},
		},
	}
}

// waitPodsRunning waits until the pods namespace/names exist and run, and returns
// the node each runs on.
func waitPodsRunning(ctx context.Context, t *testing.T, cp *ControlPlane, namespace string, names ...string) map[string]string {
	t.Helper()
	nodes := map[string]string{}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, name := range names {
			pod, err := cp.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			if pod.Status.Phase != corev1.PodRunning {
				return false, nil
			}
			nodes[name] = pod.Spec.NodeName
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("pods %v Running: %v (running: %v)", names, err, nodes)
	}
	return nodes
}

// kubeVersion is the Kubernetes version build.sh builds: the one
// cmd/gpupool-kube-scheduler/go.mod requires, found the way build.sh finds it.
func kubeVersion(t *testing.T) string {
	data, err := os.ReadFile("../../../cmd/gpupool-kube-scheduler/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^require k8s\.io/kubernetes (v\S+)$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("cmd/gpupool-kube-scheduler/go.mod has no line 'require k8s.io/kubernetes <version>'")
	}
	return string(m[1])
}
