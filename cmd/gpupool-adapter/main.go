// Command gpupool-adapter serves the GPU pool's signals to the
// HorizontalPodAutoscaler as external metrics (external.metrics.k8s.io;
// app, adapter).
package main

import "github.com/gpupool/gpupool/cmd/gpupool-adapter/app"

func main() { app.Command().Main() }
