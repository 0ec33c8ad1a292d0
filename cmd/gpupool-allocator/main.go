// Command gpupool-allocator serves the GPU pool's allocator over HTTP
// (app), or checks its store (--check).
package main

import "github.com/gpupool/gpupool/cmd/gpupool-allocator/app"

func main() { app.Command().Main() }
