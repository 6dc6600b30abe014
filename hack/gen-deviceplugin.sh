#!/usr/bin/env bash
# Regenerate the kubelet device-plugin v1beta1 Python stubs in localkube/deviceplugin/_pb/
# from the local copy of the proto (localkube/deviceplugin/api.proto). Dev tooling only: the
# test device plugin of localkube's real node uses them; the wheel does not ship them.
#
# The local copy is k8s.io/kubelet@v0.36.3 pkg/apis/deviceplugin/v1beta1/api.proto, unchanged
# (it carries no gogo.proto imports or options). Refresh it with:
#   cp "$(go env GOMODCACHE)/k8s.io/kubelet@v0.36.3/pkg/apis/deviceplugin/v1beta1/api.proto" \
#      localkube/deviceplugin/api.proto
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
OUT=localkube/deviceplugin/_pb
mkdir -p "$OUT"
"$PY" -m grpc_tools.protoc -I localkube/deviceplugin \
  --python_out="$OUT" --grpc_python_out="$OUT" api.proto
# grpc_tools writes an absolute "import api_pb2"; make it package-relative.
sed -i 's/^import api_pb2 as api__pb2$/from . import api_pb2 as api__pb2/' "$OUT/api_pb2_grpc.py"
cat > "$OUT/__init__.py" <<'PY'
"""Generated kubelet device-plugin v1beta1 stubs (hack/gen-deviceplugin.sh). Do not edit."""
PY
