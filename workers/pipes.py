"""Lines over the pipes between a pool's processes, on the raw descriptor.

The supervisor reads each child's READY line and its output, the
dispatcher its control orders. Every read end here is a plain descriptor
watched with ``add_reader`` and closed once, by its owner.

Not the loop's pipe transports: uvloop's ``connect_read_pipe`` hands the
descriptor to libuv, which closes it, and the file object it was given
closes the same number again (MagicStack/uvloop#763). A number reused in
between (a new child's pipe, a socket) was closed under its owner: a
supervisor hung at shutdown that way, its child's exit descriptor closed by
another pipe's transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncGenerator
from typing import Final

MAX_LINE_BYTES: Final = 8192
READ_BYTES: Final = 65536


async def lines(
    fd: int, max_line_bytes: int = MAX_LINE_BYTES
) -> AsyncGenerator[str, None]:
    """The lines written to the pipe ``fd`` (without their newline) until
    every writer has closed it, in pieces of ``max_line_bytes`` at most.

    What is not read waits in the pipe (its writers block): nothing grows
    here without bound. The caller closes ``fd``.
    """
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
            *whole, pending = (pending + data).split(b"\n")
            if len(pending) > max_line_bytes:  # the rest of it comes later
                cut = len(pending) - len(pending) % max_line_bytes
                whole.append(pending[:cut])
                pending = pending[cut:]
            for line in whole:
                for start in range(0, max(len(line), 1), max_line_bytes):
                    yield _text(line[start : start + max_line_bytes])
        if pending:
            yield _text(pending)
    finally:
        loop.remove_reader(fd)


def _text(line: bytes) -> str:
    return line.rstrip(b"\r").decode("utf-8", "replace")


async def first_line(fd: int) -> str:
    """The first line written to ``fd`` (``""`` if every writer closed it
    first), up to :data:`READ_BYTES` of it. The caller closes ``fd``."""
    async with contextlib.aclosing(lines(fd, READ_BYTES)) as read:
        async for line in read:  # stop watching fd before the caller closes it
            return line
    return ""
