package kube

import (
	"context"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	componentbaseconfigv1alpha1 "k8s.io/component-base/config/v1alpha1"
	schedulerconfigv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	gpukube "github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/scheduler"
)

// SchedulerOptions configure StartScheduler.
type SchedulerOptions struct {
	// ExtenderURL is the URL prefix of gpupool's scheduler extender, which
	// kube-scheduler asks to filter (POST <ExtenderURL>/filter) and bind
	// (POST <ExtenderURL>/bind) the pods that ask for bitfusion.io/gpu;
	// empty means no extender. An https server must present a certificate
	// that the cluster CA signed, such as ServingCert issues.
	ExtenderURL string
	// ExtenderTimeout bounds each call to the extender; zero means
	// kube-scheduler's default, 5s.
	ExtenderTimeout time.Duration
	// DefaultOnly leaves out gpupool's profile: its pods are placed by a
	// kube-scheduler of its own, as deploy/components/kubernetes runs.
	DefaultOnly bool
	// MostAllocated scores nodes by NodeResourcesFit's MostAllocated
	// strategy over these resources (weight 1 each), packing pods as a
	// cluster without gpupool packs extended resources such as GPUs;
	// empty keeps the default, LeastAllocated.
	MostAllocated []string
	// Plugin, when set, places the pool's pods with gpupool's
	// scheduler-framework plugin (kube/scheduler.Plugin) instead of the
	// extender: kube-scheduler is this binary, gpupool-kube-scheduler, and
	// the gpupool profile runs the plugin with these args (JSON).
	Plugin *SchedulerPlugin
}

// SchedulerPlugin is gpupool-kube-scheduler and its plugin's args.
type SchedulerPlugin struct {
	Binary string
	Args   []byte
	// Flags are more of kube-scheduler's flags (its logging's, say).
	Flags []string
}

// StartScheduler starts kube-scheduler, with two profiles, default-scheduler
// and gpupool's (kube.SchedulerName) unless o.DefaultOnly, and returns once
// it is ready (its informers have synced, so that it sees pods created
// from then on). It acts as
// system:kube-scheduler, the identity Kubernetes' default RBAC grants what
// a scheduler needs. Its error, like Start's, ends with the tail of its log.
//
// Extenders apply to every profile in kube-scheduler; the extender marks
// bitfusion.io/gpu as its managed resource, so that kube-scheduler asks it
// about those pods alone, and leaves that resource to it rather than look
// for it in the nodes' allocatable.
func (c *ControlPlane) StartScheduler(ctx context.Context, o SchedulerOptions) error {
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	port := strconv.Itoa(ports[0])
	f := &files{dir: c.dir}
	cert, key := f.issue(c.ca, "kube-scheduler", leaf{
		subject: pkix.Name{CommonName: "kube-scheduler"},
		ips:     loopback,
		usages:  serverAuth,
	})
	kubeconfig := f.kubeconfig("kube-scheduler", c.URL, c.ca, leaf{
		subject: pkix.Name{CommonName: "system:kube-scheduler"},
		usages:  clientAuth,
	})
	config, err := c.schedulerConfig(kubeconfig, o)
	if err != nil {
		return err
	}
	configFile := f.write("kube-scheduler.yaml", config)
	if f.err != nil {
		return f.err
	}
	binary := filepath.Join(c.binDir, "kube-scheduler")
	args := []string{
		"--config=" + configFile,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + port,
		"--tls-cert-file=" + cert,
		"--tls-private-key-file=" + key,
	}
	if o.Plugin != nil {
		binary = o.Plugin.Binary
		args = append(args, o.Plugin.Flags...)
	}
	scheduler, err := c.start("kube-scheduler", binary, nil, args...)
	if err != nil {
		return err
	}
	c.schedulerURL = "https://127.0.0.1:" + port
	return scheduler.waitFor(ctx, "/readyz", getOK(httpsClient(c.roots), c.schedulerURL+"/readyz"))
}

// KillScheduler kills kube-scheduler with SIGKILL, as a node's failure or
// an OOM kill would, mid-cycle; StartScheduler starts it again, its log
// appended to the same file.
func (c *ControlPlane) KillScheduler() {
	c.procs = slices.DeleteFunc(c.procs, func(p *process) bool {
		if p.name == "kube-scheduler" {
			p.stop()
			return true
		}
		return false
	})
	c.schedulerURL = ""
}

// SchedulerMetrics is kube-scheduler's /metrics, in Prometheus' text
// format, read as the administrator.
func (c *ControlPlane) SchedulerMetrics(ctx context.Context) ([]byte, error) {
	if c.schedulerURL == "" {
		return nil, errors.New("kube-scheduler is not started")
	}
	transport, err := rest.TransportFor(c.Config)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.schedulerURL+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("kube-scheduler /metrics: %s: %s", resp.Status, body)
	}
	return body, nil
}

// schedulerConfig is kube-scheduler's KubeSchedulerConfiguration, as YAML.
func (c *ControlPlane) schedulerConfig(kubeconfig string, o SchedulerOptions) ([]byte, error) {
	config := schedulerconfigv1.KubeSchedulerConfiguration{
		TypeMeta: metav1.TypeMeta{
			APIVersion: schedulerconfigv1.SchemeGroupVersion.String(),
			Kind:       "KubeSchedulerConfiguration",
		},
		LeaderElection: componentbaseconfigv1alpha1.LeaderElectionConfiguration{LeaderElect: ptr.To(false)},
		// The default, 50 requests a second, would cap binding below the
		// rate the scale test asks for: each pod takes a binding and an
		// event.
		ClientConnection: componentbaseconfigv1alpha1.ClientConnectionConfiguration{
			Kubeconfig: kubeconfig,
			QPS:        1000,
			Burst:      2000,
		},
		// Every feasible node, not a sample: placement must not depend on
		// which nodes kube-scheduler happened to look at.
		PercentageOfNodesToScore: ptr.To[int32](100),
		Profiles:                 []schedulerconfigv1.KubeSchedulerProfile{{SchedulerName: ptr.To("default-scheduler")}},
	}
	if len(o.MostAllocated) > 0 {
		args := schedulerconfigv1.NodeResourcesFitArgs{
			TypeMeta:        metav1.TypeMeta{APIVersion: schedulerconfigv1.SchemeGroupVersion.String(), Kind: "NodeResourcesFitArgs"},
			ScoringStrategy: &schedulerconfigv1.ScoringStrategy{Type: schedulerconfigv1.MostAllocated},
		}
		for _, r := range o.MostAllocated {
			args.ScoringStrategy.Resources = append(args.ScoringStrategy.Resources, schedulerconfigv1.ResourceSpec{Name: r, Weight: 1})
		}
		raw, err := json.Marshal(args)
		if err != nil {
			return nil, err
		}
		config.Profiles[0].PluginConfig = []schedulerconfigv1.PluginConfig{{Name: "NodeResourcesFit", Args: runtime.RawExtension{Raw: raw}}}
	}
	if !o.DefaultOnly {
		// As deploy/components/kubernetes/kube-scheduler-config.yaml has
		// it, and says why: no preemption for the pool's pods, 10 s before
		// a refused pod is tried again.
		profile := schedulerconfigv1.KubeSchedulerProfile{SchedulerName: ptr.To(gpukube.SchedulerName),
			Plugins: &schedulerconfigv1.Plugins{PostFilter: schedulerconfigv1.PluginSet{Disabled: []schedulerconfigv1.Plugin{{Name: "DefaultPreemption"}}}}}
		if o.Plugin != nil {
			// The plugin's lease decides the node: no other scorer, and
			// its bind writes the lease with the node.
			gpupool := []schedulerconfigv1.Plugin{{Name: "GPUPool"}}
			all := []schedulerconfigv1.Plugin{{Name: "*"}}
			var preFilter []schedulerconfigv1.Plugin
			for _, name := range scheduler.PreFilterPlugins {
				preFilter = append(preFilter, schedulerconfigv1.Plugin{Name: name})
			}
			profile.Plugins = &schedulerconfigv1.Plugins{
				PreFilter:  schedulerconfigv1.PluginSet{Enabled: preFilter, Disabled: all},
				PostFilter: schedulerconfigv1.PluginSet{Enabled: gpupool, Disabled: all},
				PreScore:   schedulerconfigv1.PluginSet{Enabled: gpupool, Disabled: all},
				Score:      schedulerconfigv1.PluginSet{Enabled: gpupool, Disabled: all},
				Reserve:    schedulerconfigv1.PluginSet{Enabled: gpupool},
				Bind:       schedulerconfigv1.PluginSet{Enabled: gpupool, Disabled: all},
			}
			// bitfusion.io/gpu is the pool's to count, not the nodes'.
			fit, err := json.Marshal(schedulerconfigv1.NodeResourcesFitArgs{
				TypeMeta:              metav1.TypeMeta{APIVersion: schedulerconfigv1.SchemeGroupVersion.String(), Kind: "NodeResourcesFitArgs"},
				IgnoredResourceGroups: []string{"bitfusion.io"},
			})
			if err != nil {
				return nil, err
			}
			profile.PluginConfig = []schedulerconfigv1.PluginConfig{{Name: "GPUPool", Args: runtime.RawExtension{Raw: o.Plugin.Args}},
				{Name: "NodeResourcesFit", Args: runtime.RawExtension{Raw: fit}}}
		}
		config.Profiles = append(config.Profiles, profile)
		config.PodInitialBackoffSeconds = ptr.To[int64](10)
		config.PodMaxBackoffSeconds = ptr.To[int64](10)
	}
	if o.ExtenderURL != "" {
		extenderURL, err := url.Parse(o.ExtenderURL)
		if err != nil {
			return nil, err
		}
		if extenderURL.Scheme != "http" && extenderURL.Scheme != "https" {
			return nil, errors.New("SchedulerOptions.ExtenderURL must be an http or https URL: " + o.ExtenderURL)
		}
		extender := schedulerconfigv1.Extender{
			URLPrefix:        o.ExtenderURL,
			FilterVerb:       "filter",
			BindVerb:         "bind",
			Weight:           1,
			HTTPTimeout:      metav1.Duration{Duration: o.ExtenderTimeout},
			NodeCacheCapable: true,
			ManagedResources: []schedulerconfigv1.ExtenderManagedResource{
				{Name: gpukube.ResourceGPU, IgnoredByScheduler: true},
			},
		}
		if extenderURL.Scheme == "https" {
			extender.EnableHTTPS = true
			extender.TLSConfig = &schedulerconfigv1.ExtenderTLSConfig{CAData: c.CA}
		}
		config.Extenders = []schedulerconfigv1.Extender{extender}
	}
	return yaml.Marshal(config)
}
