"""Lines over the pipes between a pool's processes, on the raw descriptor.

The supervisor reads each child's READY line and its output, the
dispatcher its control orders; the dispatcher writes its reports
(:class:`LineWriter`). Every end here is a plain descriptor watched with
``add_reader`` or ``add_writer`` and closed once, by its owner.

Not the loop's pipe transports: uvloop's ``connect_read_pipe`` and
``connect_write_pipe`` hand the descriptor to libuv, which closes it, and
the file object they were given closes the same number again
(MagicStack/uvloop#763). A number reused in
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


class LineWriter:
    """Lines to the pipe ``fd`` (which this owns, and closes once) from
    code that must not wait: what the pipe cannot take now waits here, in
    order, and goes as the reader reads (the loop watches ``fd``). The
    reader reads every line, so the backlog is what one read behind holds.
    Once the reader is gone, lines go nowhere; so does what is still
    waiting at :meth:`close`."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._backlog = bytearray()

    def write(self, line: str) -> None:
        """Write ``line`` and a newline, now or once the pipe has room."""
        if self._fd < 0:
            return
        waiting = bool(self._backlog)
        self._backlog += line.encode() + b"\n"
        if not waiting:
            self._flush()
            if self._backlog and self._fd >= 0:
                self._loop.add_writer(self._fd, self._flush)

    def _flush(self) -> None:
        try:
            written = os.write(self._fd, self._backlog)
        except BlockingIOError:
            return
        except OSError:  # (EPIPE) the reader is gone
            self.close()
            return
        del self._backlog[:written]
        if not self._backlog:
            self._loop.remove_writer(self._fd)

    def close(self) -> None:
        """Write what the pipe takes now of what waits, then close. Never
        raises."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        self._loop.remove_writer(fd)
        if self._backlog:
            with contextlib.suppress(OSError):
                os.write(fd, self._backlog)
            self._backlog.clear()
        os.close(fd)
