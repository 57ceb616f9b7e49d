#!/usr/bin/env bash
# gen_protos.sh [OUT_DIR] - generate the Python protobuf + gRPC modules for the SkyWalking v3
# protocol from reporter_proc/protocol/skywalking/v3/*.proto with grpcio-tools.
#
# OUT_DIR defaults to reporter_proc/protocol/generated (the committed copy); tests regenerate
# into a temp dir and compare, so a .proto edit without a regeneration fails CI.
#
# protoc writes absolute imports ("from skywalking.v3 import common_pb2"), which would need the
# output folder on sys.path; the modules are flattened into one package and those imports are
# rewritten to relative ones so they live inside reporter_proc without touching sys.path. The
# descriptor file names stay "skywalking/v3/*.proto".
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PROTO_ROOT=$ROOT/reporter_proc/protocol
OUT=${1:-$PROTO_ROOT/generated}
PYTHON=${PYTHON:-python}

STAGE=$(mktemp -d -t swmp-protos.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT

cd "$PROTO_ROOT"
"$PYTHON" -m grpc_tools.protoc -I . \
  --python_out="$STAGE" --pyi_out="$STAGE" --grpc_python_out="$STAGE" \
  skywalking/v3/*.proto

mkdir -p "$OUT"
rm -f "$OUT"/*_pb2.py "$OUT"/*_pb2.pyi "$OUT"/*_pb2_grpc.py
for f in "$STAGE"/skywalking/v3/*.py "$STAGE"/skywalking/v3/*.pyi; do
  sed -E 's/^from skywalking\.v3 import /from . import /' "$f" > "$OUT/$(basename "$f")"
done
cat > "$OUT/__init__.py" <<'PY'
"""Generated SkyWalking v3 protocol modules: do not edit; run scripts/gen_protos.sh."""
PY
echo "generated $(ls "$OUT" | wc -l) files in $OUT" >&2
