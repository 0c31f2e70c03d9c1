"""The committed gRPC stubs are exactly what `make protos` generates from the .proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO = "disttrain_trainer/tensor_transport/protos/tensor_transport.proto"
GENERATED = ("tensor_transport_pb2.py", "tensor_transport_pb2.pyi", "tensor_transport_pb2_grpc.py")


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT / "trainer"), f"--python_out={tmp_path}",
         f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", str(ROOT / "trainer" / PROTO)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    committed = ROOT / "trainer" / Path(PROTO).parent
    for name in GENERATED:
        fresh = (tmp_path / Path(PROTO).parent / name).read_text()
        assert (committed / name).read_text() == fresh, f"{name} drifted from the .proto: run `make protos`"
