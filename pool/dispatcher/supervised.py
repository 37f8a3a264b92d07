"""The dispatcher's side of its two pipes to the supervisor that started
it (each line a :mod:`pool.dispatcher.messages` message).

- :class:`Reports` writes on ``--report-fd``: one line for each worker
  whose stream is up, so that the pool says ``ready`` only once every
  worker can be sent tasks; with ``--telemetry``, what tasks did, every
  :data:`~pool.dispatcher.telemetry.REPORT_S` (:func:`report_stats`).
- :func:`obey` reads ``--control-fd``, a pipe only the supervisor can
  write to: every worker has started, how each worker ended, that its
  initializer failed too often (every task fails with it from then on),
  and that the pool drains. Its end means the supervisor is gone: the
  dispatcher stops.

Both run in :func:`pool.dispatcher.server.serve`'s task group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Final, assert_never

from discovery import WorkerInfo
from pool.dispatcher import messages
from pool.dispatcher.telemetry import REPORT_S, Telemetry
from pool.routing.placement import Router
from workers.common import pipes, serving

log = logging.getLogger("pool.dispatcher")

# an order may carry a Failure, traceback and all: one line, whole
MAX_ORDER_BYTES: Final = 1 << 20


class Reports:
    """One JSON line to the supervisor (``--report-fd``) for each worker
    whose stream is up, so that the pool says ``ready`` only once every
    worker can be sent tasks; with ``--telemetry``, what tasks did, twice a
    second. Written without ever blocking the loop (the supervisor reads
    every line): :class:`workers.common.pipes.LineWriter`."""

    def __init__(self) -> None:
        self._writer: pipes.LineWriter | None = None

    def open(self, fd: int | None) -> None:
        if fd is not None:
            self._writer = pipes.LineWriter(fd)

    def linked(self, info: WorkerInfo) -> None:
        self._write(messages.Linked(str(info.uid)))

    def stats(self, telemetry: Telemetry, router: Router) -> None:
        report = telemetry.report(router.links, router.queue.by_priority())
        self._write(messages.Stats(report))

    def _write(self, report: messages.Report) -> None:
        if self._writer is not None:
            self._writer.write(messages.encode(report))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


async def report_stats(router: Router, telemetry: Telemetry, to: Reports) -> None:
    """Write what ``router``'s tasks did (``telemetry``, which it tells) to
    the supervisor every :data:`REPORT_S` (a line of
    :data:`~pool.dispatcher.telemetry.MAX_BARS` bars at most) until
    cancelled, and once more then. The supervisor reads every line."""
    try:
        while True:
            await asyncio.sleep(REPORT_S)  # a ticker, not a wait for an event
            to.stats(telemetry, router)
    finally:
        to.stats(telemetry, router)


async def obey(fd: int, router: Router, stopper: serving.Stopper) -> None:
    """Follow the supervisor's control lines (``fd``, which this closes);
    their end means it is gone."""
    try:
        async with contextlib.aclosing(pipes.lines(fd, MAX_ORDER_BYTES)) as orders:
            async for line in orders:
                try:
                    _carry_out(messages.order(line), router)
                except messages.BadLine as exc:
                    log.warning("ignoring a control line: %s", exc)
        stopper.stop()
    finally:
        os.close(fd)


def _carry_out(order: messages.Order, router: Router) -> None:
    """:raises messages.BadLine: for a :class:`~pool.dispatcher.messages.Broken`
    whose failure is not one."""
    match order:
        case messages.Drain():
            router.stop_taking()
        case messages.Started():
            router.started()
        case messages.Exited(pid, status):
            router.record_exit(pid, status)
        case messages.Broken():
            router.broken(order.parsed())
        case _:
            assert_never(order)
