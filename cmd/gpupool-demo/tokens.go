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
	// configFile is the allocator's config (--config); adminFile and
	// serversFile hold the admin and the servers token, as a Secret's
	// volume holds one (--allocator-token-file, --token-file).
	configFile, adminFile, serversFile string
}

// writeDemoTokens writes the allocator's config, the demo's quotas and
// random tokens, to dir/config.yaml, and the tokens of the adapter and
// the daemons to files beside it.
func writeDemoTokens(dir string) (*demoTokens, error) {
	tk := &demoTokens{admin: rand.Text(), servers: rand.Text(), tenant: map[string]string{},
		configFile: filepath.Join(dir, "config.yaml"), adminFile: filepath.Join(dir, "admin.token"), serversFile: filepath.Join(dir, "servers.token")}
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
	config, err := yaml.Marshal(fc)
	if err != nil {
		return nil, err
	}
	for path, content := range map[string][]byte{tk.configFile: config, tk.adminFile: []byte(tk.admin), tk.serversFile: []byte(tk.servers)} {
		if err := os.WriteFile(path, content, 0o600); err != nil {
			return nil, err
		}
	}
	return tk, nil
}
