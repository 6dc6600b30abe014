#!/usr/bin/env bash
# Build (once) and print the directory holding the pinned Kubernetes test binaries:
# kube-apiserver, kube-scheduler, etcd, kwok, helm. Cached outside the repo, keyed by version.
# KUBEBUILDER_ASSETS, when set, is used as is and nothing is built.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE_ROOT="${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}"
OUT="$CACHE_ROOT/bin/k8s-$KUBE_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION"

log() { echo "kube-binaries: $*" >&2; }

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  for b in kube-apiserver etcd; do
    [[ -x "$KUBEBUILDER_ASSETS/$b" ]] || { log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no executable $b"; exit 1; }
  done
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

want=(kube-apiserver kube-scheduler etcd kwok helm)
missing=()
for b in "${want[@]}"; do [[ -x "$OUT/$b" ]] || missing+=("$b"); done
if [[ ${#missing[@]} -eq 0 ]]; then echo "$OUT"; exit 0; fi

if ! command -v go >/dev/null 2>&1; then
  log "Go is not installed, so the Kubernetes test binaries (${missing[*]}) cannot be built."
  log "Install Go 1.26+ (https://go.dev/dl/) or set KUBEBUILDER_ASSETS to a directory holding"
  log "kube-apiserver, kube-scheduler, etcd and kwok."
  exit 2
fi

mkdir -p "$OUT"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"

build_kube() {
  log "building kube-apiserver and kube-scheduler $KUBE_VERSION (first time only, ~10-20 min)"
  local minor="v0.${KUBE_VERSION#v1.}"
  local d="$work/kube"; mkdir -p "$d"
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
  cat > "$d/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
  (cd "$d" && go mod tidy)
  local ld="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION"
  for cmd in kube-apiserver kube-scheduler; do
    (cd "$d" && go build -trimpath -ldflags "$ld" -o "$OUT/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
    mv "$OUT/$cmd.tmp" "$OUT/$cmd"
  done
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
    etcd) build_etcd ;;
    kwok) build_gobin kwok "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" ;;
    helm) build_gobin helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" ;;
  esac
done
log "binaries ready in $OUT"
echo "$OUT"
