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

kube_dir=$cache/kubernetes-$kube_ver-stamped
etcd_dir=$cache/etcd-$etcd_ver
mkdir -p "$kube_dir" "$etcd_dir"

# Stamp the version the way Kubernetes' own build does: unstamped binaries report
# v0.0.0-master+$Format:%H$, and kubectl version then fails to parse it.
minor=${kube_ver#v1.}; minor=${minor%%.*}
kube_ldflags="-s"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$kube_ver -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done

build() { # dir pkg out [ldflags]
  local dir=$1 pkg=$2 out=$3 ldflags=${4:--s}
  if [ -x "$out" ]; then return 0; fi
  echo "cluster-bins: building $(basename "$out") ($pkg) ..." >&2
  local start=$SECONDS
  (cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags="$ldflags" -o "$out.tmp" "$pkg")
  mv "$out.tmp" "$out"
  echo "cluster-bins: built $(basename "$out") in $((SECONDS - start))s" >&2
}

build "$root/tools/etcd" . "$etcd_dir/etcd"
build "$root/tools/kube" k8s.io/kubernetes/cmd/kube-apiserver "$kube_dir/kube-apiserver" "$kube_ldflags"
build "$root/tools/kube" k8s.io/kubernetes/cmd/kubectl "$kube_dir/kubectl" "$kube_ldflags"

# One stable place for the harness to look: .cache/bin/current -> the pinned versions.
mkdir -p "$cache/current"
ln -sf "$etcd_dir/etcd" "$cache/current/etcd"
ln -sf "$kube_dir/kube-apiserver" "$cache/current/kube-apiserver"
ln -sf "$kube_dir/kubectl" "$cache/current/kubectl"
echo "$cache/current"
