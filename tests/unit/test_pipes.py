"""The pipes between a pool's processes close each descriptor once.

uvloop's pipe transports closed a read end twice (MagicStack/uvloop#763): a
descriptor number reused in between, by another thread or another pipe,
was closed under its owner. These tests churn new descriptors in a thread
while the loop reads lines: a second close of a reused number shows as
EBADF in the churning thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from pool.supervisor.children import read_ready
from pool.supervisor.output import relay
from workers.pipes import first_line

pytestmark = pytest.mark.timeout(60)

ROUNDS = 2000


class _Running:
    """A child that wrote READY and still runs."""

    pid = os.getpid()
    returncode = None

    async def wait(self) -> int:
        return 0

    def send_signal(self, signum: int) -> None:
        raise AssertionError("a ready child is not signalled here")

    def kill(self) -> None:
        raise AssertionError("a ready child is not killed here")


def _churn(stop: threading.Event, errors: list[OSError]) -> None:
    while not stop.is_set():
        a, b = os.pipe()
        try:
            os.fstat(a)
            os.fstat(b)
            os.close(a)
            os.close(b)
        except OSError as error:
            errors.append(error)
            return


def _beside_churn(read: Callable[[int], Awaitable[object]]) -> list[OSError]:
    """Read ``ROUNDS`` pipes of one line each with ``read`` on uvloop while
    a thread opens and closes descriptors; what that thread hit."""
    stop, errors = threading.Event(), list[OSError]()

    async def rounds() -> None:
        for _ in range(ROUNDS):
            if errors:
                return
            r, w = os.pipe()
            os.write(w, b"READY {}\n")
            os.close(w)
            await read(r)

    churner = threading.Thread(target=_churn, args=(stop, errors))
    churner.start()
    try:
        uvloop.run(rounds())
    finally:
        stop.set()
        churner.join()
    return errors


def test_reading_a_ready_line_closes_its_descriptor_once() -> None:
    assert _beside_churn(lambda fd: read_ready(fd, _Running(), "w0")) == []


def test_relaying_output_closes_its_descriptor_once() -> None:
    assert _beside_churn(lambda fd: relay(fd, lambda _: None)) == []


def test_the_first_line_of_a_pipe_closed_unwritten_is_empty() -> None:
    async def read() -> str:
        r, w = os.pipe()
        os.close(w)
        try:
            return await first_line(r)
        finally:
            os.close(r)

    assert uvloop.run(read()) == ""
