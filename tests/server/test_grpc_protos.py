"""The shipped gRPC descriptor set: it matches the .proto files (scripts/gen_grpc.sh
regenerates it), it names the real services, and it stays out of protobuf's default pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2

from torchbay.server.grpc import messages

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_descriptor_set_matches_the_proto_files(tmp_path: Path) -> None:
    shipped = messages.DESCRIPTOR_SET.read_bytes()
    copy = tmp_path / "protos"
    subprocess.run(["cp", "-r", str(messages.PROTOS.parent), str(copy)], check=True)
    env = {**os.environ}
    script = ROOT / "scripts" / "gen_grpc.sh"
    # Regenerate into the copy: the script writes beside the .proto files it compiles.
    text = script.read_text().replace('protos="$root/server/grpc/protos"', f'protos="{copy}"')
    (tmp_path / "gen.sh").write_text(text)
    subprocess.run(["bash", str(tmp_path / "gen.sh"), sys.executable], check=True, env=env,
                   capture_output=True)  # fmt: skip
    regenerated = (copy / "services.binpb").read_bytes()
    assert regenerated == shipped, "run scripts/gen_grpc.sh and commit services.binpb"


def test_descriptor_set_holds_the_three_services_with_their_rpcs() -> None:
    files = descriptor_pb2.FileDescriptorSet.FromString(messages.DESCRIPTOR_SET.read_bytes())
    services = {
        f"{f.package}.{s.name}": {m.name for m in s.method} for f in files.file for s in f.service
    }
    assert {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
            "ModelInfer", "ModelStreamInfer"} <= services[messages.OIP_SERVICE]  # fmt: skip
    assert services[messages.TS_INFERENCE_SERVICE] == {
        "Ping", "Predictions", "StreamPredictions", "StreamPredictions2"
    }  # fmt: skip
    assert services[messages.TS_MANAGEMENT_SERVICE] == {
        "DescribeModel", "ListModels", "RegisterModel", "ScaleWorker", "SetDefault",
        "UnregisterModel",
    }  # fmt: skip
    for proto in ("grpc_service.proto", "inference.proto", "management.proto"):
        first = (messages.PROTOS / proto).read_text().splitlines()[0]
        assert first.startswith("// From ") and "@" in first  # the source commit is recorded


PROBE = """
import json
from google.protobuf import descriptor_pool
from torchbay.server.grpc import messages, server
messages.method_types(messages.OIP_SERVICE, "ModelInfer")
messages.method_types(messages.TS_INFERENCE_SERVICE, "Predictions")
default = descriptor_pool.Default()
found = []
for name in ("grpc_service.proto", "inference.proto", "management.proto"):
    try:
        default.FindFileByName(name)
        found.append(name)
    except KeyError:
        pass
import {client}
print(json.dumps(found))
"""


def test_server_protos_stay_out_of_the_default_pool_so_both_sdks_import() -> None:
    for client in ("tritonclient.grpc", "kserve"):
        out = subprocess.run(
            [sys.executable, "-c", PROBE.replace("{client}", client)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout.splitlines()[-1]) == []
