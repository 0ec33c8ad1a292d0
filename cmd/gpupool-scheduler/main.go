// Command gpupool-scheduler places pods through the GPU pool: it serves
// kube-scheduler's extender and runs the controller that ends each pod's
// lease with the pod (app).
package main

import "github.com/gpupool/gpupool/cmd/gpupool-scheduler/app"

func main() { app.Command().Main() }
