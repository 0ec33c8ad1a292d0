package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/gpupool/gpupool/allocator/client"
)

// defaultAllocator is where the allocator listens by default.
const defaultAllocator = "http://127.0.0.1:8470"

// clientFlags are the flags of every command that talks to the allocator.
type clientFlags struct {
	allocator, token string
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.allocator, "allocator", envOr("GPUPOOL_ALLOCATOR", defaultAllocator), "allocator URL; replicas comma-separated (env GPUPOOL_ALLOCATOR)")
	fs.StringVar(&c.token, "token", os.Getenv("GPUPOOL_TOKEN"), "bearer token (env GPUPOOL_TOKEN)")
}

func (c *clientFlags) client(stderr io.Writer) (*client.Client, bool) {
	cl, err := client.New([]string{c.allocator}, c.token)
	if err != nil {
		fmt.Fprintln(stderr, "gpupool: --allocator:", err)
		return nil, false
	}
	return cl, true
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
