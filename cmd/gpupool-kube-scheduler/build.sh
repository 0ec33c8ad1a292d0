#!/usr/bin/env bash
# Builds gpupool-kube-scheduler into the directory $1, with the version of
# the kube-scheduler it is (go.mod's k8s.io/kubernetes), which it reports
# as kube-scheduler does; more arguments go to go build (-trimpath and the
# version are always there). `make image-binaries` and the end-to-end
# tests build it so; with the upstream binaries of test/e2e/kube/build.sh
# built, it compiles little of its own (about 1.5 minutes on 2 cores).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(realpath "$1")"
shift
version="$(awk '$1 == "k8s.io/kubernetes" {print $2}' "$here/go.mod")"
minor="$(echo "$version" | cut -d. -f2)"
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags="$ldflags -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
cd "$here"
GOTOOLCHAIN=local exec go build -trimpath -ldflags "$ldflags" "$@" -o "$out/" .
