#!/usr/bin/env bash
# Builds the control plane the end-to-end tests start (kube-apiserver,
# kube-controller-manager at tools/kube's pinned version, and kwok) into
# $KUBE_BIN_DIR, once: the binaries are reused while the pin is unchanged.
# Cold, on 2 cores, this takes about 10 minutes.
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$root/tools/kube/go.mod")"
kwok_version=v0.8.0
dir="${KUBE_BIN_DIR:-$HOME/.cache/gpupool/kube-$version}"
mkdir -p "$dir"

minor="$(echo "$version" | cut -d. -f2)"
ldflags=""
# Without a version the binaries say v0.0.0-master and kubectl refuses them.
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags="$ldflags -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
for cmd in kube-apiserver kube-controller-manager; do
  if [ ! -x "$dir/$cmd" ]; then
    echo "building $cmd $version into $dir (cold: minutes)" >&2
    (cd "$root/tools/kube" && GOTOOLCHAIN=local go build -trimpath -ldflags "$ldflags" -o "$dir/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
    mv "$dir/$cmd.tmp" "$dir/$cmd"
  fi
done
if [ ! -x "$dir/kwok" ]; then
  echo "installing kwok $kwok_version into $dir" >&2
  GOBIN="$dir" GOTOOLCHAIN=local go install "sigs.k8s.io/kwok/cmd/kwok@$kwok_version"
fi
echo "$dir"
