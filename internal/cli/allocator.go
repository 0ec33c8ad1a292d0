package cli

import (
	"fmt"

	"github.com/gpupool/gpupool/allocator/client"
)

// AllocatorClient is the client a service's flags describe: the allocator
// at addresses (--allocator: one or several, comma-separated), the CA that
// signed an https:// allocator's certificate (--allocator-ca-file), and
// the bearer token in tokenFile, which the service's flag tokenFlag names
// ("--token-file"). Each error names its flag.
func AllocatorClient(addresses, caFile, tokenFlag, tokenFile string) (*client.Client, error) {
	token, err := ReadToken(tokenFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", tokenFlag, err)
	}
	c, err := client.New([]string{addresses}, token)
	if err != nil {
		return nil, fmt.Errorf("--allocator: %w", err)
	}
	if err := c.TrustCAFile(caFile); err != nil {
		return nil, fmt.Errorf("--%s: %w", AllocatorCAFlag, err)
	}
	return c, nil
}
