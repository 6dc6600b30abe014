#!/usr/bin/env bash
# Build (once) and print the directory holding the pinned Kubernetes test binaries:
# kube-apiserver, kube-scheduler, etcd, kwok, helm. Cached outside the repo, keyed by version.
# With --node, also what a real worker node needs (localkube's node harness, `make e2e`):
# kubelet, kube-proxy, kube-controller-manager (same Kubernetes version, same wrapper module)
# and CoreDNS, each a separately cached step into the same directory.
# KUBEBUILDER_ASSETS, when set, is used as is and nothing is built.
set -euo pipefail

NODE=0
case "${1:-}" in
  "") ;;
  --node) NODE=1 ;;
  *) echo "usage: $0 [--node]" >&2; exit 2 ;;
esac

KUBE_VERSION="${KUBE_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.14.7}"
CACHE_ROOT="${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}"
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="$CACHE_ROOT/bin/k8s-$KUBE_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION"

log() { echo "kube-binaries: $*" >&2; }
coredns_stamp() { echo "$COREDNS_VERSION $(sha256sum "$HERE/coredns/main.go" | cut -c1-16)"; }

node_bins=(kubelet kube-proxy kube-controller-manager coredns)

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  need=(kube-apiserver etcd)
  [[ $NODE -eq 1 ]] && need+=("${node_bins[@]}")
  for b in "${need[@]}"; do
    [[ -x "$KUBEBUILDER_ASSETS/$b" ]] || { log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no executable $b"; exit 1; }
  done
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

want=(kube-apiserver kube-scheduler etcd kwok helm)
[[ $NODE -eq 1 ]] && want+=("${node_bins[@]}")
find_missing() {
  missing=()
  for b in "${want[@]}"; do [[ -x "$OUT/$b" ]] || missing+=("$b"); done
  # CoreDNS's version is not in the directory's name: a stamp says which one is there.
  if [[ $NODE -eq 1 && -x "$OUT/coredns" && "$(cat "$OUT/coredns.version" 2>/dev/null)" != "$(coredns_stamp)" ]]; then
    missing+=(coredns)
  fi
}
find_missing
if [[ ${#missing[@]} -eq 0 ]]; then echo "$OUT"; exit 0; fi

# One build at a time per cache (parallel `make` targets, several checkouts): wait for the
# other one, then build only what it did not.
mkdir -p "$OUT"
exec 9>"$OUT/.build.lock"
if ! flock -n 9; then
  log "another build into $OUT is running; waiting for it"
  flock 9
fi
find_missing
if [[ ${#missing[@]} -eq 0 ]]; then echo "$OUT"; exit 0; fi

if ! command -v go >/dev/null 2>&1; then
  log "Go is not installed, so the Kubernetes test binaries (${missing[*]}) cannot be built."
  log "Install Go 1.26+ (https://go.dev/dl/) or set KUBEBUILDER_ASSETS to a directory holding"
  log "${want[*]}."
  exit 2
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"

# The wrapper module of kubernetes#79384: require k8s.io/kubernetes and replace each staging
# module with its published version (the list comes from the pinned tag's own go.mod).
kube_wrapper() {  # dir cmd...
  local d="$1"; shift
  local minor="v0.${KUBE_VERSION#v1.}"
  mkdir -p "$d"
  local gomod
  gomod="$(cd "$d" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  local gover godebug
  gover="$(sed -n 's/^go \(.*\)/\1/p' "$gomod" | head -1)"
  godebug="$(sed -n '/^godebug/,/^)/p;/^godebug [^(]/p' "$gomod")"
  mapfile -t staging < <(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/k8s.io/.*#\1#p' "$gomod")
  {
    echo "module gpuhealth.local/kubebins"
    echo "go $gover"
    [[ -n "$godebug" ]] && echo "$godebug"
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo "replace ("
    for m in "${staging[@]}"; do echo "  $m => $m $minor"; done
    echo ")"
  } > "$d/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for cmd in "$@"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$cmd"; done
    printf ')\n'
  } > "$d/tools.go"
  (cd "$d" && go mod tidy)
  local ld="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION"
  for cmd in "$@"; do
    (cd "$d" && go build -trimpath -ldflags "$ld" -o "$OUT/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
    mv "$OUT/$cmd.tmp" "$OUT/$cmd"
  done
}

build_kube() {
  log "building kube-apiserver and kube-scheduler $KUBE_VERSION (first time only, ~10-20 min)"
  kube_wrapper "$work/kube" kube-apiserver kube-scheduler
}

build_kube_node() {  # a separate cached step: the control-plane binaries may already be there
  log "building kubelet, kube-proxy and kube-controller-manager $KUBE_VERSION (first time only)"
  kube_wrapper "$work/kube-node" kubelet kube-proxy kube-controller-manager
}

# CoreDNS with only the plugins a test cluster needs (hack/coredns/main.go).
build_coredns() {
  log "building coredns $COREDNS_VERSION"
  local d="$work/coredns"; mkdir -p "$d"
  printf 'module gpuhealth.local/corednsbin\ngo 1.25.0\nrequire github.com/coredns/coredns %s\n' "$COREDNS_VERSION" > "$d/go.mod"
  cp "$HERE/coredns/main.go" "$d/main.go"
  (cd "$d" && go mod tidy && go build -trimpath -ldflags "-s -w" -o "$OUT/coredns.tmp" .)
  mv "$OUT/coredns.tmp" "$OUT/coredns"
  coredns_stamp > "$OUT/coredns.version"
}

build_etcd() {
  log "building etcd $ETCD_VERSION"
  local d="$work/etcd"; mkdir -p "$d"
  printf 'module gpuhealth.local/etcdbin\ngo 1.24\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > "$d/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > "$d/tools.go"
  (cd "$d" && go mod tidy && go build -trimpath -ldflags "-s -w" -o "$OUT/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$OUT/etcd.tmp" "$OUT/etcd"
}

build_gobin() {  # name module@version
  log "building $1 ($2)"
  GOBIN="$work/gobin" go install -trimpath -ldflags "-s -w" "$2"
  mv "$work/gobin/$1" "$OUT/$1"
}

for b in "${missing[@]}"; do
  case "$b" in
    kube-apiserver|kube-scheduler) [[ -x "$OUT/kube-apiserver" && -x "$OUT/kube-scheduler" ]] || build_kube ;;
    kubelet|kube-proxy|kube-controller-manager)
      [[ -x "$OUT/kubelet" && -x "$OUT/kube-proxy" && -x "$OUT/kube-controller-manager" ]] || build_kube_node ;;
    coredns) build_coredns ;;
    etcd) build_etcd ;;
    kwok) build_gobin kwok "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" ;;
    helm) build_gobin helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" ;;
  esac
done
log "binaries ready in $OUT"
echo "$OUT"
