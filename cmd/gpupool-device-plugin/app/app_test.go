package app

import (
	"errors"
	"flag"
	"log/slog"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/internal/cli"
)

// TestRunRefusesBadFlags: a flag that only Run can check (a file it
// reads, an address it parses, a cluster it loads) is a cli.UsageError
// naming the flag and the value, before the plugin starts.
func TestRunRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		flag, value, want string
	}{
		{"token-file", "/nonexistent/token", "--token-file: open /nonexistent/token: no such file or directory"},
		{"allocator", "allocator:8470", `--allocator: allocator address "allocator:8470" is not a URL such as http://127.0.0.1:8470`},
		{"allocator-ca-file", "/nonexistent/ca.crt", "--allocator-ca-file: the allocator's CA: open /nonexistent/ca.crt: no such file or directory"},
		{"kubeconfig", "/nonexistent/kubeconfig", "no cluster (--kubeconfig, or run in a pod): stat /nonexistent/kubeconfig: no such file or directory"},
	} {
		o := NewOptions()
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		o.AddFlags(fs)
		if err := errors.Join(fs.Parse([]string{"--node", "gpu-0", "--" + tc.flag, tc.value}), o.Validate()); err != nil {
			t.Fatal(err)
		}
		var usage *cli.UsageError
		if err := Run(t.Context(), o, slog.New(slog.DiscardHandler)); !errors.As(err, &usage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--%s %s: %v, want a usage error %q", tc.flag, tc.value, err, tc.want)
		}
	}
}
