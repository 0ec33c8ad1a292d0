package cli

import (
	"context"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/pflag"
)

// PflagOptions are Options on spf13/pflag's flag set: those of a service
// built on a Kubernetes library that registers its own flags there
// (custom-metrics-apiserver's serving options).
type PflagOptions interface {
	AddFlags(fs *pflag.FlagSet)
	Validate() error
}

// PflagService is a Service whose options are PflagOptions.
type PflagService struct {
	Name    string
	Usage   string
	Options PflagOptions
	Run     func(ctx context.Context, log *slog.Logger) error
}

// MainPflag is Main for a PflagService, with one difference: it adds no
// --log-level or --log-format, so that the command line stays the one the
// service has always had, and it logs text from info.
func MainPflag(s PflagService, args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet(s.Name, pflag.ContinueOnError)
	s.Options.AddFlags(fs)
	fs.Usage = usage(fs.Output, s.Usage, fs.PrintDefaults)
	if exit, ok := Parse(fs, args, stdout, stderr); !ok {
		return exit
	}
	return validateAndRun(s.Options.Validate, s.Run, slog.New(slog.NewTextHandler(stderr, nil)))
}

// Main is a binary's main: MainPflag on the process's arguments, then exit
// with its status.
func (s PflagService) Main() { os.Exit(MainPflag(s, os.Args[1:], os.Stdout, os.Stderr)) }
