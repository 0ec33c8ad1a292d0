package kube

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"

	"github.com/gpupool/gpupool/internal/ociimage"
)

// pausePackage is every pod sandbox's process.
const pausePackage = "github.com/gpupool/gpupool/test/e2e/kube/pause"

// BuildProgramImage builds the main package pkg of this module (an import
// path, such as test/e2e/gpuload's) as a static binary, and writes an image
// ref that holds it alone, as /<name> and its entrypoint, into a tarball in
// dir for ImportImages. It returns the tarball's path.
func BuildProgramImage(ctx context.Context, dir, ref, pkg string) (string, error) {
	name := path.Base(pkg)
	bin := filepath.Join(dir, name)
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, pkg)
	// Static: the image has no C library.
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %w: %s", pkg, err, out)
	}
	image, err := ociimage.Build(ociimage.Image{
		Ref:        ref,
		Layers:     [][]ociimage.File{{{Path: name, Mode: 0o755, Source: bin}}},
		Entrypoint: []string{"/" + name},
	})
	if err != nil {
		return "", err
	}
	tarball := filepath.Join(dir, name+"-image.tar")
	return tarball, ociimage.WriteTarball(tarball, image)
}
