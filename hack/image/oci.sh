# Shared by hack/image/build.sh and hack/image/pause.sh (sourced, not run): turn layer
# tarballs into an OCI image and write it as an OCI archive that `ctr images import`,
# `podman load` and `skopeo copy` accept. No daemon, no registry: umoci builds the layout,
# skopeo writes the archive.

# layer_tar ROOT OUT PATH... — a reproducible layer of ROOT/PATH...: sorted, numeric root
# ownership, every mtime clamped to SOURCE_DATE_EPOCH, no atime/ctime.
layer_tar() {
  local root="$1" out="$2"; shift 2
  tar --create --file "$out" --directory "$root" --sort=name --numeric-owner \
    --owner=0 --group=0 --mtime="@${SOURCE_DATE_EPOCH}" --clamp-mtime \
    --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    "$@"
}

# oci_archive OUT REF LAYOUT -- CONFIG_ARGS... -- LAYER.tar... — a one-platform image (linux,
# amd64) with the given layers (first = bottom) and `umoci config` arguments, written to OUT
# as an OCI archive whose index names it REF (also in io.containerd.image.name, so that
# containerd imports it under that name).
oci_archive() {
  local out="$1" ref="$2" layout="$3"; shift 3
  [[ "$1" == "--" ]] || { echo "oci_archive: expected --" >&2; return 2; }
  shift
  local config=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do config+=("$1"); shift; done
  shift
  local created
  created="$(date -u -d "@${SOURCE_DATE_EPOCH}" +%Y-%m-%dT%H:%M:%SZ)"
  rm -rf "$layout"
  umoci init --layout "$layout"
  umoci new --image "$layout:build"
  local layer
  for layer in "$@"; do
    umoci raw add-layer --image "$layout:build" --history.created "$created" \
      --history.created_by "$(basename "$layer" .tar)" "$layer"
  done
  umoci config --image "$layout:build" --created "$created" --history.created "$created" \
    --architecture amd64 --os linux "${config[@]}"
  umoci gc --layout "$layout"
  local tmp="$out.tmp.$$"
  rm -f "$tmp"
  skopeo copy --quiet "oci:$layout:build" "oci-archive:$tmp:$ref"
  _name_index "$tmp" "$ref"
  mv "$tmp" "$out"
}

# containerd reads the image name from io.containerd.image.name (a full reference); the OCI
# ref.name annotation skopeo writes is meant for a tag. Add the former to the index.
_name_index() {
  local archive="$1" ref="$2" dir
  dir="$(mktemp -d)"
  tar -xf "$archive" -C "$dir"
  python3 - "$dir/index.json" "$ref" <<'PY'
import json
import sys

path, ref = sys.argv[1], sys.argv[2]
with open(path) as f:
    index = json.load(f)
for manifest in index["manifests"]:
    manifest.setdefault("annotations", {})["io.containerd.image.name"] = ref
with open(path, "w") as f:
    json.dump(index, f, separators=(",", ":"), sort_keys=True)
PY
  layer_tar "$dir" "$archive" oci-layout index.json blobs
  rm -rf "$dir"
}
