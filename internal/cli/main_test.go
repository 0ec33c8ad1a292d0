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

	"github.com/spf13/pflag"
)

// testOptions are one flag, --n, which Validate wants above 0, on either
// flag package.
type testOptions struct{ n int }

func (o *testOptions) Validate() error {
	if o.n <= 0 {
		return errors.New("--n: must be above 0")
	}
	return nil
}

type stdOptions struct{ testOptions }

func (o *stdOptions) AddFlags(fs *flag.FlagSet) { fs.IntVar(&o.n, "n", 1, "how many") }

type pflagOptions struct{ testOptions }

func (o *pflagOptions) AddFlags(fs *pflag.FlagSet) { fs.IntVar(&o.n, "n", 1, "how many") }

// TestMains: Main and MainPflag show the usage above the flags for --help,
// end with ExitUsage for a flag that does not parse, that Validate
// refuses or that Run finds bad (UsageError), with 1 when Run fails and 0
// when it ends well; only Main takes --log-level.
func TestMains(t *testing.T) {
	usageErr, failed := &UsageError{Err: errors.New("--n: no such file")}, errors.New("the service broke")
	for _, tc := range []struct {
		args           []string
		runErr         error
		exit           int
		stdout, stderr string
		pflagExit      int // where MainPflag differs
	}{
		{args: []string{"--help"}, stdout: "Usage: test\n\nFlags:\n"},
		{args: nil},
		{args: []string{"--n", "0"}, exit: ExitUsage, stderr: `msg="bad flag" err="--n: must be above 0"`},
		{args: []string{"--n", "x"}, exit: ExitUsage, stderr: "invalid"},
		{runErr: usageErr, exit: ExitUsage, stderr: `msg="bad flag" err="--n: no such file"`},
		{runErr: failed, exit: 1, stderr: `msg=stopping err="the service broke"`},
		{args: []string{"--log-level", "debug"}, pflagExit: ExitUsage},
	} {
		run := func(context.Context, *slog.Logger) error { return tc.runErr }
		for kind, main := range map[string]func(stdout, stderr io.Writer) int{
			"Main": func(stdout, stderr io.Writer) int {
				return Main(Service{Name: "test", Usage: "Usage: test\n", Options: &stdOptions{}, Run: run}, tc.args, stdout, stderr)
			},
			"MainPflag": func(stdout, stderr io.Writer) int {
				return MainPflag(PflagService{Name: "test", Usage: "Usage: test\n", Options: &pflagOptions{}, Run: run}, tc.args, stdout, stderr)
			},
		} {
			var stdout, stderr bytes.Buffer
			exit, want := main(&stdout, &stderr), tc.exit
			if kind == "MainPflag" && tc.pflagExit != 0 {
				want = tc.pflagExit
			}
			name := kind + " " + strings.Join(tc.args, " ")
			if exit != want {
				t.Errorf("%s: exit %d, want %d; stderr %s", name, exit, want, stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.stdout) || !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("%s: stdout %q, stderr %q; want them to hold %q, %q", name, stdout.String(), stderr.String(), tc.stdout, tc.stderr)
			}
		}
	}
}

// modeOptions is a service's one flag, --mode, which Validate refuses.
type modeOptions struct{ mode string }

func (o *modeOptions) AddFlags(fs *flag.FlagSet) { fs.StringVar(&o.mode, "mode", "", "serve or once") }
func (*modeOptions) Validate() error             { return errors.New("--mode: refused") }

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
		o := &modeOptions{}
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
