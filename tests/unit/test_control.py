"""The control pipe never drops an order: a full pipe holds the writer."""

from __future__ import annotations

import asyncio
import os

import pytest

from pool.dispatcher import messages
from pool.supervisor.control import ControlPipe

pytestmark = pytest.mark.timeout(30)

LINES = 3000  # about 300 KB: several times what a pipe holds


async def test_a_full_pipe_holds_the_writer_and_loses_nothing() -> None:
    """Regression: orders were dropped (BlockingIOError) when the dispatcher
    did not read fast enough."""
    read_fd, write_fd = os.pipe()
    pipe = ControlPipe()
    await pipe.attach(write_fd)
    status = "x" * 80
    sending = asyncio.ensure_future(
        asyncio.gather(*(pipe.send(messages.Exited(i, status)) for i in range(LINES)))
    )
    # Nobody reads yet: the writer is held, not failed.
    done, _ = await asyncio.wait([sending], timeout=0.2)
    assert not done
    with os.fdopen(read_fd, "rb") as reader:
        received = await asyncio.to_thread(_read_lines, reader, LINES)
        await sending
    assert [messages.order(line) for line in received] == [
        messages.Exited(i, status) for i in range(LINES)
    ]
    await pipe.aclose()


async def test_orders_for_a_dispatcher_that_is_gone_go_nowhere() -> None:
    read_fd, write_fd = os.pipe()
    pipe = ControlPipe()
    await pipe.attach(write_fd)
    os.close(read_fd)
    for _ in range(3):
        await pipe.send(messages.Drain())  # no error, and no wait
    await pipe.aclose()


def _read_lines(reader: object, count: int) -> list[bytes]:
    lines = []
    for line in reader:  # type: ignore[attr-defined]
        lines.append(line)
        if len(lines) == count:
            break
    return lines


async def test_closing_closes_the_descriptor_then_and_once() -> None:
    """Regression: the write end was closed by a transport at a later turn
    of the loop (or by the garbage collector), by which time an embedded
    pool's process may have reused the number: a later pool then failed
    with EBADF (seen in `pool bench`, which starts many pools)."""
    read_fd, write_fd = os.pipe()
    pipe = ControlPipe()
    await pipe.attach(write_fd)
    await pipe.send(messages.Started())
    await pipe.aclose()
    with pytest.raises(OSError):
        os.fstat(write_fd)  # closed at once
    reused_read, reused_write = os.pipe()  # may take the same numbers now
    try:
        await pipe.aclose()  # closes nothing twice
        os.fstat(reused_read)
        os.fstat(reused_write)
        assert messages.order(os.read(read_fd, 100)) == messages.Started()
    finally:
        for fd in (read_fd, reused_read, reused_write):
            os.close(fd)
