package cli

import (
	"bytes"
	"cmp"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestParse(t *testing.T) {
	newStd := func() FlagSet {
		fs := flag.NewFlagSet("cmd", flag.ContinueOnError)
		fs.Int("n", 1, "how many")
		fs.Usage = func() { fmt.Fprintln(fs.Output(), "Usage: cmd [flags]") }
		return fs
	}
	newPflag := func() FlagSet {
		fs := pflag.NewFlagSet("cmd", pflag.ContinueOnError)
		fs.Int("n", 1, "how many")
		fs.Usage = func() { fmt.Fprintln(fs.Output(), "Usage: cmd [flags]") }
		return fs
	}
	for _, tc := range []struct {
		args           []string
		exit           int
		ok             bool
		stdout, stderr string
	}{
		{args: []string{"--n=3"}, exit: 0, ok: true},
		{args: []string{"--help"}, exit: 0, stdout: "Usage: cmd"},
		{args: []string{"-h"}, exit: 0, stdout: "Usage: cmd"},
		{args: []string{"--n=x"}, exit: ExitUsage, stderr: "invalid"},
		{args: []string{"--nope"}, exit: ExitUsage, stderr: "nope"},
	} {
		for kind, newFlags := range map[string]func() FlagSet{"flag": newStd, "pflag": newPflag} {
			var stdout, stderr bytes.Buffer
			exit, ok := Parse(newFlags(), tc.args, &stdout, &stderr)
			name := kind + " " + strings.Join(tc.args, " ")
			if exit != tc.exit || ok != tc.ok {
				t.Errorf("%s: exit %d ok %v, want %d %v", name, exit, ok, tc.exit, tc.ok)
			}
			for _, out := range []struct {
				name, got, want string
			}{{"stdout", stdout.String(), tc.stdout}, {"stderr", stderr.String(), tc.stderr}} {
				if (out.want == "") != (out.got == "") || !strings.Contains(out.got, out.want) {
					t.Errorf("%s: %s %q, want it to hold %q", name, out.name, out.got, out.want)
				}
			}
		}
	}
}

// TestReadToken: a token file's trailing newline is not the token's; no
// file is no token; a file that cannot be read is an error.
func TestReadToken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("servers-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if token, err := ReadToken(path); token != "servers-token-0123456789" || err != nil {
		t.Errorf("ReadToken(%s) = %q, %v", path, token, err)
	}
	if token, err := ReadToken(""); token != "" || err != nil {
		t.Errorf(`ReadToken("") = %q, %v`, token, err)
	}
	if _, err := ReadToken(path + ".missing"); err == nil {
		t.Error("a missing token file reads")
	}
}

// TestLogFlags: --log-level and --log-format make the logger, and a bad
// value is refused naming the flag, the value and what it takes.
func TestLogFlags(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		debug     bool
		json, err string
	}{
		{args: nil},
		{args: []string{"--log-level", "debug", "--log-format", "json"}, debug: true, json: `"msg":"hello"`},
		{args: []string{"--log-level", "loud"}, err: `--log-level "loud": want debug, info, warn or error`},
		{args: []string{"--log-format", "xml"}, err: `--log-format "xml": want text or json`},
	} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		lf := AddLogFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		log, err := lf.Logger(&out)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("%v: error %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		log.Debug("hello")
		if got := out.Len() > 0; got != tc.debug {
			t.Errorf("%v: debug logged %v, want %v", tc.args, got, tc.debug)
		}
		if tc.json != "" && !strings.Contains(out.String(), tc.json) {
			t.Errorf("%v: logged %q, want JSON with %s", tc.args, out.String(), tc.json)
		}
	}
}

// TestTokenFlags: a token comes from --token-file or GPUPOOL_TOKEN; one on
// the command line still works, with a warning; both flags are refused.
func TestTokenFlags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(TokenEnv, "from-env")
	for _, tc := range []struct {
		args           []string
		token, warning string
		err            string
	}{
		{nil, "from-env", "", ""},
		{[]string{"--token-file", file}, "from-file", "", ""},
		{[]string{"--token", "inline"}, "inline", "--token puts the token on the command line, where every user of this host can read it; use env GPUPOOL_TOKEN or --token-file", ""},
		{[]string{"--token", "inline", "--token-file", file}, "", "", "--token-file and --token both name a token: give one"},
		{[]string{"--token-file", file + ".missing"}, "", "", "--token-file: open " + file + ".missing: no such file or directory"},
	} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		flags := AddTokenFlags(fs, "a namespace's token")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		token, warning, err := flags.Token()
		if token != tc.token || warning != tc.warning || fmt.Sprint(err) != cmp.Or(tc.err, "<nil>") {
			t.Errorf("%v: %q, warning %q, error %v; want %q, %q, %s", tc.args, token, warning, err, tc.token, tc.warning, tc.err)
		}
	}
}

// TestTokenFile: the flags set in code read the file, as --token-file
// does, before the environment.
func TestTokenFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(TokenEnv, "from-env")
	if token, warning, err := TokenFile(file).Token(); token != "from-file" || warning != "" || err != nil {
		t.Errorf("TokenFile(%s).Token() = %q, %q, %v; want from-file", file, token, warning, err)
	}
}

// TestPrivateFileWarning: a file of secrets that others, or a group this
// process is not in, may read is warned about; one only its owner (or
// this process's group) reads is not.
func TestPrivateFileWarning(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode os.FileMode
		warn bool
	}{{0o600, false}, {0o400, false}, {0o640, false}, {0o644, true}, {0o604, true}} {
		if err := os.Chmod(file, tc.mode); err != nil {
			t.Fatal(err)
		}
		if got := PrivateFileWarning(file); (got != "") != tc.warn {
			t.Errorf("mode %04o: warning %q, want one: %v", tc.mode, got, tc.warn)
		}
	}
	if err := os.Chown(file, -1, 12345); err == nil { // as root: a group this process is not in
		if err := os.Chmod(file, 0o640); err != nil {
			t.Fatal(err)
		}
		if want := file + " holds secrets and other users may read it (mode 0640); chmod 600 it"; PrivateFileWarning(file) != want {
			t.Errorf("mode 0640, another group: warning %q, want %q", PrivateFileWarning(file), want)
		}
	}
}

func TestEnvOr(t *testing.T) {
	t.Setenv("GPUPOOL_TEST_SET", "set")
	t.Setenv("GPUPOOL_TEST_EMPTY", "")
	if got := EnvOr("GPUPOOL_TEST_SET", "def"); got != "set" {
		t.Errorf("set: %q", got)
	}
	if got := EnvOr("GPUPOOL_TEST_EMPTY", "def"); got != "def" {
		t.Errorf("empty: %q, want the default", got)
	}
}

// TestTLSServingFlags: the certificate and its key go together, and a
// command that must serve TLS says why it needs both.
func TestTLSServingFlags(t *testing.T) {
	for _, tc := range []struct {
		cert, key          string
		validate, required string // the errors; "<nil>" for none
	}{
		{"", "", "<nil>", "--tls-cert-file and --tls-private-key-file are required: HTTPS only"},
		{"c.pem", "", "--tls-cert-file and --tls-private-key-file go together", "--tls-cert-file and --tls-private-key-file are required: HTTPS only"},
		{"", "k.pem", "--tls-cert-file and --tls-private-key-file go together", "--tls-cert-file and --tls-private-key-file are required: HTTPS only"},
		{"c.pem", "k.pem", "<nil>", "<nil>"},
	} {
		f := TLSServingFlags{CertFile: tc.cert, KeyFile: tc.key}
		if got := fmt.Sprint(f.Validate()); got != tc.validate {
			t.Errorf("%q %q: Validate %s; want %s", tc.cert, tc.key, got, tc.validate)
		}
		if got := fmt.Sprint(f.Require("HTTPS only")); got != tc.required {
			t.Errorf("%q %q: Require %s; want %s", tc.cert, tc.key, got, tc.required)
		}
	}
}
