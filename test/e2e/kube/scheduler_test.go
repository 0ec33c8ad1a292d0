package kube

import (
	"slices"
	"testing"

	schedulerconfigv1 "k8s.io/kube-scheduler/config/v1"
	"sigs.k8s.io/yaml"

	gpukube "github.com/gpupool/gpupool/kube"
)

func TestSchedulerProfiles(t *testing.T) {
	c := &ControlPlane{}
	for _, tc := range []struct {
		o    SchedulerOptions
		want []string
	}{
		{SchedulerOptions{}, []string{"default-scheduler", gpukube.SchedulerName}},
		// gpupool's pods are left to the kube-scheduler the manifests run.
		{SchedulerOptions{DefaultOnly: true}, []string{"default-scheduler"}},
	} {
		b, err := c.schedulerConfig("kubeconfig", tc.o)
		if err != nil {
			t.Fatal(err)
		}
		var config schedulerconfigv1.KubeSchedulerConfiguration
		if err := yaml.Unmarshal(b, &config); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range config.Profiles {
			names = append(names, *p.SchedulerName)
		}
		if !slices.Equal(names, tc.want) {
			t.Errorf("%+v: profiles %v, want %v", tc.o, names, tc.want)
		}
	}
}
