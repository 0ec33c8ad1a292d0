package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/cli"
)

// defaultAllocator is where the allocator listens by default.
const defaultAllocator = "http://127.0.0.1:8470"

// clientFlags are the flags of every command that talks to the allocator.
type clientFlags struct {
	allocator string
	caFile    *string
	tokens    *cli.TokenFlags
	token     string // once client has read it
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.allocator, "allocator", cli.EnvOr("GPUPOOL_ALLOCATOR", defaultAllocator), "allocator URL; replicas comma-separated (env GPUPOOL_ALLOCATOR)")
	c.caFile = cli.AddAllocatorCAFlag(fs)
	c.tokens = cli.AddTokenFlags(fs, "the namespace's bearer token")
}

func (c *clientFlags) client(stderr io.Writer) (*client.Client, bool) {
	token, warning, err := c.tokens.Token()
	if err != nil {
		fmt.Fprintln(stderr, "gpupool:", err)
		return nil, false
	}
	if warning != "" {
		fmt.Fprintln(stderr, "gpupool: warning:", warning)
	}
	c.token = token
	cl, err := client.New([]string{c.allocator}, token)
	if err == nil {
		err = cl.TrustCAFile(*c.caFile)
	}
	if err != nil {
		fmt.Fprintln(stderr, "gpupool: --allocator:", err)
		return nil, false
	}
	return cl, true
}

// allocatorFailed tells why a call to the allocator failed, the same way
// for every command, and returns the exit status that says who must act.
func allocatorFailed(stderr io.Writer, command string, err error) int {
	var unreachable *client.UnreachableError
	if errors.As(err, &unreachable) {
		fmt.Fprintf(stderr, "gpupool %s: %v\n  start one (gpupool-allocator --data-dir DIR), or point --allocator or GPUPOOL_ALLOCATOR at a running one\n", command, unreachable)
		return exitUnavailable
	}
	var e *api.Error
	if !errors.As(err, &e) {
		fmt.Fprintf(stderr, "gpupool %s: %v\n", command, err)
		return exitFailed
	}
	fmt.Fprintf(stderr, "gpupool %s: %s\n", command, e.Message)
	switch e.Reason {
	case api.ReasonNoCapacity:
		return exitNoCapacity
	case api.ReasonQuotaExceeded, api.ReasonForbidden, api.ReasonUnauthorized:
		return exitNoPermit
	case api.ReasonInvalid:
		return exitUsage
	case api.ReasonUnavailable, api.ReasonInternal:
		return exitUnavailable
	}
	return exitFailed
}
