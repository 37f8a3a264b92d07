"""What the supervisor follows of its registry: every registered worker's
status, the ones its dispatcher has linked, and the ones that stay stuck.

:class:`Registrations` reads the namespace's events (in shared memory, or
in Redis with ``discovery_url``), shows each through the view, and keeps
each registered worker's status by uid; the dispatcher's report lines
(:meth:`follow_links`) say which workers it has a stream to (and, with a
dashboard, what its tasks did: ``on_stats``). So the
supervisor can wait until every worker it started is registered and
linked (:meth:`until_registered`): only then can a client's first tasks
spread over all of them. A
worker whose status stays ``"stuck"`` (every thread held by a call nobody
waits for: its dispatcher hung up on it) for ``stuck_grace_s`` is handed to
``on_stuck``, which replaces it. Owned by the supervisor, which runs
:meth:`Registrations.follow` and each grace in its task group (``spawn``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, assert_never

from discovery import backends
from pool.dispatcher import messages
from pool.supervisor.children import START_TIMEOUT_S, Child, ChildFailed
from pool.supervisor.output import relay
from pool.supervisor.view import View

log = logging.getLogger("pool.supervisor")
MAX_REPORT_BYTES = 4 << 20  # the longest report line the dispatcher writes, and more


class Registrations:
    """See the module docstring."""

    def __init__(
        self,
        namespace: str,
        discovery_url: str | None,
        view: View,
        *,
        stuck_grace_s: float,
        spawn: Callable[[Coroutine[Any, Any, None]], object],
        on_stuck: Callable[[str, int], Awaitable[None]],
        on_stats: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self._namespace, self._url, self._view = namespace, discovery_url, view
        self._stuck_grace_s = stuck_grace_s
        self._spawn, self._on_stuck, self._on_stats = spawn, on_stuck, on_stats
        self._status: dict[str, str] = {}  # uid -> status, of registered workers
        self._linked: set[str] = set()  # uids the current dispatcher has linked
        self.changed = asyncio.Event()  # set at each change: look again

    async def follow(self) -> None:
        """Follow the registry's events until cancelled."""
        async for event in backends.subscriber_for(self._namespace, self._url):
            info = event.worker_info
            uid = str(info.uid)
            if event.type == "worker-dropped":
                self._status.pop(uid, None)
            else:
                was = self._status.get(uid)
                self._status[uid] = info.status
                if info.status == "stuck" and was != "stuck":
                    self._spawn(self._stuck(uid, info.pid))
            self.changed.set()
            self._view.event(event)

    async def follow_links(self, fd: int) -> None:
        """Read a new dispatcher's report lines from the pipe ``fd`` (which
        this now owns) until it closes."""
        self._linked = set()
        await relay(fd, self._note_report, MAX_REPORT_BYTES)

    def _note_report(self, line: str) -> None:
        try:
            report = messages.report(line)
        except messages.BadLine as exc:
            log.warning("ignoring a report line: %s", exc)
            return
        match report:
            case messages.Stats(stats):  # (with a dashboard: what tasks did)
                if self._on_stats is not None:
                    self._on_stats(stats)
            case messages.Linked(uid):
                self._linked.add(uid)
                self.changed.set()
            case _:
                assert_never(report)

    async def _stuck(self, uid: str, pid: int) -> None:
        await asyncio.sleep(self._stuck_grace_s)  # the grace period itself
        if self._status.get(uid) == "stuck":
            self._view.note("worker-stuck", pid=pid, uid=uid[:8])
            await self._on_stuck(uid, pid)

    async def until_registered(
        self, workers: Sequence[Child], broken: Callable[[], bool] = lambda: False
    ) -> None:
        """Wait until every one of ``workers`` is ready, seen registered, and
        linked by the dispatcher, or ``broken()`` holds (checked whenever
        :attr:`changed` is set).

        :raises ChildFailed: if some are not within :data:`START_TIMEOUT_S`.
        """

        def done(child: Child) -> bool:
            uid = child.ready.get("uid") if child.ready else None
            return uid in self._status and uid in self._linked

        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                while not (broken() or all(map(done, workers))):
                    await self.changed.wait()
                    self.changed.clear()
        except TimeoutError:
            late = sum(1 for c in workers if not c.ready)
            raise ChildFailed(
                f"{late} of {len(workers)} workers were not ready within "
                f"{START_TIMEOUT_S:g} s; see the errors above"
            ) from None
