#!/usr/bin/env bash
# Install gpuhealth for the image's interpreter (Debian 12's /usr/bin/python3, CPython 3.11)
# under ROOT/usr/local: used by hack/image/build.sh (`make image`) and by the Containerfile, so
# that both images hold the same files.
#   install-python.sh deps ROOT         the locked dependencies (hack/image/requirements.lock)
#   install-python.sh app ROOT WHEEL    the project's wheel and its console scripts
# PY (default .venv/bin/python) runs pip; it may be another Python version: wheels are chosen
# for the target interpreter, never the host's.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PY:-.venv/bin/python}"
SITE=usr/local/lib/python3.11/dist-packages
mode="${1:?usage: install-python.sh deps ROOT | app ROOT WHEEL}"
root="${2:?ROOT missing}"

pip_target() {
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --no-compile \
    --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 \
    --platform manylinux_2_36_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
    --target "$root/$SITE" "$@"
  rm -rf "${root:?}/$SITE/bin"
}

case "$mode" in
  deps)
    pip_target --require-hashes -r hack/image/requirements.lock
    ;;
  app)
    wheel="${3:?WHEEL missing}"
    pip_target "$wheel"
    mkdir -p "$root/usr/local/bin"
    # pip --target writes no console scripts; write the wheel's, for /usr/bin/python3.
    "$PY" - "$root/$SITE" "$root/usr/local/bin" <<'PY'
import configparser
import pathlib
import sys

site, bindir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
(dist_info,) = site.glob("gpuhealth-*.dist-info")
# direct_url.json records the wheel's temporary path: drop it (and its RECORD line) so that
# the same source gives the same layer.
(dist_info / "direct_url.json").unlink(missing_ok=True)
record = dist_info / "RECORD"
lines = record.read_text().splitlines(keepends=True)
record.write_text("".join(line for line in lines if "/direct_url.json," not in line))
entry_points = dist_info / "entry_points.txt"
parser = configparser.ConfigParser()
parser.read(entry_points)
for name, target in parser["console_scripts"].items():
    module, func = target.split(":")
    script = bindir / name
    script.write_text(
        f"#!/usr/bin/python3\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n"
    )
    script.chmod(0o755)
PY
    ;;
  *)
    echo "usage: install-python.sh deps ROOT | app ROOT WHEEL" >&2
    exit 2
    ;;
esac
