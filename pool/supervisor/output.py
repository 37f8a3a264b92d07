"""Reading what a child process writes to stdout and stderr, a line at a
time, for the supervisor to show (``[w3 pid=1234] hello``).

A child's stdout and stderr share one pipe (``--output-fd``), so its lines
keep their order. A line longer than :data:`MAX_LINE_BYTES` is shown in
pieces of that size; the pipe is read without blocking the loop, and what a
child writes past what the view takes waits in the pipe (its writes block):
nothing grows without bound here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from workers.common.pipes import MAX_LINE_BYTES, lines


async def relay(
    fd: int, show: Callable[[str], None], max_line_bytes: int = MAX_LINE_BYTES
) -> None:
    """Show each line written to the pipe ``fd`` until every writer closed
    it; then close ``fd`` (which this now owns)."""
    try:
        async with contextlib.aclosing(lines(fd, max_line_bytes)) as read:
            async for text in read:
                show(text)
    finally:
        os.close(fd)
