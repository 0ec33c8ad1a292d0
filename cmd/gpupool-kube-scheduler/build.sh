#!/usr/bin/env bash
# Builds gpupool-kube-scheduler, or the packages named after the directory,
# into the directory $1, with the version of the Kubernetes release this
# module pins (go.mod's k8s.io/kubernetes), which kube-scheduler and the
# other components report (without it they say v0.0.0-master, which
# kubectl refuses). `make image-binaries`, the end-to-end tests and
# test/e2e/kube/build.sh (the upstream components the tests start, from
# the same dependency graph, so that each package is compiled once) build
# through it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(realpath "$1")"
shift
packages=("$@")
[ ${#packages[@]} -gt 0 ] || packages=(.)
version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$here/go.mod")"
minor="$(echo "$version" | cut -d. -f2)"
# No symbol table or DWARF: smaller, and faster to link. Without local
# paths, so that an image built from the same commit anywhere is the same;
# the Makefile's GOFLAGS add grpcnotrace, as to every build, so that the
# tests and these share the Kubernetes packages they compile.
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags="$ldflags -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
cd "$here"
GOTOOLCHAIN=local exec go build -trimpath -ldflags "$ldflags" -o "$out/" "${packages[@]}"
