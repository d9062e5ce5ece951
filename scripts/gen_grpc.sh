#!/usr/bin/env bash
# Regenerate server/grpc/protos/services.binpb from the .proto files in protos/third_party/
# (Triton's and TorchServe's, as they ship them): the compiled descriptor set the gRPC listeners
# load into a private descriptor pool (never protobuf's default pool: tritonclient and kserve
# each register package `inference` there). Needs grpcio-tools (the `dev` extra).
#   scripts/gen_grpc.sh [python]     (default: .venv/bin/python, else python3)
# tests/server/test_grpc_protos.py checks that the shipped set matches the .proto files.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${1:-}"
if [[ -z "$python" ]]; then
    if [[ -x "$root/.venv/bin/python" ]]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
protos="$root/server/grpc/protos"
include="$("$python" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')"
cd "$protos/third_party"  # the names the descriptor set records are relative to it
"$python" -m grpc_tools.protoc -I. -I"$include" --include_imports \
    --descriptor_set_out="$protos/services.binpb" \
    grpc_service.proto inference.proto management.proto
echo "wrote $protos/services.binpb"
