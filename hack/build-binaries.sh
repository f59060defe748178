#!/usr/bin/env bash
# Build the local control plane's binaries from Go modules through the module proxy.
#
# Contract:
#   - Output: $TASKSHARD_BIN_CACHE/<component>-<version>/bin/<binary> (default cache: ~/.cache/taskshard/bin).
#     kubernetes-<v>/bin: kube-apiserver kube-controller-manager kube-scheduler kubectl
#     kubernetes-node-<v>/bin: kubelet kube-proxy, coredns-<v>/bin: coredns (only `node`, for the real-node tier;
#     not part of `all`)
#     etcd-<v>/bin: etcd        helm-<v>/bin: helm
#   - A component whose directory holds a `.complete` marker is reused, never rebuilt.
#   - Each component builds in a temporary directory and is moved into place only when complete,
#     so an interrupted build leaves nothing half-made behind.
#   - Fails with a clear message when Go or the module proxy is unavailable.
#   - Prints the cache directory of each component on stdout as `NAME=PATH` lines at the end.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${TASKSHARD_BIN_CACHE:-$HOME/.cache/taskshard/bin}
only=${1:-all}   # all | kubernetes | node | etcd | helm

log() { printf '[build-binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v go >/dev/null 2>&1 || die "Go is not installed (need go >= 1.24 on PATH); install Go and retry."
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
proxy=$(go env GOPROXY)

check_proxy() {
  local first=${proxy%%,*}
  [[ $first == direct || $first == off ]] && return 0
  curl -fsS -m 20 "$first/k8s.io/kubernetes/@v/list" >/dev/null 2>&1 \
    || die "the Go module proxy ($first) is not reachable; the binaries cannot be built. Set GOPROXY or pre-fill $cache."
}

# Compile with `go build -v` and print one progress line per 100 packages instead of every name.
go_build() {
  local out=$1; shift
  go build -v -trimpath -o "$out" "$@" 2>&1 | awk -v name="$(basename "$out")" '
    /^(go: |#|.*\.go:[0-9]+)/ { print; next }
    { n++; if (n % 100 == 0) { printf("  %s: %d packages compiled\n", name, n); fflush() } }
    END { printf("  %s: done (%d packages)\n", name, n) }' >&2
  [[ ${PIPESTATUS[0]} -eq 0 && -x $out ]] || die "go build of $* failed (see lines above)"
}

# Move a finished build into its cache directory and mark it complete: finish LABEL DEST WORK
finish() {
  rm -rf "$2"; mkdir -p "$2"; mv "$3/bin" "$2/bin"; rm -rf "$3"
  touch "$2/.complete"; log "$1: ready in $2"
}

# build_kubernetes NAME CMD...: build k8s.io/kubernetes/cmd/CMD for each CMD into $cache/NAME-<v>/bin.
build_kubernetes() {
  local name=$1; shift
  local v=$KUBERNETES_VERSION dest="$cache/$name-$KUBERNETES_VERSION" cmds=("$@")
  [[ -f $dest/.complete ]] && { log "$name $v: cached at $dest"; return; }
  check_proxy
  local minor=${v#v1.}; minor=${minor%%.*}
  local staging="v0.${v#v1.}" work; work=$(mktemp -d "$cache/.build-$name.XXXXXX")
  log "$name $v: preparing a wrapper module (staging modules pinned to $staging)"
  (
    cd "$work"
    go mod init taskshard.local/kubebuild >/dev/null 2>&1
    go mod edit -go=1.24.0 -require="k8s.io/kubernetes@$v"
    local gomod; gomod=$(go mod download -json "k8s.io/kubernetes@$v" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    [[ -f $gomod ]] || die "could not download k8s.io/kubernetes@$v from the module proxy"
    # Every `k8s.io/X => ./staging/src/k8s.io/X` becomes `k8s.io/X => k8s.io/X v0.N.P`.
    grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$gomod" | awk '{print $1}' | while read -r m; do
      go mod edit -replace="$m=$m@$staging"
    done
    { printf '//go:build tools\n\npackage tools\n\nimport (\n'
      printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "${cmds[@]}"
      printf ')\n'; } > tools.go
    log "$name $v: resolving dependencies (go mod tidy; downloads several hundred MB on a cold cache)"
    go mod tidy >&2 || die "go mod tidy failed for the kubernetes wrapper module"
    local pkg="k8s.io/component-base/version" cpkg="k8s.io/client-go/pkg/version"
    local ld="-s -w"
    for p in $pkg $cpkg; do
      ld+=" -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
    done
    local i=0
    for cmd in "${cmds[@]}"; do
      i=$((i + 1)); log "$name $v: building $cmd ($i/${#cmds[@]})"
      go_build "bin/$cmd" -ldflags "$ld" "k8s.io/kubernetes/cmd/$cmd"
    done
  ) || { rm -rf "$work"; exit 1; }
  finish "$name $v" "$dest" "$work"
}

# Build one binary from a module without replace directives of its own that bind us:
#   build_module NAME VERSION MODULE PACKAGE [LDFLAGS]   ->  $cache/NAME-VERSION/bin/NAME
build_module() {
  local name=$1 v=$2 module=$3 pkg=$4 ld=${5:-"-s -w"} dest="$cache/$1-$2"
  [[ -f $dest/.complete ]] && { log "$name $v: cached at $dest"; return; }
  check_proxy
  local work; work=$(mktemp -d "$cache/.build-$name.XXXXXX")
  log "$name $v: building $pkg through a wrapper module"
  (
    cd "$work"
    go mod init "taskshard.local/${name}build" >/dev/null 2>&1
    go mod edit -require="$module@$v"
    printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$pkg" > tools.go
    go mod tidy >&2 || die "go mod tidy failed for the $name wrapper module"
    go_build "bin/$name" -ldflags "$ld" "$pkg"
  ) || { rm -rf "$work"; exit 1; }
  finish "$name $v" "$dest" "$work"
}

build_etcd() { build_module etcd "$ETCD_VERSION" go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3; }

build_helm() {
  build_module helm "$HELM_VERSION" helm.sh/helm/v3 helm.sh/helm/v3/cmd/helm \
    "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
}

build_control_plane() { build_kubernetes kubernetes kube-apiserver kube-controller-manager kube-scheduler kubectl; }
build_node() {
  build_kubernetes kubernetes-node kubelet kube-proxy
  build_module coredns "$COREDNS_VERSION" github.com/coredns/coredns github.com/coredns/coredns
}

mkdir -p "$cache"
case $only in
  all) build_etcd; build_helm; build_control_plane ;;
  kubernetes) build_control_plane ;;
  node) build_node ;;
  etcd) build_etcd ;;
  helm) build_helm ;;
  *) die "unknown component '$only' (expected all, kubernetes, node, etcd or helm)" ;;
esac
echo "KUBERNETES_BIN=$cache/kubernetes-$KUBERNETES_VERSION/bin"
echo "ETCD_BIN=$cache/etcd-$ETCD_VERSION/bin"
echo "HELM_BIN=$cache/helm-$HELM_VERSION/bin"
if [[ $only == node ]]; then
  echo "KUBERNETES_NODE_BIN=$cache/kubernetes-node-$KUBERNETES_VERSION/bin"
  echo "COREDNS_BIN=$cache/coredns-$COREDNS_VERSION/bin"
fi
