package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
)

// testOptions is a service's one flag, --mode, which Validate refuses.
type testOptions struct{ mode string }

func (o *testOptions) AddFlags(fs *flag.FlagSet) { fs.StringVar(&o.mode, "mode", "", "serve or once") }
func (*testOptions) Validate() error             { return errors.New("--mode: refused") }

// TestOneShotRunsInsteadOfTheService: a OneShot that is done ends the
// command with its exit status and output, unvalidated and without Run; one
// that is not done leaves the command to the service.
func TestOneShotRunsInsteadOfTheService(t *testing.T) {
	for _, tc := range []struct {
		mode           string
		exit           int
		stdout, stderr string
	}{
		{mode: "once", exit: 3, stdout: "did it once\n"},
		{mode: "serve", exit: ExitUsage, stderr: "--mode: refused"},
	} {
		o := &testOptions{}
		var stdout, stderr bytes.Buffer
		exit := Main(Service{Name: "test", Options: o,
			Run: func(context.Context, *slog.Logger) error { t.Errorf("--mode %s: Run called", tc.mode); return nil },
			OneShot: func(stdout, _ io.Writer) (int, bool) {
				if o.mode != "once" {
					return 0, false
				}
				_, _ = io.WriteString(stdout, "did it once\n")
				return 3, true
			}}, []string{"--mode", tc.mode}, &stdout, &stderr)
		if exit != tc.exit || stdout.String() != tc.stdout || !strings.Contains(stderr.String(), tc.stderr) || (tc.stderr == "") != (stderr.Len() == 0) {
			t.Errorf("--mode %s: exit %d, stdout %q, stderr %q; want %d, %q and %q", tc.mode, exit, stdout.String(), stderr.String(), tc.exit, tc.stdout, tc.stderr)
		}
	}
}
