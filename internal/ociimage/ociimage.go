// Package ociimage builds container images from files on this machine,
// without Docker or a registry, and writes them into one tarball in the
// layout of `docker save`, which `ctr images import` reads, or pushes them.
//
// The images are reproducible: every entry has uid and gid 0, the Unix
// epoch as its time, and the entries are sorted; the config has no creation
// time. The same files give the same image ID anywhere, and the same digest
// with the same Go release (its gzip compresses the layers).
package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"runtime"
	"slices"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// A File is one file of a layer: its path in the image, its permission bits,
// and the file on this machine whose bytes it holds.
type File struct {
	Path   string // relative to the image's root: "usr/local/bin/gpupool"
	Mode   int64  // 0o755 for a program
	Source string
}

// An Image says what goes into one image, for Linux on this machine's
// architecture (the programs in it are built for it, or this program would
// not run either). Layers are applied in order; the directories above each
// file are added to its layer with mode 0755.
type Image struct {
	Ref        string // "gpupool/gpupool:v0.1.0"; a bare name means Docker Hub, as with docker
	Layers     [][]File
	Entrypoint []string
	Env        []string
	Labels     map[string]string
	User       string
}

// Built is an image assembled in memory, ready to be written or pushed.
type Built struct {
	Ref string // where WriteTarball puts it
	// Digest is the manifest's: what a registry reports after a push.
	// `ctr images import` writes a manifest of its own, with another digest.
	Digest string
	ID     string // the config's digest: the image ID crictl shows, kept by any import
	Size   int64  // the compressed layers and the config: what a pull downloads
	image  v1.Image
}

// epoch is every entry's time: a build does not depend on when it ran.
var epoch = time.Unix(0, 0)

// Build reads the image's files and assembles it.
func Build(spec Image) (Built, error) {
	if _, err := name.NewTag(spec.Ref); err != nil {
		return Built{}, fmt.Errorf("image %q: %w", spec.Ref, err)
	}
	layers := make([]v1.Layer, 0, len(spec.Layers))
	for i, files := range spec.Layers {
		layer, err := buildLayer(files)
		if err != nil {
			return Built{}, fmt.Errorf("image %s, layer %d: %w", spec.Ref, i, err)
		}
		layers = append(layers, layer)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return Built{}, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return Built{}, err
	}
	cfg.OS = "linux"
	cfg.Architecture = runtime.GOARCH
	cfg.Config.Entrypoint = spec.Entrypoint
	cfg.Config.Env = spec.Env
	cfg.Config.Labels = spec.Labels
	cfg.Config.User = spec.User
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return Built{}, err
	}
	return describe(spec.Ref, img)
}

func describe(ref string, img v1.Image) (Built, error) {
	digest, err := img.Digest()
	if err != nil {
		return Built{}, err
	}
	id, err := img.ConfigName()
	if err != nil {
		return Built{}, err
	}
	manifest, err := img.Manifest()
	if err != nil {
		return Built{}, err
	}
	size := manifest.Config.Size
	for _, layer := range manifest.Layers {
		size += layer.Size
	}
	return Built{Ref: ref, Digest: digest.String(), ID: id.String(), Size: size, image: img}, nil
}

// buildLayer writes files, and the directories above them, into one
// uncompressed tar in memory, sorted by path.
func buildLayer(files []File) (v1.Layer, error) {
	entries := map[string]*tar.Header{}
	sources := map[string]string{}
	for _, f := range files {
		p := path.Clean(f.Path)
		if !fs.ValidPath(p) || p == "." {
			return nil, fmt.Errorf("%q: not a path inside the image", f.Path)
		}
		if _, dup := entries[p]; dup {
			return nil, fmt.Errorf("%s: twice in one layer, or a file where a directory is", p)
		}
		entries[p] = &tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: f.Mode}
		sources[p] = f.Source
		for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
			if parent, seen := entries[dir]; seen {
				if parent.Typeflag != tar.TypeDir {
					return nil, fmt.Errorf("%s: a file where %s needs a directory", dir, p)
				}
				break // and so are the directories above it
			}
			entries[dir] = &tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755}
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range slices.Sorted(maps.Keys(entries)) {
		hdr := entries[p]
		hdr.ModTime = epoch
		var data []byte
		if hdr.Typeflag == tar.TypeReg {
			var err error
			if data, err = os.ReadFile(sources[p]); err != nil {
				return nil, err
			}
			hdr.Size = int64(len(data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layer)), nil
	}, tarball.WithCompressedCaching)
}

// WriteTarball writes the images into one tarball at path, each under its
// Ref, in the layout `docker save` writes.
func WriteTarball(path string, images ...Built) error {
	refs := make(map[name.Reference]v1.Image, len(images))
	for _, b := range images {
		tag, err := name.NewTag(b.Ref)
		if err != nil {
			return err
		}
		refs[tag] = b.image
	}
	return tarball.MultiRefWriteToFile(path, refs)
}

// Push uploads the image to ref, a registry's repository and tag, with the
// credentials `docker login` or `crane auth login` left in
// ~/.docker/config.json. The registry reports b.Digest for it.
func Push(ctx context.Context, b Built, ref string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	return remote.Write(tag, b.image, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain))
}
