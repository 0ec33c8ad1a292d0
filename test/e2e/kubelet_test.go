package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	watchtools "k8s.io/client-go/tools/watch"

	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
)

// gpuloadImage is the image of the test pods' workload, gpuload, which
// the tests build.
const (
	gpuloadImage   = "e2e.gpupool.local/gpuload:v1"
	gpuloadPackage = "github.com/gpupool/gpupool/test/e2e/gpuload"
)

// TestKubeletNode runs pods on a real node: containerd and a kubelet that
// joined the control plane as system:node:<name>, from an image built
// here. Each pod's container prints what it was given, which its log, read
// through the apiserver from the kubelet, shows. The kubelet restarted,
// the node is Ready again and the pods run on, the same containers.
func TestKubeletNode(t *testing.T) {
	ctx := t.Context()
	cp, node := startKubeletNode(ctx, t, "gpu-node-0")

	image, err := e2ekube.BuildProgramImage(ctx, t.TempDir(), gpuloadImage, gpuloadPackage)
	if err != nil {
		t.Fatal(err)
	}
	if err := node.ImportImages(ctx, image); err != nil {
		t.Fatal(err)
	}

	// One pod after another, so that each one's time to Running is its own.
	const pods = 5
	var names []string
	var toRunning []time.Duration
	for i := range pods {
		name := fmt.Sprintf("gpuload-%d", i)
		names = append(names, name)
		toRunning = append(toRunning, createRunning(ctx, t, cp.Client, gpuloadPod(name, node.Name)))
	}
	slices.Sort(toRunning)
	t.Logf("pod created to Running: p50 %v, max %v over %d pods", toRunning[pods/2].Round(time.Millisecond), toRunning[pods-1].Round(time.Millisecond), pods)

	for _, name := range names {
		waitLogLine(ctx, t, cp.Client, name, "GREETING=hello from "+name)
	}
	containers := containerIDs(ctx, t, cp.Client, "default", names)

	restart := time.Now()
	if err := node.RestartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("kubelet restarted, node Ready again in %v", time.Since(restart).Round(100*time.Millisecond))
	if after := containerIDs(ctx, t, cp.Client, "default", names); !slices.Equal(after, containers) {
		t.Errorf("containers after the kubelet's restart %v, want the same as before, %v", after, containers)
	}
	// The restarted kubelet serves the logs.
	waitLogLine(ctx, t, cp.Client, names[0], "GREETING=hello from "+names[0])
}

// gpuloadPod is a pod on node that runs gpuloadImage, with GREETING set.
func gpuloadPod(name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName: node,
			Containers: []corev1.Container{{
				Name:            "gpuload",
				Image:           gpuloadImage,
				ImagePullPolicy: corev1.PullNever,
				Env:             []corev1.EnvVar{{Name: "GREETING", Value: "hello from " + name}},
			}},
		},
	}
}

// createRunning creates pod and returns how long it took to be Running:
// from the call to create it to the event that says so.
func createRunning(ctx context.Context, t *testing.T, c kubernetes.Interface, pod *corev1.Pod) time.Duration {
	t.Helper()
	w, err := c.CoreV1().Pods(pod.Namespace).Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", pod.Name).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	start := time.Now()
	if _, err := c.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last *corev1.Pod
	_, err = watchtools.UntilWithoutRetry(waitCtx, w, func(e watch.Event) (bool, error) {
		if p, ok := e.Object.(*corev1.Pod); ok {
			last = p
		}
		return last != nil && last.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("pod %s not Running: %v; last seen: %+v", pod.Name, err, podStatus(last))
	}
	return time.Since(start)
}

// podStatus says where a pod is stuck, for a failure's message.
func podStatus(p *corev1.Pod) any {
	if p == nil {
		return "nothing"
	}
	return p.Status
}

// waitLogLine waits until the log of pod default/name holds line.
func waitLogLine(ctx context.Context, t *testing.T, c kubernetes.Interface, name, line string) {
	t.Helper()
	var log []byte
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		log, err = c.CoreV1().Pods("default").GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err == nil && slices.Contains(strings.Split(string(log), "\n"), line) {
			return
		}
	}
	t.Fatalf("log of pod %s lacks %q (error %v):\n%s", name, line, err, log)
}

// containerIDs returns the container of each pod ns/<name>, in the order
// of names, failing the test unless each pod is Running with its container
// never restarted.
func containerIDs(ctx context.Context, t *testing.T, c kubernetes.Interface, ns string, names []string) []string {
	t.Helper()
	var ids []string
	for _, name := range names {
		pod, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Status.Phase != corev1.PodRunning || len(pod.Status.ContainerStatuses) != 1 {
			t.Fatalf("pod %s: %+v, want Running with one container", name, pod.Status)
		}
		status := pod.Status.ContainerStatuses[0]
		if status.RestartCount != 0 || status.State.Running == nil {
			t.Errorf("pod %s's container: %d restarts, state %+v; want running, never restarted", name, status.RestartCount, status.State)
		}
		ids = append(ids, status.ContainerID)
	}
	return ids
}
