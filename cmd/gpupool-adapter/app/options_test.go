package app

import (
	"fmt"
	"testing"

	"github.com/spf13/pflag"
)

// TestOptionsValidate: every flag Validate refuses is named with its
// value, the defaults pass, and the serving options' flags are registered
// beside the adapter's own.
func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // the error, "<nil>" when they pass
	}{
		{nil, "<nil>"},
		{[]string{"--backend", "prometheus", "--secure-port", "6443"}, "<nil>"},
		{[]string{"--max-age", "0s"}, "--max-age=0s must be above 0"},
		{[]string{"--max-age", "-1s"}, "--max-age=-1s must be above 0"},
		{[]string{"--backend", "datadog"}, `--backend "datadog" is not one of direct, prometheus`},
		{[]string{"--keda-scaler-listen", ":9471", "--keda-client-ca", "/etc/keda-ca/ca.crt"}, "<nil>"},
		{[]string{"--keda-scaler-listen", ":9471"}, "--keda-scaler-listen=:9471 needs --keda-client-ca: the scaler answers only clients with a certificate that CA signed " +
			"(KEDA's TriggerAuthentication's tlsClientCert), since anyone else could read every namespace's use through it"},
		{[]string{"--keda-client-ca", "/etc/keda-ca/ca.crt"}, "--keda-client-ca=/etc/keda-ca/ca.crt without --keda-scaler-listen: it is the KEDA scaler's, which serves only with an address"},
		{[]string{"--keda-scaler-listen", "9471", "--keda-client-ca", "ca.crt"}, "--keda-scaler-listen=9471 is not an address such as :9471: address 9471: missing port in address"},
		{[]string{"--keda-scaler-listen", ":9471", "--keda-client-ca", "ca.crt", "--backend", "prometheus"},
			"--keda-scaler-listen=:9471 needs --backend=direct, not prometheus: the scaler's activity reads the allocator's idle verdicts per lease, which Prometheus does not hold by pod labels"},
	} {
		o := NewOptions()
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(o.Validate()); got != tc.want {
			t.Errorf("%q: %s, want %s", tc.args, got, tc.want)
		}
	}
}
