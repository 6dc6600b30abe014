#!/usr/bin/env bash
# Regenerate the kubelet device-plugin v1beta1 Python stubs in localkube/deviceplugin/_pb/
# from the local copy of the proto (localkube/deviceplugin/deviceplugin.proto). Dev tooling: the
# test device plugin of localkube's real node uses them; the wheel does not ship them.
#
# The local copy is k8s.io/kubelet@v0.36.3 pkg/apis/deviceplugin/v1beta1/api.proto, unchanged
# (it carries no gogo.proto imports or options) but renamed: protobuf's descriptor pool is keyed
# by file name, and the agent's PodResources stubs are an api.proto too. Refresh it with:
#   cp "$(go env GOMODCACHE)/k8s.io/kubelet@v0.36.3/pkg/apis/deviceplugin/v1beta1/api.proto" \
#      localkube/deviceplugin/deviceplugin.proto
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
OUT=localkube/deviceplugin/_pb
mkdir -p "$OUT"
"$PY" -m grpc_tools.protoc -I localkube/deviceplugin \
  --python_out="$OUT" --grpc_python_out="$OUT" deviceplugin.proto
# grpc_tools writes an absolute import; make it package-relative.
sed -i 's/^import deviceplugin_pb2 as deviceplugin__pb2$/from . import deviceplugin_pb2 as deviceplugin__pb2/' \
  "$OUT/deviceplugin_pb2_grpc.py"
cat > "$OUT/__init__.py" <<'PY'
"""Generated kubelet device-plugin v1beta1 stubs (hack/gen-deviceplugin.sh). Do not edit."""
PY
