#!/usr/bin/env bash
# Builds what the end-to-end tests start into $KUBE_BIN_DIR, once: the
# control plane (kube-apiserver, kube-controller-manager, kube-scheduler),
# the kubelet and kube-proxy at the version cmd/gpupool-kube-scheduler pins, in one go
# build, which compiles the packages they share once; kwok; CoreDNS, the
# cluster DNS of the tests whose components run as pods; and the Kubeflow
# training operator with its TFJob CRD and ClusterRole. What is there is
# reused while the pins are unchanged; each file appears whole or not at
# all, and a second run waits for the first (CI starts one early, beside
# the unit tests). Cold, on 2 cores, this takes about 19 minutes. The last
# line of output is the directory.
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$root/cmd/gpupool-kube-scheduler/go.mod")"
kwok_version=v0.8.0
training_operator=github.com/kubeflow/training-operator
training_operator_version=v1.8.1
dir="${KUBE_BIN_DIR:-$HOME/.cache/gpupool/kube-$version}"
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
# Everything is built here first, then renamed into $dir.
tmp="$(mktemp -d "$dir/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
export GOTOOLCHAIN=local

kube_cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
missing=()
for cmd in "${kube_cmds[@]}"; do
  [ -x "$dir/$cmd" ] || missing+=("$cmd")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "building ${kube_cmds[*]} $version into $dir (cold: about 14 minutes on 2 cores)" >&2
  "$root/cmd/gpupool-kube-scheduler/build.sh" "$tmp" "${kube_cmds[@]/#/k8s.io/kubernetes/cmd/}"
  for cmd in "${kube_cmds[@]}"; do
    mv "$tmp/$cmd" "$dir/$cmd"
  done
fi

# go_install installs the command bin of pkg@version into $dir.
go_install() {
  local bin="$1" pkg="$2"
  if [ ! -x "$dir/$bin" ]; then
    echo "installing $pkg into $dir" >&2
    GOBIN="$tmp" go install -ldflags "-s -w" "$pkg"
    mv "$tmp/$bin" "$dir/$bin"
  fi
}
go_install kwok "sigs.k8s.io/kwok/cmd/kwok@$kwok_version"
# CoreDNS with the plugins the tests' Corefile uses (coredns/, a module
# pinning the version).
if [ ! -x "$dir/coredns" ]; then
  echo "building CoreDNS into $dir" >&2
  (cd "$root/test/e2e/kube/coredns" && go build -ldflags "-s -w" -o "$tmp/coredns" .)
  mv "$tmp/coredns" "$dir/coredns"
fi
go_install training-operator.v1 "$training_operator/cmd/training-operator.v1@$training_operator_version"

# The operator's module ships the TFJob CRD and the ClusterRole it runs
# under; the tests install them from here.
if [ ! -f "$dir/kubeflow.org_tfjobs.yaml" ] || [ ! -f "$dir/training-operator-role.yaml" ]; then
  module="$(go mod download -json "$training_operator@$training_operator_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
  cp "$module/manifests/base/crds/kubeflow.org_tfjobs.yaml" "$tmp/"
  cp "$module/manifests/base/rbac/role.yaml" "$tmp/training-operator-role.yaml"
  mv "$tmp/kubeflow.org_tfjobs.yaml" "$tmp/training-operator-role.yaml" "$dir/"
fi
echo "$dir"
