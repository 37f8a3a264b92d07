"""Hypothesis on the WorkerInfo decoder and on the slot reader."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from discovery import WorkerInfo

text = st.text(max_size=40)
infos = st.builds(
    WorkerInfo,
    uid=st.uuids(),
    address=text,
    pid=st.integers(0, 2**31 - 1),
    version=text,
    tags=st.frozensets(text, max_size=5),
    extra=st.dictionaries(text, text, max_size=5),
    status=st.sampled_from(["ready", "draining", "stuck"]),
    capacity=st.integers(1, 2**31),
)


@given(infos)
def test_round_trip(info: WorkerInfo) -> None:
    """Any valid info decodes back to itself."""
    assert WorkerInfo.decode(info.encode()) == info


@given(st.binary(max_size=512))
@settings(max_examples=500)
def test_decode_raises_only_value_error(data: bytes) -> None:
    """Arbitrary bytes decode to an info or raise ValueError, nothing else."""
    try:
        info = WorkerInfo.decode(data)
    except ValueError:
        return
    assert isinstance(info.uid, uuid.UUID)
