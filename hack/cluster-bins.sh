#!/usr/bin/env bash
# Builds the real cluster the tests run against, from the pinned modules in tools/etcd, tools/kube
# and tools/containerd, into a git-ignored cache keyed by version: etcd, kube-apiserver, kubectl,
# kube-controller-manager, kube-scheduler, a node's kubelet, kubemark (and hollow-node, its hollow
# kubelet bound to loopback), containerd v2 with its runc shim and ctr (runc itself is
# Debian's, installed by .ci/run), and the Helm CLI (tools/helm: `helm lint`/`helm template` of
# deploy/helm/watchsan, and the chart's install on the real node). Builds run under `nice -n 10`: the machine's cores are shared.
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
containerd_ver=$(modver "$root/tools/containerd/go.mod" github.com/containerd/containerd/v2)
helm_ver=$(modver "$root/tools/helm/go.mod" helm.sh/helm/v4)
[ -n "$kube_ver" ] && [ -n "$etcd_ver" ] && [ -n "$containerd_ver" ] && [ -n "$helm_ver" ] ||
  { echo "cluster-bins: cannot read pinned versions" >&2; exit 1; }

kube_dir=$cache/kubernetes-$kube_ver-stamped
etcd_dir=$cache/etcd-$etcd_ver
containerd_dir=$cache/containerd-$containerd_ver
helm_dir=$cache/helm-$helm_ver
mkdir -p "$kube_dir" "$etcd_dir" "$containerd_dir" "$helm_dir"

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
  (cd "$dir" && CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags="$ldflags" -o "$out.tmp" "$pkg")
  mv "$out.tmp" "$out"
  echo "cluster-bins: built $(basename "$out") in $((SECONDS - start))s" >&2
}

containerd_ldflags="-s -X github.com/containerd/containerd/v2/version.Version=$containerd_ver"

# One stable place for the harness to look: .cache/bin/current -> the pinned versions.
mkdir -p "$cache/current"
build "$root/tools/etcd" . "$etcd_dir/etcd"
ln -sf "$etcd_dir/etcd" "$cache/current/etcd"
for cmd in kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet kubemark; do
  build "$root/tools/kube" "k8s.io/kubernetes/cmd/$cmd" "$kube_dir/$cmd" "$kube_ldflags"
  ln -sf "$kube_dir/$cmd" "$cache/current/$cmd"
done
# kubemark's hollow kubelet on loopback, for the scenario's nodes (tools/kube/hollownode).
build "$root/tools/kube" ./hollownode "$kube_dir/hollow-node" "$kube_ldflags"
ln -sf "$kube_dir/hollow-node" "$cache/current/hollow-node"
for cmd in containerd containerd-shim-runc-v2 ctr; do
  build "$root/tools/containerd" "github.com/containerd/containerd/v2/cmd/$cmd" "$containerd_dir/$cmd" "$containerd_ldflags"
  ln -sf "$containerd_dir/$cmd" "$cache/current/$cmd"
done
# Helm stamps its version from these (unstamped it reports v4.x-dev, which charts' kubeVersion
# checks do not see).
helm_ldflags="-s -X helm.sh/helm/v4/internal/version.version=$helm_ver -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
build "$root/tools/helm" helm.sh/helm/v4/cmd/helm "$helm_dir/helm" "$helm_ldflags"
ln -sf "$helm_dir/helm" "$cache/current/helm"
echo "$cache/current"
