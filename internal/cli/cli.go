// Package cli holds what gpupool's commands share in reading their command
// line, so that every binary answers --help and a bad flag the same way.
package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
)

// ExitUsage is the exit status of a bad command line, as the flag
// package's own ExitOnError uses.
const ExitUsage = 2

// FlagSet is what both the standard library's flag.FlagSet and
// spf13/pflag's (the adapter's, for custom-metrics-apiserver's flags) offer.
type FlagSet interface {
	SetOutput(io.Writer)
	Parse(arguments []string) error
}

// Parse parses args into fs. Asked for with -h or --help, the usage goes to
// stdout (it is what was asked for: `| less` shows it) and the command ends
// with 0; after a bad flag, the error and the usage go to stderr and it ends
// with ExitUsage. ok is whether the command goes on. A usage function must
// write to the flag set's Output().
func Parse(fs FlagSet, args []string, stdout, stderr io.Writer) (exit int, ok bool) {
	var out bytes.Buffer
	fs.SetOutput(&out)
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	switch {
	case errors.Is(err, flag.ErrHelp) || errors.Is(err, pflag.ErrHelp):
		_, _ = out.WriteTo(stdout)
		return 0, false
	case err != nil:
		if out.Len() == 0 { // pflag, unlike flag, leaves the error to its caller
			fmt.Fprintln(&out, err)
		}
		_, _ = out.WriteTo(stderr)
		return ExitUsage, false
	}
	return 0, true
}

// ReadToken reads a bearer token from a file, as a Secret mounts one: the
// newline an editor or `echo` leaves is no part of it. No file, no token.
func ReadToken(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path) //nolint:gosec // the operator names the token file
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// LogFlags are the --log-level and --log-format every long-running command
// takes.
type LogFlags struct {
	level, format string
}

// AddLogFlags registers --log-level and --log-format on fs.
func AddLogFlags(fs *flag.FlagSet) *LogFlags {
	l := &LogFlags{}
	fs.StringVar(&l.level, "log-level", "info", "least severe record logged: debug (every decision, such as each kube-scheduler call and the allocator's answer), info, warn or error")
	fs.StringVar(&l.format, "log-format", "text", "text (key=value) or json (one object a line, for a log pipeline)")
	return l
}

// Logger is the logger the flags ask for, writing to w.
func (l *LogFlags) Logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", l.level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch l.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", l.format)
}

// TokenEnv is where a command that calls the allocator finds its bearer
// token when no file names it.
const TokenEnv = "GPUPOOL_TOKEN" //nolint:gosec // the variable's name, not a credential

// TokenFlags are how a command that calls the allocator takes its bearer
// token: from a file (as a Secret mounts one) or from GPUPOOL_TOKEN, never
// from the command line, where every user of the host reads it (ps,
// /proc/PID/cmdline). --token stays for old scripts, and warns.
type TokenFlags struct {
	file, inline string
}

// AddTokenFlags registers --token-file and --token on fs; what says whose
// token it is ("a namespace's token").
func AddTokenFlags(fs *flag.FlagSet, what string) *TokenFlags {
	t := &TokenFlags{}
	fs.StringVar(&t.file, "token-file", "", "file holding "+what+" (default: env "+TokenEnv+")")
	fs.StringVar(&t.inline, "token", "", "the token itself: DEPRECATED, every user of the host sees a command line; use env "+TokenEnv+" or --token-file")
	return t
}

// TokenFile is the token flags of a caller that sets a service's options in
// code, not on a command line: --token-file path (gpupool-demo's daemons).
func TokenFile(path string) *TokenFlags { return &TokenFlags{file: path} }

// Token is the bearer token the flags name, and a warning to show when it
// came from the command line.
func (t *TokenFlags) Token() (token, warning string, err error) {
	switch {
	case t.file != "" && t.inline != "":
		return "", "", errors.New("--token-file and --token both name a token: give one")
	case t.file != "":
		token, err = ReadToken(t.file)
		if err != nil {
			return "", "", fmt.Errorf("--token-file: %w", err)
		}
		return token, "", nil
	case t.inline != "":
		return t.inline, "--token puts the token on the command line, where every user of this host can read it; use env " + TokenEnv + " or --token-file", nil
	}
	return os.Getenv(TokenEnv), "", nil
}

// PrivateFileWarning is a warning when users other than this process's
// may read the file at path, which holds secrets: others, or a group this
// process is not in (a Secret volume's group is the pod's own fsGroup);
// "" when none may (or it cannot be read at all: opening it says why).
func PrivateFileWarning(path string) string {
	info, err := os.Stat(path)
	if err != nil {
		return ""
	}
	perm := info.Mode().Perm()
	byGroup := perm&0o040 != 0
	if st, ok := info.Sys().(*syscall.Stat_t); ok && byGroup {
		groups, _ := os.Getgroups()
		byGroup = int(st.Gid) != os.Getegid() && !slices.Contains(groups, int(st.Gid))
	}
	if perm&0o004 == 0 && !byGroup {
		return ""
	}
	return fmt.Sprintf("%s holds secrets and other users may read it (mode %04o); chmod 600 it", path, perm)
}

// AllocatorCAFlag, AllocatorCAEnv and AllocatorCAUsage make the flag of
// the CA that signed an https:// allocator's certificate
// (client.TrustCAFile), the same in every command.
const (
	AllocatorCAFlag  = "allocator-ca-file"
	AllocatorCAEnv   = "GPUPOOL_ALLOCATOR_CA_FILE"
	AllocatorCAUsage = "CA certificate (PEM) that signed the allocator's serving certificate, for an https:// allocator (env " + AllocatorCAEnv + "; default: the system's roots)"
)

// AddAllocatorCAFlag registers --allocator-ca-file on fs.
func AddAllocatorCAFlag(fs *flag.FlagSet) *string {
	p := new(string)
	AllocatorCAFlagVar(fs, p)
	return p
}

// AllocatorCAFlagVar registers --allocator-ca-file on fs, into p.
func AllocatorCAFlagVar(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, AllocatorCAFlag, os.Getenv(AllocatorCAEnv), AllocatorCAUsage)
}

// EnvOr is the environment variable key, or def when it is unset or empty:
// a flag's default that the environment may set.
func EnvOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// TLSServingFlags are --tls-cert-file and --tls-private-key-file: the
// serving certificate of a command that serves HTTPS and its key, both
// PEM, which it reads again when they change (as when cert-manager renews
// them).
type TLSServingFlags struct {
	CertFile, KeyFile string
}

// AddFlags registers --tls-cert-file and --tls-private-key-file on fs;
// certUsage is --tls-cert-file's help, which says whose certificate it is.
func (t *TLSServingFlags) AddFlags(fs *flag.FlagSet, certUsage string) {
	fs.StringVar(&t.CertFile, "tls-cert-file", t.CertFile, certUsage)
	fs.StringVar(&t.KeyFile, "tls-private-key-file", t.KeyFile, "private key (PEM) of --tls-cert-file")
}

// Validate refuses a certificate without its key, or a key without its
// certificate; neither is serving over plain HTTP, which the command
// decides.
func (t *TLSServingFlags) Validate() error {
	if (t.CertFile == "") != (t.KeyFile == "") {
		return errors.New("--tls-cert-file and --tls-private-key-file go together")
	}
	return nil
}

// Require refuses flags that give no certificate or no key: why is what
// makes them required.
func (t *TLSServingFlags) Require(why string) error {
	if t.CertFile == "" || t.KeyFile == "" {
		return errors.New("--tls-cert-file and --tls-private-key-file are required: " + why)
	}
	return nil
}
