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
#
# `build.sh keda` builds KEDA too (keda/, a module pinning it): its
# operator and metrics server, keda-operator and keda-adapter, and its
# CRDs (ScaledObject, ScaledJob, TriggerAuthentication,
# ClusterTriggerAuthentication and the two the operator also watches),
# about 7 minutes more cold (811 CPU-seconds,
# docs/measurements/keda-build.md), for the TestKEDA* tests: the Makefile
# passes $(KUBE_EXTRAS), keda, to every call of this script (make kube,
# CI's early build, make e2e).
#
# `build.sh containerd` installs containerd 2 and its runc shim too
# (containerd/containerd-shim-runc-v2 in $dir/containerd2), which applies
# the CDI specs DRA drivers write, for the node tests of DRA's kubelet
# plugin: Debian's containerd 1.6 has no CDI.
set -euo pipefail
with_keda=
with_containerd=
for extra in "$@"; do
  case "$extra" in
    keda) with_keda=1 ;;
    containerd) with_containerd=1 ;;
    *)
      echo "usage: $0 [keda] [containerd]" >&2
      exit 2
      ;;
  esac
done
root="$(cd "$(dirname "$0")/../../.." && pwd)"
version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$root/cmd/gpupool-kube-scheduler/go.mod")"
kwok_version=v0.8.0
containerd_version=v2.4.2
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

# KEDA, when asked. keda-version, written last, names the version the
# files are of: a new pin builds them again, and a run stopped between the
# renames leaves no keda-version, so the next builds them again too.
if [ -n "$with_keda" ]; then
  keda_module="$root/test/e2e/kube/keda"
  keda=github.com/kedacore/keda/v2
  keda_version="$(awk -v m="$keda" '$1 == "require" && $2 == m {print $3}' "$keda_module/go.mod")"
  # All six of KEDA's CRDs: the operator watches CloudEventSource and
  # ClusterCloudEventSource too (cmd/operator/main.go sets up their
  # controllers), and controller-runtime stops its manager when a kind it
  # watches is not installed (after the cache-sync timeout, 2 minutes).
  keda_crds=(keda.sh_scaledobjects.yaml keda.sh_scaledjobs.yaml keda.sh_triggerauthentications.yaml keda.sh_clustertriggerauthentications.yaml
    eventing.keda.sh_cloudeventsources.yaml eventing.keda.sh_clustercloudeventsources.yaml)
  keda_built="$(cat "$dir/keda-version" 2>/dev/null || true)"
  for f in keda-operator keda-adapter "${keda_crds[@]}"; do
    [ -f "$dir/$f" ] || keda_built=
  done
  if [ "$keda_built" != "$keda_version" ]; then
    echo "building KEDA $keda_version's operator and metrics server into $dir (cold: about 7 minutes on 2 cores)" >&2
    # One go build: the two share most of their 3,700 packages.
    (cd "$keda_module" && go build -ldflags "-s -w -X $keda/version.Version=$keda_version" -o "$tmp/" "$keda/cmd/operator" "$keda/cmd/adapter")
    mv "$tmp/operator" "$tmp/keda-operator"
    mv "$tmp/adapter" "$tmp/keda-adapter"
    module="$(cd "$keda_module" && go list -m -f '{{.Dir}}' "$keda")"
    for f in "${keda_crds[@]}"; do
      cp "$module/config/crd/bases/$f" "$tmp/"
    done
    echo "$keda_version" >"$tmp/keda-version"
    for f in keda-operator keda-adapter "${keda_crds[@]}" keda-version; do
      mv "$tmp/$f" "$dir/$f"
    done
  fi
fi

# containerd 2, when asked: go install, as its go.mod has no replace.
if [ -n "$with_containerd" ] && { [ ! -x "$dir/containerd2/containerd" ] || [ ! -x "$dir/containerd2/containerd-shim-runc-v2" ]; }; then
  echo "installing containerd $containerd_version into $dir/containerd2" >&2
  mkdir -p "$tmp/containerd2"
  GOBIN="$tmp/containerd2" go install -ldflags "-s -w" \
    "github.com/containerd/containerd/v2/cmd/containerd@$containerd_version" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$containerd_version"
  rm -rf "$dir/containerd2"
  mv "$tmp/containerd2" "$dir/containerd2"
fi
echo "$dir"
