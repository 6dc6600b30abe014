#!/usr/bin/env bash
# Build (once) and print the path of the test node's pause image: an OCI archive holding one
# static Go binary (hack/image/pause/main.go), named localhost/gpuhealth/pause:<hash>. It is
# containerd's sandbox image on localkube's node and the image of test workload pods (they
# only need to run, not to do anything). Cached outside the repo, keyed by the source hash.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=hack/image/oci.sh
source hack/image/oci.sh

CACHE_ROOT="${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}"
key="$(cat hack/image/pause/main.go hack/image/pause.sh hack/image/oci.sh | sha256sum | cut -c1-12)"
out="$CACHE_ROOT/images/pause-$key.tar"
if [[ -s "$out" ]]; then echo "$out"; exit 0; fi

log() { echo "pause-image: $*" >&2; }
command -v go >/dev/null 2>&1 || { log "Go is needed to build the pause image"; exit 2; }
for tool in umoci skopeo; do
  command -v "$tool" >/dev/null 2>&1 || { log "$tool is missing (bash hack/system-deps.sh installs it)"; exit 1; }
done
export SOURCE_DATE_EPOCH=0
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/root" "$(dirname "$out")"
(cd hack/image/pause && CGO_ENABLED=0 GOFLAGS=-buildvcs=false GO111MODULE=off \
  go build -trimpath -ldflags "-s -w" -o "$work/root/pause" main.go)
layer_tar "$work/root" "$work/pause.tar" pause
oci_archive "$work/image.tar" "localhost/gpuhealth/pause:$key" "$work/layout" -- \
  --config.entrypoint /pause --config.user 65535:65535 -- "$work/pause.tar"
mv "$work/image.tar" "$out"
log "built $out"
echo "$out"
