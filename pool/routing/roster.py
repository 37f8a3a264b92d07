"""The dispatcher's links to the workers discovery finds: :class:`Roster`.

A worker's ``worker-added`` opens a link (its stream runs in a task of the
owner's group); ``worker-updated`` refreshes what the link knows of it;
``worker-dropped`` marks it dropped (it takes nothing more) and closes it
after :data:`LEAVE_GRACE_S`, so that a draining worker's last results still
arrive. When a link's stream ends, the owner hears of it (``on_lost``: it
requeues the link's tasks); a worker still registered and alive (asked on a
thread: its liveness lock, or its lease in Redis) is linked again after a pause, of
:data:`RECONNECT_DELAY_S` and doubling, to at most
:data:`MAX_RECONNECT_DELAY_S`, for each link in a row that did not reach it
(:func:`reconnect_delay`). A worker that refused this dispatcher (its token,
its protocol version) :data:`MAX_REFUSALS` times in a row for the same
reason is left alone until it registers again; one it cannot reach
:data:`MAX_REFUSALS` times in a row (say, its address does not resolve here)
is said once, at warning level, and tried again. Owned by
:class:`~pool.routing.placement.Router`, which places the tasks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Final, assert_never
from uuid import UUID

from discovery import DiscoveryEvent, WorkerInfo
from pool.routing.jobs import Connect, Link, LinkEvents

RECONNECT_DELAY_S: Final = 0.5  # the first pause before linking a worker again
MAX_RECONNECT_DELAY_S: Final = 30.0
MAX_REFUSALS: Final = 3  # in a row, for one reason: then it is left alone
LEAVE_GRACE_S: Final = 5.0  # a dropped worker's stream may finish this long

Spawn = Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]

log = logging.getLogger("pool.dispatcher")


def reconnect_delay(failures: int) -> float:
    """The pause before linking again a worker that ``failures`` links in a
    row did not reach (0: the last one did)."""
    return min(RECONNECT_DELAY_S * 2.0 ** max(failures - 1, 0), MAX_RECONNECT_DELAY_S)


class Roster:
    """The links by worker, and every link whose stream still runs.

    :param events: what each link reports to (the router).
    :param is_alive: whether a worker is still registered by a live process.
    :param spawn: runs a coroutine in the owner's task group.
    :param on_lost: told of each link whose stream ended.
    """

    def __init__(
        self,
        namespace: str,
        connect: Connect,
        events: LinkEvents,
        *,
        is_alive: Callable[[str, UUID], bool],
        spawn: Spawn,
        on_lost: Callable[[Link], None],
    ) -> None:
        self._namespace = namespace
        self._connect, self._events = connect, events
        self._is_alive, self._spawn, self._on_lost = is_alive, spawn, on_lost
        self.links: dict[UUID, Link] = {}  # registered workers
        self.open: set[Link] = set()  # every link whose stream still runs
        self._graces: set[asyncio.Task[None]] = set()  # of dropped workers' links
        # Of each registered worker whose last links did not reach it: how
        # many in a row, and why the last was refused (None: not refused).
        self._failures: dict[UUID, tuple[str | None, int]] = {}
        self.closed = False

    def on_event(self, event: DiscoveryEvent) -> Link | None:
        """Follow one discovery event; the link it brought news of, if any."""
        info = event.worker_info
        match event.type:
            case "worker-added":
                self._failures.pop(info.uid, None)  # (registered anew)
                self._open_link(info)
                return None
            case "worker-updated":
                if (link := self.links.get(info.uid)) is not None:
                    link.info = info
                return link
            case "worker-dropped":
                self._failures.pop(info.uid, None)
                if (link := self.links.pop(info.uid, None)) is not None:
                    link.dropped = True  # takes nothing more; may still answer
                    grace = self._spawn(_close_after(link, LEAVE_GRACE_S))
                    self._graces.add(grace)
                    grace.add_done_callback(self._graces.discard)
                return None
            case _:
                assert_never(event.type)

    def close(self) -> None:
        """Close every link (their streams end soon after)."""
        self.closed = True
        for grace in self._graces:
            grace.cancel()
        for link in list(self.open):
            link.close()

    def _open_link(self, info: WorkerInfo) -> None:
        link = self._connect(info, self._events)
        self.links[info.uid] = link
        self.open.add(link)
        self._spawn(self._serve(link))

    async def _serve(self, link: Link) -> None:
        try:
            await link.run()
        finally:
            self.open.discard(link)
            if self.links.get(link.info.uid) is link and not self.closed:
                self._spawn(self._reconnect(link))
            self._on_lost(link)

    async def _reconnect(self, old: Link) -> None:
        """Link ``old``'s worker again, after a pause, if it is still
        registered, alive and not refusing this dispatcher (its drop is
        coming otherwise)."""
        uid = old.info.uid
        failures = self._count(old)
        if old.refused is not None and failures >= MAX_REFUSALS:
            log.error(
                "%s refused this dispatcher %d times (%s); not linked again "
                "until it registers again",
                *(old.describe(), failures, old.refused),
            )
            self._forget(old)
            return
        alive = await asyncio.to_thread(self._is_alive, self._namespace, uid)
        if not alive:
            self._forget(old)
            return
        if failures == MAX_REFUSALS and old.refused is None:
            log.warning(
                "%s at %s not reached %d times in a row (%s); trying again, less often",
                *(old.describe(), old.info.address, failures, old.broke),
            )
        await asyncio.sleep(reconnect_delay(failures))  # a pause, not a wait
        if self.links.get(uid) is old and not self.closed:
            self._open_link(old.info)

    def _count(self, link: Link) -> int:
        """Links in a row that did not reach ``link``'s worker (for one
        refusal, if it was refused), counting ``link``."""
        uid = link.info.uid
        if link.connected:
            self._failures.pop(uid, None)
            return 0
        reason, count = self._failures.get(uid, (None, 0))
        count = count + 1 if reason == link.refused else 1
        self._failures[uid] = (link.refused, count)
        return count

    def _forget(self, link: Link) -> None:
        if self.links.get(link.info.uid) is link:
            del self.links[link.info.uid]


async def _close_after(link: Link, grace_s: float) -> None:
    """Close a dropped worker's link once its stream had ``grace_s`` to end."""
    try:
        await asyncio.sleep(grace_s)  # the grace itself, not a wait for an event
    finally:
        link.close()
