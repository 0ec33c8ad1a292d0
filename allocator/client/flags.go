package client

import (
	"fmt"

	"github.com/gpupool/gpupool/internal/cli"
)

// Flags are the values of a service's allocator flags: the allocator at
// Allocator (--allocator: one address or several, comma-separated), the CA
// that signed an https:// allocator's certificate (--allocator-ca-file),
// and the file holding the bearer token, which the service's flag
// TokenFlag names ("--token-file").
type Flags struct {
	Allocator, CAFile    string
	TokenFile, TokenFlag string
}

// NewFromFlags is the client the flags describe. Each error names its
// flag.
func NewFromFlags(f Flags) (*Client, error) {
	token, err := cli.ReadToken(f.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.TokenFlag, err)
	}
	c, err := New([]string{f.Allocator}, token)
	if err != nil {
		return nil, fmt.Errorf("--allocator: %w", err)
	}
	if err := c.TrustCAFile(f.CAFile); err != nil {
		return nil, fmt.Errorf("--%s: %w", cli.AllocatorCAFlag, err)
	}
	return c, nil
}
