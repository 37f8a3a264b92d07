"""Reading what a child process writes to stdout and stderr, a line at a
time, for the supervisor to show (``[w3 pid=1234] hello``).

A child's stdout and stderr share one pipe (``--output-fd``), so its lines
keep their order. A line longer than :data:`MAX_LINE_BYTES` is shown in
pieces of that size; the pipe is read without blocking the loop, and what a
child writes past what the view takes waits in the pipe (its writes block):
nothing grows without bound here.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from typing import Final

MAX_LINE_BYTES: Final = 8192
READ_BYTES: Final = 65536


async def output_lines(
    fd: int, max_line_bytes: int = MAX_LINE_BYTES
) -> AsyncIterator[str]:
    """The lines written to the pipe ``fd`` (without their newline) until
    every writer has closed it, in pieces of ``max_line_bytes`` at most. The
    caller closes ``fd``."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    readable = asyncio.Event()
    loop.add_reader(fd, readable.set)
    pending = b""
    try:
        while True:
            await readable.wait()
            readable.clear()
            try:
                data = os.read(fd, READ_BYTES)
            except BlockingIOError:
                continue
            if not data:
                break
            *lines, pending = (pending + data).split(b"\n")
            if len(pending) > max_line_bytes:  # the rest of it comes later
                cut = len(pending) - len(pending) % max_line_bytes
                lines.append(pending[:cut])
                pending = pending[cut:]
            for line in lines:
                for start in range(0, max(len(line), 1), max_line_bytes):
                    yield _text(line[start : start + max_line_bytes])
        if pending:
            yield _text(pending)
    finally:
        loop.remove_reader(fd)


def _text(line: bytes) -> str:
    return line.rstrip(b"\r").decode("utf-8", "replace")


async def relay(
    fd: int, show: Callable[[str], None], max_line_bytes: int = MAX_LINE_BYTES
) -> None:
    """Show each line written to the pipe ``fd`` until every writer closed
    it; then close ``fd`` (which this now owns)."""
    try:
        async for text in output_lines(fd, max_line_bytes):
            show(text)
    finally:
        os.close(fd)
