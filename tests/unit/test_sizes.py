"""Messages stay under gRPC's limit whatever is written at once: tasks and
results are cut into batches by bytes, and a failure is cut to size."""

from __future__ import annotations

import pytest

from workers.protocol import codec
from workers.protocol.errors import ArgumentsTooLarge, RemoteError, ResultTooLarge
from workers.protocol.outbox import MAX_BATCH_BYTES, Outbox
from workers.protocol.stream import Outgoing
from workers.protocol.worker_pb2 import Home, Result, Task

pytestmark = pytest.mark.timeout(20)

MIB = 2**20


def test_tasks_written_together_are_cut_by_bytes() -> None:
    outgoing: Outgoing[Task] = Outgoing(lambda task: task)
    for i in range(5):
        outgoing.add(Task(id=i, args=b"x" * (30 * MIB)))
    outgoing.add(Task(id=9, args=b"small"))
    parts = [[task.id for task in part] for part, _ in outgoing.take()]
    assert parts == [[0, 1], [2, 3], [4, 9]]
    for part in parts:
        assert sum(30 * MIB for i in part if i != 9) <= MAX_BATCH_BYTES


def test_small_tasks_stay_in_one_part() -> None:
    outgoing: Outgoing[Task] = Outgoing(lambda task: task)
    for i in range(100):
        outgoing.add(Task(id=i, args=b"x" * 100))
    assert [len(part) for part, _ in outgoing.take()] == [100]


async def test_results_put_together_are_cut_by_bytes() -> None:
    outbox = Outbox()
    for i in range(3):
        outbox.put(Result(id=i, value=b"v" * (40 * MIB)))
    outbox.start(7)
    outbox.close()
    batches = [batch async for batch in outbox.batches()]
    assert [[r.id for r in b.results] for b in batches] == [[0], [1], [2]]
    assert list(batches[0].started) == [7]
    assert all(b.ByteSize() < codec.MAX_MESSAGE_BYTES for b in batches)


def test_a_huge_exception_fails_within_a_message() -> None:
    """An exception of 20 MiB of text: its pickle is dropped (it comes back
    as a RemoteError of the same type name), its text is cut."""
    failure = codec.failure_of(ValueError("e" * (20 * MIB)))
    assert failure.ByteSize() < 3 * codec.MAX_FAILURE_BYTES
    assert "characters cut" in failure.message
    exc = codec.exception_of(failure)
    assert isinstance(exc, RemoteError) and "ValueError" in str(exc)


def test_a_result_over_a_message_is_result_too_large_without_shared_memory() -> None:
    """For a client of another machine (no sink), a result over a message
    is refused."""
    with pytest.raises(ResultTooLarge, match="by reference"):
        codec.value_result(1, b"x" * (codec.MAX_ARGS_LIMIT + 1), None, Home())


def test_arguments_over_a_message_are_refused_before_sending() -> None:
    with pytest.raises(ArgumentsTooLarge, match="pass large data"):
        codec.check_call_size(b"x" * codec.MAX_ARGS_LIMIT, b"code")
    codec.check_call_size(b"x" * (codec.MAX_ARGS_LIMIT - 4), b"code")
