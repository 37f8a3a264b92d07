"""How workers ended, as the supervisor reports it on the control pipe.

:class:`Exits` keeps the last :data:`EXITS_KEPT` reports by pid, so that a
task that lost its worker too often fails with
:class:`~pool.errors.WorkerLost` saying how each of them died. The report
of the last death may come a moment after its stream broke:
:meth:`Exits.wait_for` waits for it a bounded time. Owned by the
:class:`~pool.routing.placement.Router`; no I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

from discovery import WorkerInfo

EXIT_REPORT_WAIT_S: Final = 1.0
EXITS_KEPT: Final = 1024


class Exits:
    """The supervisor's reports of how workers ended, newest last."""

    def __init__(self) -> None:
        self._status: dict[int, str] = {}  # pid -> how it ended
        self._waiters: dict[int, asyncio.Event] = {}

    def record(self, pid: int, status: str) -> None:
        """The supervisor's word on how worker ``pid`` ended."""
        self._status[pid] = status
        while len(self._status) > EXITS_KEPT:
            self._status.pop(next(iter(self._status)))
        if (waiter := self._waiters.get(pid)) is not None:
            waiter.set()

    async def wait_for(self, pid: int, timeout_s: float = EXIT_REPORT_WAIT_S) -> None:
        """Return once ``pid``'s end is reported, or after ``timeout_s``."""
        if pid in self._status:
            return
        waiter = self._waiters.setdefault(pid, asyncio.Event())
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await waiter.wait()
        finally:
            self._waiters.pop(pid, None)

    def describe(self, info: WorkerInfo) -> str:
        """``worker pid P (uid): how it ended``, as WorkerLost lists it."""
        how = self._status.get(info.pid, "ended, how unknown")
        return f"worker pid {info.pid} ({str(info.uid)[:8]}): {how}"
