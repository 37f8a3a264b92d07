"""The supervisor's control pipe to its dispatcher: one line an order
(:data:`pool.dispatcher.messages.Order`, which lists them).

Only the supervisor writes to it; the dispatcher reads it. A restarted
dispatcher gets a pipe of its own (:meth:`ControlPipe.attach`). A line is
never dropped: while the pipe is full, a write waits for the dispatcher to
read (the loop watches the descriptor), so a slow reader holds the writer
back instead of losing orders; orders go out one at a time, in order. Lines
for a dispatcher that is gone go nowhere: they were for it.

The descriptor is this object's alone, closed once, by :meth:`aclose` (not
left to a transport's or the garbage collector's later close, which could
close a descriptor that has meanwhile been reused: a supervisor embedded in
a long-lived program starts many pools).
"""

from __future__ import annotations

import asyncio
import os

from pool.dispatcher import messages


class ControlPipe:
    """The write end of the current dispatcher's control pipe."""

    def __init__(self) -> None:
        self._fd = -1
        self._turn = asyncio.Lock()  # one order at a time, in order
        self._waiting: asyncio.Future[None] | None = None  # for room in the pipe

    async def attach(self, fd: int) -> None:
        """Write to ``fd`` (a pipe's write end, which this now owns) from now
        on; the previous pipe is closed."""
        await self.aclose()
        os.set_blocking(fd, False)
        self._fd = fd

    async def send(self, order: messages.Order) -> None:
        """Write one order, waiting while the pipe is full."""
        data = (messages.encode(order) + "\n").encode()
        async with self._turn:
            fd = self._fd
            while data and fd >= 0 and fd == self._fd:
                try:
                    data = data[os.write(fd, data) :]
                except BlockingIOError:
                    await self._room(fd)
                except OSError:  # (EPIPE) its dispatcher is gone
                    return

    async def _room(self, fd: int) -> None:
        loop = asyncio.get_running_loop()
        self._waiting = waiting = loop.create_future()
        loop.add_writer(fd, _settle, waiting)
        try:
            await waiting
        finally:
            if self._fd == fd:  # (else aclose has removed it)
                loop.remove_writer(fd)
            self._waiting = None

    async def aclose(self) -> None:
        """Close the pipe (the dispatcher reads its end); a write waiting for
        room gives up. Never raises."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        if (waiting := self._waiting) is not None:
            asyncio.get_running_loop().remove_writer(fd)
            _settle(waiting)
        os.close(fd)


def _settle(waiting: asyncio.Future[None]) -> None:
    if not waiting.done():
        waiting.set_result(None)
