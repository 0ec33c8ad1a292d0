package app

import (
	"errors"
	"flag"
	"fmt"

	"github.com/gpupool/gpupool/inventory"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/admission"
)

// Options are gpupool-webhook's flags.
type Options struct {
	Listen, CertFile, KeyFile string
	UnitName, GPUMemory       string
	SchedulerName             string
	DefaultTopology           string

	// Unit and GPUMemoryBytes are UnitName and GPUMemory, parsed by
	// Validate.
	Unit           kube.Unit
	GPUMemoryBytes int64
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{Listen: ":8443", UnitName: string(kube.UnitPercent), GPUMemory: admission.DefaultGPUMemory, SchedulerName: kube.SchedulerName,
		DefaultTopology: inventory.LinkAny.String()}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Listen, "listen", o.Listen, "address to serve HTTPS on")
	fs.StringVar(&o.CertFile, "tls-cert-file", o.CertFile, "the serving certificate (PEM), signed by the CA in the webhook configurations' caBundle; read again when it changes")
	fs.StringVar(&o.KeyFile, "tls-private-key-file", o.KeyFile, "the certificate's private key (PEM)")
	fs.StringVar(&o.UnitName, "unit", o.UnitName, "what one bitfusion.io/gpu stands for, the same for the whole cluster: percent (100 is one GPU, as BFK) or gpus (1 is one GPU, as the articles)")
	fs.StringVar(&o.GPUMemory, "gpu-memory", o.GPUMemory, "one GPU's memory, which a bitfusion.io/gpu-memory request is a share of: a quantity (80Gi) or megabytes (16000); the default is BFK's")
	fs.StringVar(&o.DefaultTopology, "default-topology", o.DefaultTopology, "the least link between the GPUs of a pod that asks for several and names none in gpupool.io/topology: any, socket, pcie-switch or nvlink (BFK's affinityRules, topologyKey gpu.socket, is socket)")
	fs.StringVar(&o.SchedulerName, "scheduler-name", o.SchedulerName, "the spec.schedulerName written into the pods the webhook normalises (the kube-scheduler profile that places them through the pool); empty leaves a pod's own")
}

// Validate checks the options and parses the unit and the GPU memory.
func (o *Options) Validate() error {
	if o.CertFile == "" || o.KeyFile == "" {
		return errors.New("--tls-cert-file and --tls-private-key-file are required: kube-apiserver calls webhooks over HTTPS only")
	}
	unit, err := kube.ParseUnit(o.UnitName)
	if err != nil {
		return fmt.Errorf("--unit: %w", err)
	}
	memory, err := admission.ParseGPUMemory(o.GPUMemory)
	if err != nil {
		return fmt.Errorf("--gpu-memory: %w", err)
	}
	if _, err := inventory.ParseLink("--default-topology", o.DefaultTopology); err != nil {
		return err
	}
	o.Unit, o.GPUMemoryBytes = unit, memory
	return nil
}
