"""Hypothesis on the WorkerInfo decoder, the slot reader, and the data
plane's reader of where a task's arguments lie."""

from __future__ import annotations

import contextlib
import pickle
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from discovery import WorkerInfo
from workers.protocol import codec
from workers.protocol.errors import BadTask
from workers.protocol.worker_pb2 import Data, Part, Segment

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


_segments = st.builds(
    Segment,
    name=st.one_of(text, st.just(f"shmp-{'0' * 24}.{'1' * 16}.{'2' * 16}.a-1")),
    nonce=st.integers(0, 2**64 - 1),
    size=st.integers(0, 2**40),
)
_parts = st.builds(
    Part,
    segment=st.integers(0, 4),
    offset=st.integers(0, 2**40),
    length=st.integers(0, 2**40),
)
_data = st.builds(
    Data,
    host=text,
    segments=st.lists(_segments, max_size=3),
    pickle=st.sampled_from([b"", pickle.dumps(((1,), {}))]),
    parts=st.lists(_parts, max_size=3),
)


@given(_data)
@settings(max_examples=300, deadline=None)
def test_arguments_said_to_lie_in_shared_memory_fail_only_as_bad_tasks(
    data: Data,
) -> None:
    """Any Data of a task's arguments (names, nonces, sizes, offsets, with a
    pickle or without): its call, or a BadTask (DataGone for segments that
    are not there), never another error; no name outside the data plane's
    is opened."""
    with contextlib.suppress(BadTask):
        assert codec.load_call(data) == ((1,), {})
