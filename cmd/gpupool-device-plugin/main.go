// Command gpupool-device-plugin is the kubelet device plugin of a GPU
// server: it advertises bitfusion.io/gpu on its node and gives each
// container that asks the GPUs of its pod's lease (app, kube/deviceplugin).
package main

import "github.com/gpupool/gpupool/cmd/gpupool-device-plugin/app"

func main() { app.Command().Main() }
