#!/usr/bin/env bash
# `make image`: the gpuhealth container image (both entry points, gpuhealth-agent and
# gpuhealth-controller), built without a container daemon or registry, written as an OCI
# archive for `ctr -n k8s.io images import`, `podman load` or `skopeo copy`.
#
#   layer 1  Debian 12 (bookworm) "essential" + python3, by mmdebstrap      (cached)
#   layer 2  the Python dependencies of hack/image/requirements.lock (pinned, hashes required)
#   layer 3  the project's wheel and the two entry-point scripts
#
# The Containerfile builds the same image with Docker/Podman (same base packages, lock file,
# layout, user and configuration). Inputs are pinned: the Debian suite (mirror: DEBIAN_MIRROR,
# e.g. a snapshot.debian.org URL for a byte-identical rebuild), the lock file (versions and
# sha256), the source tree; timestamps are SOURCE_DATE_EPOCH (default: the last commit's).
# The installed Debian package versions are written next to the archive (.packages).
#
# Output (dist/): gpuhealth-image.tar (OCI archive), gpuhealth-image.ref (the image's name),
# gpuhealth-image.packages. Needs root (mmdebstrap, chroot), mmdebstrap, umoci, skopeo
# (hack/system-deps.sh installs them). IMAGE_REFRESH=1 rebuilds the cached Debian layer.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
# shellcheck source=hack/image/oci.sh
source hack/image/oci.sh

PY="${PY:-.venv/bin/python}"
VERSION="$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
IMAGE_REPO="${IMAGE_REPO:-ghcr.io/gpuhealth/gpuhealth}"
IMAGE_TAG="${IMAGE_TAG:-$VERSION}"
REF="$IMAGE_REPO:$IMAGE_TAG"
DEBIAN_SUITE=bookworm
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PYTHON_SITE=usr/local/lib/python3.11/dist-packages
NONROOT_UID=65532
DIST="${DIST:-$ROOT/dist}"
CACHE_ROOT="${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}"
if [[ -z "${SOURCE_DATE_EPOCH:-}" ]]; then
  SOURCE_DATE_EPOCH="$(git log -1 --format=%ct 2>/dev/null || stat -c %Y pyproject.toml)"
fi
export SOURCE_DATE_EPOCH

log() { echo "image: $*" >&2; }
die() { log "$*"; exit 1; }

[[ $(id -u) -eq 0 ]] || die "make image needs root (mmdebstrap, chroot); without root, use the Containerfile with Docker or Podman"
for tool in mmdebstrap umoci skopeo; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (bash hack/system-deps.sh installs it)"
done

began=$SECONDS
work="$(mktemp -d "${TMPDIR:-/tmp}/gpuhealth-image.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$DIST" "$CACHE_ROOT/images"

# --- layer 1: Debian ----------------------------------------------------------------------
# Merged /usr through mmdebstrap's hook (the usrmerge package would pull in perl); no docs,
# man pages or translations; no device nodes (the runtime provides /dev); a nonroot user.
base_args=(
  # libstdc++6: grpcio's extension module links it (the essential set has only libgcc).
  --variant=essential --include=python3,libstdc++6
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --dpkgopt=path-exclude=/usr/share/doc/* --dpkgopt=path-include=/usr/share/doc/*/copyright
  --dpkgopt=path-exclude=/usr/share/man/* --dpkgopt=path-exclude=/usr/share/locale/*
  --dpkgopt=path-exclude=/usr/share/info/* --dpkgopt=path-exclude=/usr/share/lintian/*
  --skip=output/dev
  "--customize-hook=echo 'nonroot:x:$NONROOT_UID:$NONROOT_UID:nonroot:/nonexistent:/usr/sbin/nologin' >> \"\$1/etc/passwd\""
  "--customize-hook=echo 'nonroot:x:$NONROOT_UID:' >> \"\$1/etc/group\""
  "--customize-hook=rm -rf \"\$1\"/var/cache/* \"\$1\"/var/log/* \"\$1\"/var/lib/dpkg/*-old"
  "$DEBIAN_SUITE"
)
base_key="$(printf '%s\n' "${base_args[@]}" "$DEBIAN_MIRROR" "$(mmdebstrap --version)" | sha256sum | cut -c1-16)"
base="$CACHE_ROOT/images/debian-$DEBIAN_SUITE-python3-$base_key.tar"
if [[ -n "${IMAGE_REFRESH:-}" || ! -s "$base" ]]; then
  log "building the Debian $DEBIAN_SUITE base with mmdebstrap (cached as $base)"
  if ! mmdebstrap --format=tar "${base_args[@]}" "$base.tmp" "$DEBIAN_MIRROR" >"$work/mmdebstrap.log" 2>&1; then
    tail -n 30 "$work/mmdebstrap.log" >&2
    rm -f "$base.tmp"
    die "mmdebstrap failed"
  fi
  mv "$base.tmp" "$base"
fi
rootfs="$work/rootfs"
mkdir -p "$rootfs"
tar -xf "$base" -C "$rootfs" --numeric-owner
chroot "$rootfs" dpkg-query -W -f '${Package}=${Version}\n' > "$work/packages"
py_version="$(chroot "$rootfs" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[[ "$py_version" == 3.11 ]] || die "the base has Python $py_version; $PYTHON_SITE assumes 3.11"

# --- layer 2: Python dependencies ---------------------------------------------------------
compile() {  # PATH... inside the rootfs — hash-based .pyc: reproducible, never rewritten
  chroot "$rootfs" python3 -m compileall -q --invalidation-mode unchecked-hash "$@" >/dev/null
}
# Cached by what decides its content: the base, the lock file and the install script.
deps_key="$(cat hack/image/requirements.lock hack/image/install-python.sh | sha256sum | cut -c1-16)"
deps="$CACHE_ROOT/images/python-dependencies-$base_key-$deps_key.tar"
if [[ -n "${IMAGE_REFRESH:-}" || ! -s "$deps" ]]; then
  log "installing the locked Python dependencies (cached as $deps)"
  PY="$PY" hack/image/install-python.sh deps "$rootfs"
  compile "/$PYTHON_SITE"
  layer_tar "$rootfs" "$deps.tmp" "$PYTHON_SITE"
  mv "$deps.tmp" "$deps"
else
  tar -xf "$deps" -C "$rootfs" --numeric-owner
fi
cp "$deps" "$work/python-dependencies.tar"

# --- layer 3: gpuhealth -------------------------------------------------------------------
log "building the gpuhealth $VERSION wheel"
# From a copy of the files git knows (tracked, or new and not ignored): a stale build/ or
# egg-info in the checkout must not ship modules that no longer exist.
src="$work/src"
mkdir -p "$src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do if [[ -e "$f" || -L "$f" ]]; then printf '%s\0' "$f"; fi; done \
    | xargs -0 cp --parents -a -t "$src"
else  # not a git checkout (a source archive): what the Containerfile copies
  cp -a pyproject.toml README.md src "$src"/
fi
if ! "$PY" -m pip wheel --quiet --no-deps --no-build-isolation -w "$work/wheel" "$src" \
  >"$work/wheel.log" 2>&1; then
  cat "$work/wheel.log" >&2
  die "building the wheel failed"
fi
wheel="$(ls "$work"/wheel/gpuhealth-*.whl)"
app="$work/app"
PY="$PY" hack/image/install-python.sh app "$app" "$wheel"
mapfile -t app_paths < <(cd "$app" && find "$PYTHON_SITE" usr/local/bin -mindepth 1 -maxdepth 1 | sort)
cp -a "$app/." "$rootfs/"
compile "/$PYTHON_SITE/gpuhealth"
for entry in agent controller; do
  chroot "$rootfs" "/usr/local/bin/gpuhealth-$entry" --help >/dev/null \
    || die "gpuhealth-$entry --help failed inside the image"
done
# Every module of the package imports with the image's libraries (a missing shared library
# shows up here, not in a pod).
chroot "$rootfs" python3 -c '
import importlib, pkgutil, gpuhealth
for m in pkgutil.walk_packages(gpuhealth.__path__, "gpuhealth."):
    importlib.import_module(m.name)
' || die "a gpuhealth module does not import inside the image"
layer_tar "$rootfs" "$work/gpuhealth.tar" "${app_paths[@]}"

# --- the image ----------------------------------------------------------------------------
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
created="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"
# Layer 1 is mmdebstrap's own reproducible tarball, added as it is.
cp "$base" "$work/debian-$DEBIAN_SUITE.tar"
log "writing the OCI archive"
oci_archive "$work/image.tar" "$REF" "$work/layout" -- \
  --config.user "$NONROOT_UID:$NONROOT_UID" \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.env PYTHONDONTWRITEBYTECODE=1 --config.env PYTHONUNBUFFERED=1 \
  --config.cmd gpuhealth-controller --config.cmd --help \
  --config.workingdir / \
  --config.exposedports 8080/tcp --config.exposedports 9455/tcp \
  --config.label "org.opencontainers.image.title=gpuhealth" \
  --config.label "org.opencontainers.image.description=GPU node health agent and Kubernetes taint controller" \
  --config.label "org.opencontainers.image.version=$IMAGE_TAG" \
  --config.label "org.opencontainers.image.revision=$revision" \
  --config.label "org.opencontainers.image.created=$created" \
  --config.label "org.opencontainers.image.source=https://github.com/gpuhealth/gpuhealth" \
  --config.label "org.opencontainers.image.licenses=Apache-2.0" \
  --config.label "org.opencontainers.image.base.name=debian:$DEBIAN_SUITE" \
  -- "$work/debian-$DEBIAN_SUITE.tar" "$work/python-dependencies.tar" "$work/gpuhealth.tar"

mv "$work/image.tar" "$DIST/gpuhealth-image.tar"
echo "$REF" > "$DIST/gpuhealth-image.ref"
mv "$work/packages" "$DIST/gpuhealth-image.packages"
size_mib=$(( $(du -sk "$rootfs" | cut -f1) / 1024 ))
archive_mib=$(( $(stat -c %s "$DIST/gpuhealth-image.tar") / 1024 / 1024 ))
log "$REF: $DIST/gpuhealth-image.tar (${archive_mib} MiB compressed, ${size_mib} MiB unpacked) in $((SECONDS - began)) s"
