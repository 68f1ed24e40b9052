#!/usr/bin/env bash
# Builds the real control plane the tests run against: etcd, kube-apiserver and kubectl, from the
# pinned modules in tools/etcd and tools/kube, into a git-ignored cache keyed by version.
# Prints the cache directory on its last line. A second run with the cache present does nothing.
#
#   hack/cluster-bins.sh            build what is missing
#   WATCHSAN_BIN_CACHE=DIR ...      cache elsewhere (default: .cache/bin in the repository)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${WATCHSAN_BIN_CACHE:-$root/.cache/bin}

modver() { # module version pinned in a go.mod
  awk -v m="$2" '$1==m && $2 ~ /^v/ {print $2; exit} $1=="require" && $2==m {print $3; exit}' "$1"
}
kube_ver=$(modver "$root/tools/kube/go.mod" k8s.io/kubernetes)
etcd_ver=$(modver "$root/tools/etcd/go.mod" go.etcd.io/etcd/server/v3)
[ -n "$kube_ver" ] && [ -n "$etcd_ver" ] || { echo "cluster-bins: cannot read pinned versions" >&2; exit 1; }

kube_dir=$cache/kubernetes-$kube_ver
etcd_dir=$cache/etcd-$etcd_ver
mkdir -p "$kube_dir" "$etcd_dir"

build() { # dir pkg out
  local dir=$1 pkg=$2 out=$3
  if [ -x "$out" ]; then return 0; fi
  echo "cluster-bins: building $(basename "$out") ($pkg) ..." >&2
  local start=$SECONDS
  (cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags=-s -o "$out.tmp" "$pkg")
  mv "$out.tmp" "$out"
  echo "cluster-bins: built $(basename "$out") in $((SECONDS - start))s" >&2
}

build "$root/tools/etcd" . "$etcd_dir/etcd"
build "$root/tools/kube" k8s.io/kubernetes/cmd/kube-apiserver "$kube_dir/kube-apiserver"
build "$root/tools/kube" k8s.io/kubernetes/cmd/kubectl "$kube_dir/kubectl"

# One stable place for the harness to look: .cache/bin/current -> the pinned versions.
mkdir -p "$cache/current"
ln -sf "$etcd_dir/etcd" "$cache/current/etcd"
ln -sf "$kube_dir/kube-apiserver" "$cache/current/kube-apiserver"
ln -sf "$kube_dir/kubectl" "$cache/current/kubectl"
echo "$cache/current"
