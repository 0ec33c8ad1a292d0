package main

import (
	"crypto/rand"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/gpupool/gpupool/allocator/service"
)

// demoTokens are the demo's bearer tokens, made up at random on each run:
// tokens are on, as deployed (deploy/base/config/allocator-config.yaml).
type demoTokens struct {
	// admin is the operator's and the adapter's; servers the GPU-server
	// daemons' (one for all, as the DaemonSet's Secret).
	admin, servers string
	// tenant is each namespace's, what its pods' `gpupool run` holds.
	tenant map[string]string
	// configFile is where the allocator's config was written.
	configFile string
}

// writeDemoConfig writes the allocator's config, the demo's quotas and
// random tokens, to dir/config.yaml and reads it back as the allocator
// reads --config, so it is checked the same way.
func writeDemoConfig(dir string) (*demoTokens, *service.FileConfig, error) {
	tk := &demoTokens{admin: rand.Text(), servers: rand.Text(), tenant: map[string]string{}, configFile: filepath.Join(dir, "config.yaml")}
	fc := service.FileConfig{
		Admin:      service.TokenSet{Tokens: []string{tk.admin}},
		Servers:    service.ServersConfig{Tokens: []string{tk.servers}},
		Namespaces: map[string]service.NamespaceConfig{},
	}
	for _, ns := range slices.Sorted(maps.Keys(demoQuotas)) {
		tk.tenant[ns] = rand.Text()
		fc.Namespaces[ns] = service.NamespaceConfig{Tokens: []string{tk.tenant[ns]},
			Hard: map[string]resource.Quantity{service.QuotaResource: *resource.NewQuantity(demoQuotas[ns], resource.DecimalSI)}}
	}
	b, err := yaml.Marshal(fc)
	if err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(tk.configFile, b, 0o600); err != nil {
		return nil, nil, err
	}
	loaded, err := service.LoadConfig(tk.configFile)
	if err != nil {
		return nil, nil, err
	}
	return tk, loaded, nil
}
