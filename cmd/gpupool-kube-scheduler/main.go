// gpupool-kube-scheduler is kube-scheduler with gpupool's plugin
// (kube/scheduler.Plugin) registered, for a profile that places pods
// through the pool. The plugin logs through kube-scheduler's klog, in its
// --logging-format (text, or json as upstream's binary offers it) and at
// its -v: 2 records every acquisition and bind. A module of its own: it
// builds kube-scheduler from k8s.io/kubernetes, whose staging modules
// go.mod pins.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json, as upstream's kube-scheduler
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/gpupool/gpupool/kube/scheduler"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand(app.WithPlugin(scheduler.PluginName, scheduler.NewPluginFromArgs))))
}
