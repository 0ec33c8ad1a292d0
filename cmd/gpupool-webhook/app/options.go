package app

import (
	"flag"

	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/inventory"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/admission"
)

// Options are gpupool-webhook's flags.
type Options struct {
	Listen string
	cli.TLSServingFlags
	admission.UnitFlags
	SchedulerName   string
	DefaultTopology string
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{Listen: ":8443", UnitFlags: admission.NewUnitFlags(), SchedulerName: kube.SchedulerName,
		DefaultTopology: inventory.LinkAny.String()}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Listen, "listen", o.Listen, "address to serve HTTPS on")
	o.TLSServingFlags.AddFlags(fs, "the serving certificate (PEM), signed by the CA in the webhook configurations' caBundle; read again when it changes")
	o.UnitFlags.AddFlags(fs, "what one bitfusion.io/gpu stands for, the same for the whole cluster: percent (100 is one GPU, as BFK) or gpus (1 is one GPU, as the articles)",
		"one GPU's memory, which a bitfusion.io/gpu-memory request is a share of: a quantity (80Gi) or megabytes (16000); the default is BFK's")
	fs.StringVar(&o.DefaultTopology, "default-topology", o.DefaultTopology, "the least link between the GPUs of a pod that asks for several and names none in gpupool.io/topology: any, socket, pcie-switch or nvlink (BFK's affinityRules, topologyKey gpu.socket, is socket)")
	fs.StringVar(&o.SchedulerName, "scheduler-name", o.SchedulerName, "the spec.schedulerName written into the pods the webhook normalises (the kube-scheduler profile that places them through the pool); empty leaves a pod's own")
}

// Validate checks the options and parses the unit and the GPU memory.
func (o *Options) Validate() error {
	if err := o.Require("kube-apiserver calls webhooks over HTTPS only"); err != nil {
		return err
	}
	if err := o.UnitFlags.Validate(); err != nil {
		return err
	}
	_, err := inventory.ParseLink("--default-topology", o.DefaultTopology)
	return err
}
