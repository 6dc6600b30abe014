#!/usr/bin/env bash
# Regenerate the kubelet PodResources v1 Python stubs in src/gpuhealth/agent/podresources/_pb/ from the
# local copy of the proto (src/gpuhealth/agent/podresources/api.proto).
#
# The local copy is k8s.io/kubelet@v0.36.3 pkg/apis/podresources/v1/api.proto with any
# gogo.proto imports and options stripped (v0.36.3 carries none); messages, services, the
# package name (v1) and field numbers are identical, so the stubs speak to a real kubelet.
# Refresh the copy with:
#   cp "$(go env GOMODCACHE)/k8s.io/kubelet@v0.36.3/pkg/apis/podresources/v1/api.proto" \
#      src/gpuhealth/agent/podresources/api.proto && sed -i '/gogo/d' src/gpuhealth/agent/podresources/api.proto
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
OUT=src/gpuhealth/agent/podresources/_pb
mkdir -p "$OUT"
"$PY" -m grpc_tools.protoc -I src/gpuhealth/agent/podresources \
  --python_out="$OUT" --grpc_python_out="$OUT" api.proto
# grpc_tools writes an absolute "import api_pb2"; make it package-relative.
sed -i 's/^import api_pb2 as api__pb2$/from . import api_pb2 as api__pb2/' "$OUT/api_pb2_grpc.py"
cat > "$OUT/__init__.py" <<'PY'
"""Generated kubelet PodResources v1 stubs (hack/gen-podresources.sh). Do not edit."""
PY
