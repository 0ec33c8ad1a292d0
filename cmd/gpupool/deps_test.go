package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// serverOnlyModules are what the allocator, the daemon and the adapter
// link and the client, which runs in users' pods, must not: NVML (cgo),
// the stores, the Kubernetes API server libraries.
var serverOnlyModules = []string{
	"github.com/NVIDIA/go-nvml",
	"go.etcd.io/bbolt",
	"go.etcd.io/etcd",
	"k8s.io/apiserver",
	"sigs.k8s.io/custom-metrics-apiserver",
}

// operatorOnlyPackages are this module's packages the client must not
// link either: the trace replay, with its 2 MB of embedded traces, is
// gpupool-simulate's, which gpupool simulate runs.
var operatorOnlyPackages = []string{"github.com/gpupool/gpupool/simulate"}

// maxClientBytes bounds the stripped, cgo-free gpupool binary: it is
// copied into every pod that uses the pool.
const maxClientBytes = 12_000_000

// goCmd runs the go command on this package without cgo, as the client
// is released.
func goCmd(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// TestClientLinksNoServerPackages: no package gpupool depends on is of a
// server-only module, or an operator's package.
func TestClientLinksNoServerPackages(t *testing.T) {
	deps := strings.Fields(goCmd(t, "list", "-deps", "."))
	if len(deps) < 2 {
		t.Fatalf("go list named %d packages", len(deps))
	}
	for _, pkg := range deps {
		for _, mod := range serverOnlyModules {
			if within(pkg, mod) {
				t.Errorf("gpupool links %s, of the server-only module %s (go mod why -m %s shows the chain)", pkg, mod, mod)
			}
		}
		for _, op := range operatorOnlyPackages {
			if within(pkg, op) {
				t.Errorf("gpupool links %s, which only the operators' binaries may (go mod why %s shows the chain)", pkg, pkg)
			}
		}
	}
}

// within is whether the package pkg is the package or module path or
// below it.
func within(pkg, path string) bool { return pkg == path || strings.HasPrefix(pkg, path+"/") }

// TestClientBuildsSmallWithoutCgo builds the client as released: without
// cgo (a package that needs it fails the build), stripped, and small.
func TestClientBuildsSmallWithoutCgo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "gpupool")
	goCmd(t, "build", "-trimpath", "-ldflags=-s -w", "-o", bin, ".")
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gpupool, CGO_ENABLED=0, stripped: %d bytes", fi.Size())
	if fi.Size() > maxClientBytes {
		t.Errorf("gpupool is %d bytes stripped, over the %d it must stay under", fi.Size(), maxClientBytes)
	}
}
