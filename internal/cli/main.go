package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// Options are a service's flags: AddFlags registers them, Validate checks
// them once parsed (each error names the flag, the value and what it may
// be), as kube-state-metrics' options do.
type Options interface {
	AddFlags(fs *flag.FlagSet)
	Validate() error
}

// Service is what Main runs: a name, the usage text --help shows above the
// flags, its options, and Run, which serves until ctx ends.
type Service struct {
	Name    string
	Usage   string
	Options Options
	Run     func(ctx context.Context, log *slog.Logger) error
	// OneShot, when set, is called once the flags are parsed (and the log
	// flags checked), before Validate: when it returns done, the command ends with its exit
	// status and Run is not called. It is a mode of the binary that does
	// one job and writes its own output (the allocator's --check).
	OneShot func(stdout, stderr io.Writer) (exit int, done bool)
}

// UsageError is a Run's error that is the command line's fault, caught
// only once the flags were used (a certificate that does not load, a
// config that does not parse): Main ends with ExitUsage for it.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Main parses args into the service's options with --log-level and
// --log-format, validates them, and runs the service until SIGINT or
// SIGTERM. It returns the exit status: 0 once stopped, ExitUsage for a bad
// command line, 1 when the service fails.
func Main(s Service, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(s.Name, flag.ContinueOnError)
	s.Options.AddFlags(fs)
	logFlags := AddLogFlags(fs)
	fs.Usage = usage(fs.Output, s.Usage, fs.PrintDefaults)
	if exit, ok := Parse(fs, args, stdout, stderr); !ok {
		return exit
	}
	log, err := logFlags.Logger(stderr)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", s.Name, err)
		return ExitUsage
	}
	if s.OneShot != nil {
		if exit, done := s.OneShot(stdout, stderr); done {
			return exit
		}
	}
	return validateAndRun(s.Options.Validate, s.Run, log)
}

// Main is a binary's main: Main on the process's arguments, then exit
// with its status.
func (s Service) Main() { os.Exit(Main(s, os.Args[1:], os.Stdout, os.Stderr)) }

// usage is a flag set's Usage: the service's text, then its flags, written
// to the flag set's output of the moment (Parse sets it).
func usage(output func() io.Writer, text string, printDefaults func()) func() {
	return func() {
		fmt.Fprint(output(), text)
		fmt.Fprint(output(), "\nFlags:\n")
		printDefaults()
	}
}

// validateAndRun is what Main and MainPflag do once the flags are parsed:
// validate them, run the service until SIGINT or SIGTERM, and return the
// exit status.
func validateAndRun(validate func() error, run func(ctx context.Context, log *slog.Logger) error, log *slog.Logger) int {
	if err := validate(); err != nil {
		log.Error("bad flag", "err", err)
		return ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, log)
	var usage *UsageError
	switch {
	case errors.As(err, &usage):
		log.Error("bad flag", "err", usage.Err)
		return ExitUsage
	case err != nil:
		log.Error("stopping", "err", err)
		return 1
	}
	return 0
}
