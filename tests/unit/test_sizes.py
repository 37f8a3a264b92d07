"""Messages stay under gRPC's limit whatever is written at once: tasks and
results are cut into batches by bytes, and a failure is cut to size."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from workers.protocol import codec, payload, transfer
from workers.protocol.errors import ArgumentsTooLarge, DataGone, RemoteError
from workers.protocol.outbox import MAX_BATCH_BYTES, Outbox
from workers.protocol.stream import Outgoing
from workers.protocol.worker_pb2 import Chunk, Data, Home, Result, Task

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


async def _fetched(data: Data) -> object:
    """What a reader of another machine gets of a held value."""
    parts = transfer.HELD.take(data.transfer.token)
    assert parts is not None

    async def stream() -> AsyncIterator[Chunk]:
        for chunk in transfer.chunks(parts):
            assert len(chunk.data) <= transfer.CHUNK_BYTES
            yield chunk

    return transfer.loads(data, await transfer.receive(stream(), data.transfer.size))


async def test_a_result_over_a_message_is_held_for_a_client_of_another_machine() -> (
    None
):
    """For a client of another machine (no home), a value over a message is
    held, in chunks far under it, and comes back whole, once."""
    value = b"x" * (codec.MAX_ARGS_LIMIT + 1)
    result = codec.value_result(1, value, None, Home())
    assert result.HasField("data") and result.ByteSize() < 1024
    assert await _fetched(result.data) == value
    assert transfer.HELD.take(result.data.transfer.token) is None  # (once)


async def test_a_held_array_arrives_writable_with_its_buffers_out_of_band() -> None:
    numpy = pytest.importorskip("numpy")
    array = numpy.arange(2 * transfer.TRANSFER_MIN // 8, dtype=numpy.float64)
    pickled, buffers = payload.dumps(array)
    data = transfer.HELD.hold(pickled, [b.raw() for b in buffers.taken])
    assert len(data.parts) == 2
    back: Any = await _fetched(data)
    assert numpy.array_equal(back, array) and back.flags.writeable


async def test_a_short_fetch_is_data_gone() -> None:
    async def stream() -> AsyncIterator[Chunk]:
        yield Chunk(data=b"abc")

    with pytest.raises(DataGone, match="3 bytes came of 4"):
        await transfer.receive(stream(), 4)


def test_arguments_over_a_message_are_refused_before_sending() -> None:
    with pytest.raises(ArgumentsTooLarge, match="pass large data"):
        codec.check_call_size(b"x" * codec.MAX_ARGS_LIMIT, b"code")
    codec.check_call_size(b"x" * (codec.MAX_ARGS_LIMIT - 4), b"code")
