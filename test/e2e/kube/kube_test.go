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
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
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
		t.Errorf("server version %s, want %s (the version tools/kube pins)", version.GitVersion, want)
	}

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

// kubeVersion is the Kubernetes version build.sh builds: the one
// tools/kube/go.mod requires, found the way build.sh finds it.
func kubeVersion(t *testing.T) string {
	data, err := os.ReadFile("../../../tools/kube/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^require k8s\.io/kubernetes (v\S+)$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("tools/kube/go.mod has no line 'require k8s.io/kubernetes <version>'")
	}
	return string(m[1])
}
