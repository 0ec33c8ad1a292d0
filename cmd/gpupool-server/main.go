// Command gpupool-server is the GPU-server daemon: one per GPU host (app).
package main

import "github.com/gpupool/gpupool/cmd/gpupool-server/app"

func main() { app.Command().Main() }
