// Command gpuload is the workload of the end-to-end tests' GPU pods: it
// prints its environment, sorted, one variable a line (what its container
// was given), holds open the simulated GPUs' device files it was given, as
// a CUDA process holds /dev/nvidiaN, so that gpupool-server finds it on
// those GPUs (fakegpu.Source's DeviceDir), and waits for SIGTERM. It
// builds with CGO_ENABLED=0, for an image of its own.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/kube"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

// run prints env, then holds open the device files under --device-dir
// that env's GPUPOOL_GPU_UUIDS names (every file there without it), each
// said on stderr, until ctx ends.
func run(ctx context.Context, args, env []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("gpuload", flag.ContinueOnError)
	dir := flags.String("device-dir", kube.SimulatedDeviceDir, "where the simulated GPUs' device files are, one per GPU named by its UUID")
	if exit, ok := cli.Parse(flags, args, stdout, stderr); !ok {
		return exit
	}
	for _, kv := range slices.Sorted(slices.Values(env)) {
		fmt.Fprintln(stdout, kv)
	}
	paths, err := deviceFiles(*dir, env)
	if err != nil {
		fmt.Fprintln(stderr, "gpuload:", err)
		return 1
	}
	var held []*os.File
	defer func() {
		for _, f := range held {
			_ = f.Close()
		}
	}()
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			fmt.Fprintln(stderr, "gpuload:", err)
			return 1
		}
		held = append(held, f)
		fmt.Fprintln(stderr, "gpuload: holding", p)
	}
	<-ctx.Done()
	return 0
}

// deviceFiles are the paths of the device files to hold: those of the
// GPUs GPUPOOL_GPU_UUIDS names in env, else every file in dir (none when
// there is no dir: a pod given no GPU).
func deviceFiles(dir string, env []string) ([]string, error) {
	var uuids string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GPUPOOL_GPU_UUIDS="); ok {
			uuids = v
		}
	}
	var paths []string
	if uuids != "" {
		for _, u := range strings.Split(uuids, ",") {
			paths = append(paths, filepath.Join(dir, strings.TrimSpace(u)))
		}
		return paths, nil
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if !e.IsDir() {
			paths = append(paths, filepath.Join(dir, e.Name()))
		}
	}
	return paths, nil
}
