// Command gpupool-scheduler runs the controller that ends each pod's lease
// with the pod and makes the namespaces' ResourceQuotas the allocator's
// quotas, leader-elected, and, with --listen, serves kube-scheduler's
// extender over the pool's placement (app). `gpupool-scheduler secrets` makes the Helm
// chart's Secrets in the cluster, then exits (app.SecretsCommand);
// `gpupool-scheduler resume`, which `gpupool resume` runs, undoes what an
// idle policy reclaimed (app.ResumeMain).
package main

import (
	"os"

	"github.com/gpupool/gpupool/cmd/gpupool-scheduler/app"
	"github.com/gpupool/gpupool/internal/cli"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "secrets" {
		os.Exit(cli.Main(app.SecretsCommand(), os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "resume" {
		os.Exit(app.ResumeMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	app.Command().Main()
}
