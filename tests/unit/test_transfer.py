"""Payloads that came from another machine wait for their readers: kept
while a task claims them, waited for while they are coming, and let go of
when nobody will read them."""

from __future__ import annotations

import threading

import pytest

from workers.protocol import transfer
from workers.protocol.worker_pb2 import Data, Transfer

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
