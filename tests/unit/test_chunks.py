"""The pure parts of ``map``'s chunks: how big, and how a chunk's calls
come out."""

from __future__ import annotations

import pickle

import pytest

from pool.client.core import Submissions
from pool.client.mapping import (
    CHUNK_TARGET_S,
    MAX_CHUNK_BYTES,
    MIN_CHUNKS,
    MapPlan,
    auto_chunksize,
)
from tests.support import sample_tasks
from workers.protocol import codec
from workers.protocol.errors import RemoteTraceback


def test_a_chunk_grows_while_calls_are_short() -> None:
    assert auto_chunksize(CHUNK_TARGET_S / 100, 1_000_000) == 100
    assert auto_chunksize(1e-9, 10**9) == int(CHUNK_TARGET_S / 1e-7)


def test_a_chunk_carries_at_most_a_mebibyte_of_arguments() -> None:
    assert auto_chunksize(1e-9, 10**9, per_call_bytes=1024) == MAX_CHUNK_BYTES // 1024
    assert auto_chunksize(1e-9, 10**9, per_call_bytes=10 * MAX_CHUNK_BYTES) == 1


def test_long_or_untimed_calls_go_one_per_task() -> None:
    assert auto_chunksize(None, 10_000) == 1
    assert auto_chunksize(CHUNK_TARGET_S, 10_000) == 1
    assert auto_chunksize(1.0, 10_000) == 1


def test_there_are_always_enough_chunks_to_share() -> None:
    assert auto_chunksize(1e-6, 10 * MIN_CHUNKS) == 10
    assert auto_chunksize(1e-6, MIN_CHUNKS - 1) == 1


def test_a_chunk_keeps_each_calls_value_and_exception() -> None:
    # (fail_on(2, x) for x in 1, 2, 3: one list per argument.)
    chunk = codec.run_chunk(sample_tasks.fail_on, [[2, 2, 2], [1, 2, 3]])
    assert chunk.values == [1, None, 3] and list(chunk.failures) == [1]
    items = codec.chunk_items(chunk)
    assert next(items) == 1
    with pytest.raises(ValueError, match="2 is bad") as raised:
        next(items)
    assert isinstance(raised.value.__cause__, RemoteTraceback)


def test_a_chunk_goes_on_past_every_call_that_raises() -> None:
    """Calls that raise, first, last and side by side, each keep their
    exception at their own position, and every other call runs."""
    chunk = codec.run_chunk(sample_tasks.fail_on, [[0] * 2 + [3] * 3, range(5)])
    assert chunk.values == [None, 1, 2, None, 4]
    assert sorted(chunk.failures) == [0, 3]
    empty = codec.run_chunk(sample_tasks.fail_on, [[], []])
    assert empty.values == [] and not empty.failures


def test_a_map_of_a_callable_timed_before_skips_the_probes() -> None:
    """A chunk of many calls times a call of its callable; a later adaptive
    map of it is cut into chunks by that time at once, with no probe, and
    still covers every call in order. A probe's lone call times nothing."""
    submissions = Submissions()
    ref = submissions.reference(sample_tasks.square)
    assert submissions.per_call_s(ref) is None
    submissions.timed(ref, codec.ChunkResult(1.0, [0], {}))  # a probe
    assert submissions.per_call_s(ref) is None
    submissions.timed(ref, codec.ChunkResult(0.001, [0] * 1000, {}))
    per_call = submissions.per_call_s(ref)
    assert per_call == pytest.approx(1e-6)
    plan = MapPlan((range(10_000),), None, per_task_limit=False)
    chunks = plan.first(per_call)
    assert not plan.adaptive and plan.rest(per_call) == []
    assert MIN_CHUNKS <= len(chunks) <= MIN_CHUNKS + 1
    assert [x for (columns,) in chunks for x in columns[0]] == list(range(10_000))


def test_a_range_travels_as_bounds_and_a_list_as_it_was_when_mapped() -> None:
    """A chunk of a mapped range is a range (its pickle is three numbers,
    not its values); a chunk of a list holds the values the list had when
    the map was made, whatever the caller does to it afterwards."""
    ranged = MapPlan((range(3, 1_000_003),), None, per_task_limit=False)
    chunks = ranged.first(1e-6)
    assert all(type(columns[0]) is range for (columns,) in chunks)
    assert [x for (columns,) in chunks for x in columns[0]] == list(range(3, 1_000_003))
    assert max(len(pickle.dumps(args)) for args in chunks) < 200
    values = [1, 2, 3] * 100
    listed = MapPlan((values,), None, per_task_limit=False)
    values.clear()
    chunks = listed.first(1e-6)
    assert [x for (columns,) in chunks for x in columns[0]] == [1, 2, 3] * 100
