// Command gpupool-load plays many GPU servers and clients against a
// running allocator (and adapter) to measure how it holds up (app): it is
// an operator's tool, kept out of the gpupool client that every pod
// carries.
package main

import "github.com/gpupool/gpupool/cmd/gpupool-load/app"

func main() { app.Main() }
