"""The pipes between a pool's processes close each descriptor once.

uvloop's pipe transports closed a read or write end twice (MagicStack/uvloop#763): a
descriptor number reused in between, by another thread or another pipe,
was closed under its owner. These tests churn new descriptors in a thread
while the loop reads lines: a second close of a reused number shows as
EBADF in the churning thread.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from pool.supervisor.children import read_ready
from pool.supervisor.output import relay
from workers.common import serving
from workers.common.pipes import LineWriter, first_line, lines
from workers.common.serving import ParentGone

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


def _beside_churn(one_round: Callable[[], Awaitable[object]]) -> list[OSError]:
    """Run ``ROUNDS`` of ``one_round`` on uvloop while a thread opens and
    closes descriptors; what that thread hit."""
    stop, errors = threading.Event(), list[OSError]()

    async def rounds() -> None:
        for _ in range(ROUNDS):
            if errors:
                return
            await one_round()

    churner = threading.Thread(target=_churn, args=(stop, errors))
    churner.start()
    try:
        uvloop.run(rounds())
    finally:
        stop.set()
        churner.join()
    return errors


def _reading(read: Callable[[int], Awaitable[object]]) -> Callable[[], Awaitable[None]]:
    """A round that reads a pipe of one line with ``read``."""

    async def one_round() -> None:
        r, w = os.pipe()
        os.write(w, b"READY {}\n")
        os.close(w)
        await read(r)

    return one_round


def test_reading_a_ready_line_closes_its_descriptor_once() -> None:
    assert _beside_churn(_reading(lambda fd: read_ready(fd, _Running(), "w0"))) == []


def test_relaying_output_closes_its_descriptor_once() -> None:
    assert _beside_churn(_reading(lambda fd: relay(fd, lambda _: None))) == []


def test_the_first_line_of_a_pipe_closed_unwritten_is_empty() -> None:
    async def read() -> str:
        r, w = os.pipe()
        os.close(w)
        try:
            return await first_line(r)
        finally:
            os.close(r)

    assert uvloop.run(read()) == ""


def test_writing_lines_closes_the_descriptor_once() -> None:
    async def write_a_line() -> None:
        r, w = os.pipe()
        writer = LineWriter(w)
        writer.write("{}")
        writer.close()
        del writer
        os.close(r)

    assert _beside_churn(write_a_line) == []


def test_lines_wait_in_order_while_the_pipe_is_full_and_all_arrive() -> None:
    """Far more than a pipe holds, written without waiting, while the
    reader starts only once every line is written: every line arrives,
    whole and in order."""
    sent = [f"{i:06d} " + "x" * (i % 3000) for i in range(400)]

    async def run() -> list[str]:
        r, w = os.pipe()
        writer = LineWriter(w)
        for line in sent:
            writer.write(line)  # (returns at once: the pipe fills up)
        got: list[str] = []
        every_line = asyncio.Event()

        async def read() -> None:
            async for line in lines(r, 1 << 16):
                got.append(line)
                if len(got) == len(sent):
                    every_line.set()

        async with asyncio.TaskGroup() as group:
            reading = group.create_task(read())
            await asyncio.wait_for(every_line.wait(), 30)
            writer.close()  # (the reader then sees the end)
        os.close(r)
        assert reading.done()
        return got

    assert uvloop.run(run()) == sent


def test_lines_to_a_reader_gone_go_nowhere_and_raise_nothing() -> None:
    async def run() -> None:
        r, w = os.pipe()
        writer = LineWriter(w)
        os.close(r)
        writer.write("to nobody")
        writer.write("again")
        writer.close()
        writer.close()

    uvloop.run(run())


def test_a_ready_line_to_a_parent_gone_is_a_typed_error_and_closes_the_pipe() -> None:
    """A child whose supervisor stopped waiting for its start says so in
    one line (``ParentGone``), not a traceback of a broken pipe."""
    r, w = os.pipe()
    os.close(r)
    with pytest.raises(ParentGone, match="no longer waits"):
        serving.announce_ready(w, address="unix:/nowhere")
    with pytest.raises(OSError):
        os.fstat(w)
