// Command gpupool-webhook is gpupool's admission webhook for pods that ask
// for GPUs from the pool (kube/admission), served over HTTPS (app).
package main

import "github.com/gpupool/gpupool/cmd/gpupool-webhook/app"

func main() { app.Command().Main() }
