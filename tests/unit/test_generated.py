"""The committed protobuf modules are exactly what the pinned protoc makes."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PROTOS = sorted(p.relative_to(ROOT / "proto") for p in ROOT.glob("proto/**/*.proto"))


def _has_service(proto: Path) -> bool:
    return any(line.startswith("service ") for line in (ROOT / "proto" / proto).open())


@pytest.mark.parametrize("proto", PROTOS, ids=str)
def test_generated_modules_match_protos(proto: Path, tmp_path: Path) -> None:
    """Regenerating a .proto gives byte-identical committed modules (gRPC stubs
    only for files that declare a service)."""
    outputs = [f"--python_out={tmp_path}", f"--pyi_out={tmp_path}"]
    if _has_service(proto):
        outputs.append(f"--grpc_python_out={tmp_path}")
    argv = ["protoc", f"-I{ROOT / 'proto'}", *outputs, str(proto)]
    assert protoc.main(argv) == 0
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    assert len(generated) == len(outputs)
    for rel in generated:
        assert filecmp.cmp(tmp_path / rel, ROOT / rel, shallow=False), (
            f"{rel} is stale: regenerate with `python -m grpc_tools.protoc -I proto "
            f"{' '.join(o.split('=')[0] + '=.' for o in outputs)} {proto}`"
        )
