package kube

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
)

// BenchmarkKwokScale measures what the scale test asks of kwok: adding the
// 1,213 nodes of the OpenB cluster, and then pods that name their node
// going Running, which is kwok's part of each placement. It reports nodes
// added per second and pods Running per second, with pods created as fast
// as the apiserver takes them.
func BenchmarkKwokScale(b *testing.B) {
	const nodeCount, podCount = 1213, 3000
	binDir := os.Getenv("KUBE_BIN_DIR")
	if binDir == "" {
		b.Skip("KUBE_BIN_DIR is not set: run test/e2e/kube/build.sh and set it to the directory it prints")
	}
	ctx := b.Context()
	for b.Loop() {
		cp, err := Start(ctx, Options{BinDir: binDir, Dir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		nodes := make([]Node, nodeCount)
		for i := range nodes {
			nodes[i] = Node{
				Name:     fmt.Sprintf("node-%04d", i),
				Capacity: map[string]string{"cpu": "96", "memory": "512Gi", "pods": "110"},
			}
		}
		start := time.Now()
		if err := cp.AddKwokNodes(ctx, nodes); err != nil {
			cp.Stop()
			b.Fatal(err)
		}
		b.ReportMetric(nodeCount/time.Since(start).Seconds(), "nodes/s")

		factory := informers.NewSharedInformerFactory(cp.Client, 0)
		pods := factory.Core().V1().Pods()
		pods.Informer() // registers it for Start
		stop := make(chan struct{})
		factory.Start(stop)
		factory.WaitForCacheSync(stop)
		running := func() int {
			all, _ := pods.Lister().List(labels.Everything())
			n := 0
			for _, pod := range all {
				if pod.Status.Phase == corev1.PodRunning {
					n++
				}
			}
			return n
		}

		start = time.Now()
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(concurrentCreates)
		for i := range podCount {
			g.Go(func() error {
				pod := kwokPod(fmt.Sprintf("pod-%04d", i), nil)
				pod.Spec.NodeName = nodes[i%nodeCount].Name
				_, err := cp.Client.CoreV1().Pods("default").Create(gctx, pod, metav1.CreateOptions{})
				return err
			})
		}
		err = g.Wait()
		created := time.Since(start)
		if err == nil {
			err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
				return running() == podCount, nil
			})
		}
		allRunning := time.Since(start)
		close(stop)
		factory.Shutdown()
		cp.Stop()
		if err != nil {
			b.Fatalf("%d of %d pods Running: %v", running(), podCount, err)
		}
		b.ReportMetric(podCount/created.Seconds(), "pods-created/s")
		b.ReportMetric(podCount/allRunning.Seconds(), "pods-running/s")
	}
}
