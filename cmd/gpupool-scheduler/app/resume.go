package app

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/kube/leases"
)

// ResumeUsage is what `gpupool resume --help` says above the flags.
const ResumeUsage = `Usage: gpupool resume [flags] KIND/NAME...

Undoes what a namespace's idle policy did to a workload: a Job it
suspended runs again; a Deployment, StatefulSet or ReplicaSet it scaled to
zero gets back the replicas it recorded (gpupool.io/idle-replicas). Their
new pods are placed and leased as any. A workload the policy did not
reclaim is refused: a Job that Kueue suspended is Kueue's to resume.
A pod the policy evicted is gone: create it again.

  gpupool resume job/train -n ml
  gpupool resume deployment/notebook statefulset/lab -n team-a

It speaks to kube-apiserver as kubectl does (--kubeconfig, $KUBECONFIG,
~/.kube/config, or the pod's ServiceAccount), with the caller's rights:
patch on the workload. (gpupool runs it as gpupool-scheduler resume, which
links the Kubernetes client the gpupool client in pods carries not.)
`

// ResumeMain is `gpupool-scheduler resume`, which `gpupool resume` runs:
// leases.Resume on each workload named, its exit status 0 when all were
// resumed, 1 when one failed, cli.ExitUsage for a bad command line.
func ResumeMain(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("gpupool resume", pflag.ContinueOnError)
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	fs.StringVar(&rules.ExplicitPath, "kubeconfig", "", "kubeconfig file; empty: $KUBECONFIG, ~/.kube/config, then the pod's ServiceAccount")
	namespace := fs.StringP("namespace", "n", "", "the workloads' namespace; empty: the kubeconfig context's")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), ResumeUsage+"\nFlags:\n")
		fs.PrintDefaults()
	}
	if exit, ok := cli.Parse(fs, args, stdout, stderr); !ok {
		return exit
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "gpupool resume: name a workload: KIND/NAME (job/train, deployment/notebook)")
		return cli.ExitUsage
	}
	config := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{Context: clientcmdapi.Context{Namespace: *namespace}})
	ns, _, err := config.Namespace()
	if err != nil {
		fmt.Fprintln(stderr, "gpupool resume: the namespace:", err)
		return cli.ExitUsage
	}
	cfg, err := config.ClientConfig()
	if err != nil {
		fmt.Fprintln(stderr, "gpupool resume: no cluster (--kubeconfig, $KUBECONFIG or ~/.kube/config):", err)
		return cli.ExitUsage
	}
	cfg.UserAgent = "gpupool-resume"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "gpupool resume:", err)
		return cli.ExitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	exit := 0
	for _, workload := range fs.Args() {
		did, err := leases.Resume(ctx, client, ns, workload)
		if err != nil {
			fmt.Fprintln(stderr, "gpupool resume:", err)
			exit = 1
			continue
		}
		fmt.Fprintln(stdout, did)
	}
	return exit
}
