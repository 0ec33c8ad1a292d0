// Command image builds gpupool's two container images from the binaries
// `make image` builds, writes them into one tarball and, when given a
// registry, pushes them there:
//
//   - gpupool/gpupool:VERSION holds every server-side binary in
//     /usr/local/bin, on PATH, run as 65532 with no entrypoint: the
//     manifests name the binary. gpupool-server is built with cgo, since
//     go-nvml loads libnvidia-ml.so.1 at run time, so the glibc of the
//     build machine is a layer of its own (docs/design.md, "Images");
//   - gpupool/gpupool-client:VERSION holds the static gpupool client alone.
//
// Make passes the binaries in one directory: gpupool is the client, every
// other file a server-side binary.
//
//	go run ./deploy/image -version v0.1.0 -bin bin/image/bin -out bin/image/gpupool-images.tar [-registry registry.example.com/team]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/gpupool/gpupool/internal/ociimage"
)

const (
	serverRepo = "gpupool/gpupool"
	clientRepo = "gpupool/gpupool-client"
	client     = "gpupool"
	binDir     = "usr/local/bin"
	// nonRoot is the user the manifests run as (runAsUser), for a plain
	// `docker run` too.
	nonRoot = "65532:65532"

	versionLabel = "org.opencontainers.image.version"
	// glibcLabel records the glibc in the server image: what its loader
	// says of itself.
	glibcLabel = "io.gpupool.glibc"
)

// nvmlLinks are the glibc libraries libnvidia-ml.so.1 links besides libc.
// The NVIDIA container runtime mounts the driver's libraries into the
// container, not glibc's: the image must have them.
var nvmlLinks = []string{"libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"}

func main() {
	version := flag.String("version", "", "the images' tag (make passes the VERSION file's)")
	bin := flag.String("bin", "", "the directory of the binaries: gpupool, the client, and the server-side ones")
	out := flag.String("out", "", "the tarball to write, for `ctr -n k8s.io images import`")
	registry := flag.String("registry", "", "also push the images to this registry and path, as REGISTRY/gpupool:VERSION and REGISTRY/gpupool-client:VERSION")
	flag.Parse()
	if *version == "" || *bin == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "image: -version, -bin and -out are required")
		os.Exit(2)
	}
	if err := run(context.Background(), os.Stdout, *version, *bin, *out, *registry); err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		os.Exit(1)
	}
}

// run builds the images of the binaries in bin, writes them to out and,
// when registry is not empty, pushes them there; it says so on w.
func run(ctx context.Context, w io.Writer, version, bin, out, registry string) error {
	specs, err := images(version, bin)
	if err != nil {
		return err
	}
	built := make([]ociimage.Built, 0, len(specs))
	for _, spec := range specs {
		b, err := ociimage.Build(spec)
		if err != nil {
			return err
		}
		built = append(built, b)
		// The ID as crictl shows it on a node where the tarball was
		// imported: ctr writes a manifest, and so a digest, of its own.
		id := strings.TrimPrefix(b.ID, "sha256:")[:13]
		fmt.Fprintf(w, "%-32s %s %6.1f MB  image ID %s\n", b.Ref, b.Digest, float64(b.Size)/1e6, id)
	}
	if err := ociimage.WriteTarball(out, built...); err != nil {
		return err
	}
	fmt.Fprintln(w, "wrote", out)
	if registry == "" {
		return nil
	}
	for _, b := range built {
		ref := pushRef(registry, b.Ref)
		if err := ociimage.Push(ctx, b, ref); err != nil {
			return fmt.Errorf("push %s: %w", ref, err)
		}
		fmt.Fprintln(w, "pushed", ref)
	}
	return nil
}

// pushRef is where ref goes in registry: the image's name, not its
// repository's Docker Hub owner, under the registry's path.
func pushRef(registry, ref string) string {
	return strings.TrimSuffix(registry, "/") + "/" + path.Base(ref)
}

// images says what goes into each image from the binaries in bin.
func images(version, bin string) ([]ociimage.Image, error) {
	entries, err := os.ReadDir(bin)
	if err != nil {
		return nil, err
	}
	var servers []string
	clientPath := ""
	for _, e := range entries {
		p := filepath.Join(bin, e.Name())
		if e.Name() == client {
			clientPath = p
		} else {
			servers = append(servers, p)
		}
	}
	if clientPath == "" || len(servers) == 0 {
		return nil, fmt.Errorf("%s: want %s and the server-side binaries", bin, client)
	}
	if interp, _, err := ociimage.Linking(clientPath); err != nil {
		return nil, err
	} else if interp != "" {
		return nil, fmt.Errorf("%s is linked dynamically: build it with CGO_ENABLED=0, it runs in users' images, whatever their libc", clientPath)
	}

	serverLabels := map[string]string{versionLabel: version}
	var serverLayers [][]ociimage.File
	libc, err := ociimage.GlibcOf(servers, nvmlLinks...)
	if err != nil {
		return nil, err
	}
	if libc.Files != nil {
		serverLayers = append(serverLayers, libc.Files)
		serverLabels[glibcLabel] = libc.Version
	}
	serverLayers = append(serverLayers, programs(servers))
	return []ociimage.Image{
		{
			Ref:    serverRepo + ":" + version,
			Layers: serverLayers,
			Env:    []string{"PATH=/" + binDir},
			Labels: serverLabels,
			User:   nonRoot,
		},
		{
			Ref:        clientRepo + ":" + version,
			Layers:     [][]ociimage.File{programs([]string{clientPath})},
			Entrypoint: []string{"/" + binDir + "/" + client},
			Labels:     map[string]string{versionLabel: version},
			User:       nonRoot,
		},
	}, nil
}

func programs(paths []string) []ociimage.File {
	files := make([]ociimage.File, 0, len(paths))
	for _, p := range paths {
		files = append(files, ociimage.File{Path: binDir + "/" + filepath.Base(p), Mode: 0o755, Source: p})
	}
	return files
}
