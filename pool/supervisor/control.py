"""The supervisor's control pipe to its dispatcher: one JSON line an order.

Only the supervisor writes to it; the dispatcher reads it
(:func:`pool.dispatcher.server._obey`): when every worker has started, how
each worker ended, when the pool drains. A restarted dispatcher gets a pipe
of its own (:meth:`ControlPipe.attach`). A line is never dropped: a write
waits (``drain``) while the pipe is full, so a slow reader holds the
writer back instead of losing orders. Lines for a dispatcher that is gone
go nowhere: they were for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from typing import Any


class ControlPipe:
    """The write end of the current dispatcher's control pipe."""

    def __init__(self) -> None:
        self._writer: asyncio.StreamWriter | None = None

    async def attach(self, fd: int) -> None:
        """Write to ``fd`` (a pipe's write end, which this now owns) from now
        on; the previous pipe is closed."""
        self.close()
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(fd, "wb", 0)
        )
        self._writer = asyncio.StreamWriter(transport, protocol, None, loop)

    async def send(self, **order: Any) -> None:
        """Write one order, waiting while the pipe is full."""
        writer = self._writer
        if writer is None or writer.is_closing():
            return
        writer.write((json.dumps(order) + "\n").encode())
        with contextlib.suppress(ConnectionError):  # its dispatcher is gone
            await writer.drain()

    def close(self) -> None:
        """Close the pipe (the dispatcher reads its end). Never raises."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
