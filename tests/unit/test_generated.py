"""The committed protobuf modules are exactly what the pinned protoc makes."""

from __future__ import annotations

import filecmp
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]


def test_generated_modules_match_protos(tmp_path: Path) -> None:
    """Regenerating every .proto gives byte-identical committed modules."""
    protos = sorted(
        str(p.relative_to(ROOT / "proto")) for p in ROOT.glob("proto/**/*.proto")
    )
    assert protos
    status = protoc.main(
        [
            "protoc",
            f"-I{ROOT / 'proto'}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            *protos,
        ]
    )
    assert status == 0
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    assert generated
    for rel in generated:
        assert filecmp.cmp(tmp_path / rel, ROOT / rel, shallow=False), (
            f"{rel} is stale: regenerate with `python -m grpc_tools.protoc -I proto "
            f"--python_out=. --pyi_out=. {' '.join(protos)}`"
        )
