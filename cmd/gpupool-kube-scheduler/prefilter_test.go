package main

import (
	"slices"
	"testing"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/latest"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"

	"github.com/gpupool/gpupool/kube/scheduler"
)

// TestPreFilterPluginsAreTheDefaults: deploy's kube-scheduler profile
// disables every PreFilter plugin ("*") and enables
// scheduler.PreFilterPlugins, so a default PreFilter plugin that an
// upgrade of the pinned kube-scheduler adds (or moves) would be left out
// silently. Here the pinned kube-scheduler's default profile is built, its
// MultiPoint plugins expanded as kube-scheduler expands them, and its
// PreFilter plugins must be PreFilterPlugins after GPUPool, in the same
// order; GPUPool must be first, so that it allocates a pod's claim before
// DynamicResources' PreFilter would.
func TestPreFilterPluginsAreTheDefaults(t *testing.T) {
	if len(scheduler.PreFilterPlugins) == 0 || scheduler.PreFilterPlugins[0] != scheduler.PluginName {
		t.Fatalf("PreFilterPlugins %v: want %s first, before DynamicResources", scheduler.PreFilterPlugins, scheduler.PluginName)
	}
	cfg, err := latest.Default()
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Profiles) != 1 {
		t.Fatalf("kube-scheduler's default configuration has %d profiles: want 1", len(cfg.Profiles))
	}
	// What the in-tree plugins' factories and the framework need, as
	// kube-scheduler's own tests give it: the framework counts each
	// PreFilter plugin's runs in a metric it takes when it is built.
	metrics.Register()
	fw, err := frameworkruntime.NewFramework(t.Context(), plugins.NewInTreeRegistry(), &cfg.Profiles[0],
		frameworkruntime.WithInformerFactory(informers.NewSharedInformerFactory(fake.NewClientset(), 0)),
		frameworkruntime.WithSnapshotSharedLister(cache.NewEmptySnapshot()))
	if err != nil {
		t.Fatal(err)
	}
	var defaults []string
	for _, p := range fw.ListPlugins().PreFilter.Enabled {
		defaults = append(defaults, p.Name)
	}
	if len(defaults) == 0 {
		t.Fatal("kube-scheduler's default profile has no PreFilter plugins")
	}
	if got := scheduler.PreFilterPlugins[1:]; !slices.Equal(got, defaults) {
		t.Errorf("PreFilterPlugins after %s:\n  %v\nwant kube-scheduler's default PreFilter plugins, in their order:\n  %v",
			scheduler.PluginName, got, defaults)
	}
}
