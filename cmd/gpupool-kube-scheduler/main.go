// gpupool-kube-scheduler is kube-scheduler with gpupool's plugin
// (kube/scheduler.Plugin) registered, for a profile that places pods
// through the pool. A module of its own: it builds kube-scheduler from
// k8s.io/kubernetes, whose staging modules go.mod pins.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/gpupool/gpupool/kube/scheduler"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand(app.WithPlugin(scheduler.PluginName, scheduler.NewPluginFromArgs))))
}
