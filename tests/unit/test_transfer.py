"""Payloads that came from another machine wait for their readers: kept
while a task claims them, waited for while they are coming, and let go of
when nobody will read them."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from workers.protocol import transfer
from workers.protocol.worker_pb2 import Chunk, Data, FetchRequest, Transfer

pytestmark = pytest.mark.timeout(20)


def _data(token: bytes) -> Data:
    return Data(transfer=Transfer(token=token, size=1))


def test_what_a_task_claims_stays_and_the_unclaimed_goes() -> None:
    arrivals = transfer.Arrivals(keep_s=0.0)  # (anything unclaimed is old)
    arrivals.claim(b"held")
    arrivals.put(b"held", bytearray(b"a"))
    arrivals.put(b"orphan", bytearray(b"b"))
    arrivals.put(b"next", bytearray(b"c"))  # (expires what is old)
    assert arrivals.take(_data(b"orphan")) is None
    assert arrivals.take(_data(b"held")) == bytearray(b"a")
    arrivals.claim(b"later")
    arrivals.put(b"later", bytearray(b"d"))
    arrivals.release(b"later")  # (its task was answered: nobody reads it)
    assert arrivals.take(_data(b"later")) is None


def test_a_reader_waits_while_its_payload_is_coming() -> None:
    """With no time to wait, a reader still waits for an upload under way,
    and has its bytes once it has come."""
    arrivals = transfer.Arrivals()
    got: list[bytearray | None] = []
    with arrivals.coming(b"t"):
        reader = threading.Thread(target=lambda: got.append(arrivals.take(_data(b"t"))))
        reader.start()
        arrivals.put(b"t", bytearray(b"x"))
    reader.join(10)
    assert got == [bytearray(b"x")]


def test_a_payload_that_never_comes_is_none_once_the_wait_is_over() -> None:
    assert transfer.Arrivals().take(_data(b"never"), wait_s=0.01) is None


async def test_a_stopping_worker_waits_for_a_fetch_under_way() -> None:
    """A value taken by a fetch is no longer held, but a stopping worker
    still waits until it is sent (its server would cut the send)."""
    held = transfer.Held()
    data = held.hold(b"x" * (transfer.CHUNK_BYTES + 1))  # (two chunks)
    first_written, release = asyncio.Event(), asyncio.Event()
    written: list[Chunk] = []

    class SlowReader:  # (a gRPC context whose reader takes its time)
        async def write(self, chunk: Chunk) -> None:
            written.append(chunk)
            first_written.set()
            await release.wait()

        async def abort(self, code: grpc.StatusCode, details: str) -> None:
            raise AssertionError(f"the fetch was refused: {details}")

    service = transfer.HeldService(held)
    request = FetchRequest(token=data.transfer.token)
    fetching = asyncio.create_task(service.Fetch(request, SlowReader()))  # type: ignore[arg-type]
    await asyncio.wait_for(first_written.wait(), 10)
    assert len(held) == 0  # (taken: no second fetch gets it)
    waiting = asyncio.create_task(held.wait_fetched(10))
    await asyncio.sleep(0)  # (one turn of the loop: its first look)
    assert not waiting.done()
    release.set()
    await asyncio.wait_for(fetching, 10)
    await asyncio.wait_for(waiting, 10)
    assert sum(len(c.data) for c in written) == transfer.CHUNK_BYTES + 1
