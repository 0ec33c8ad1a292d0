package app

import (
	"flag"
	"strings"
	"testing"
)

// TestOptionsValidate: every flag Validate refuses is named with its
// value, and the defaults pass.
func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // "" passes
	}{
		{nil, ""},
		{[]string{"--unit", "gpus"}, ""},
		{[]string{"--unit", "GPU"}, `--unit: unit "GPU": must be one of percent, gpus`},
		{[]string{"--listen", "0.0.0.0:8474"}, "--listen 0.0.0.0:8474 is not a loopback address"},
		{[]string{"--listen", "8474"}, `--listen "8474"`},
		{[]string{"--tls-cert-file", "c.pem"}, "--tls-cert-file and --tls-private-key-file go together"},
		{[]string{"--resync", "0s"}, "--resync 0s: must be more than 0"},
		{[]string{"--unbound-lease-timeout", "-1s"}, "--unbound-lease-timeout -1s: must be more than 0"},
		{[]string{"--kube-api-qps", "0"}, "--kube-api-qps 0: must be more than 0"},
		{[]string{"--kube-api-burst", "0"}, "--kube-api-burst 0: must be at least 1"},
		{[]string{"--allocator", " "}, "--allocator: no address"},
	} {
		o := NewOptions()
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		err := o.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}
