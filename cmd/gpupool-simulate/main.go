// Command gpupool-simulate replays Alibaba's OpenB GPU traces against the
// placement policies (app). It is an operator's tool, kept out of the
// gpupool client that every pod carries, which runs it as
// `gpupool simulate`.
package main

import "github.com/gpupool/gpupool/cmd/gpupool-simulate/app"

func main() { app.Main() }
