"""The dispatcher's links to the workers discovery finds: :class:`Roster`.

A worker's ``worker-added`` opens a link (its stream runs in a task of the
owner's group); ``worker-updated`` refreshes what the link knows of it;
``worker-dropped`` marks it dropped (it takes nothing more) and closes it
after :data:`LEAVE_GRACE_S`, so that a draining worker's last results still
arrive. When a link's stream ends, the owner hears of it (``on_lost``: it
requeues the link's tasks); a worker still registered and alive is linked
again after :data:`RECONNECT_DELAY_S`. Owned by
:class:`~pool.dispatcher.placement.Router`, which places the tasks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Final, assert_never
from uuid import UUID

from discovery import DiscoveryEvent, WorkerInfo
from pool.dispatcher.jobs import Connect, Link, LinkEvents

RECONNECT_DELAY_S: Final = 0.5
LEAVE_GRACE_S: Final = 5.0  # a dropped worker's stream may finish this long

Spawn = Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]


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
        self.closed = False

    def on_event(self, event: DiscoveryEvent) -> Link | None:
        """Follow one discovery event; the link it brought news of, if any."""
        info = event.worker_info
        match event.type:
            case "worker-added":
                self._open_link(info)
                return None
            case "worker-updated":
                if (link := self.links.get(info.uid)) is not None:
                    link.info = info
                return link
            case "worker-dropped":
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
            # Link it again if it is still registered and alive (its drop is
            # coming otherwise).
            if self.links.get(link.info.uid) is link and not self.closed:
                if self._is_alive(self._namespace, link.info.uid):
                    self._spawn(self._reconnect(link))
                else:
                    del self.links[link.info.uid]
            self._on_lost(link)

    async def _reconnect(self, old: Link) -> None:
        await asyncio.sleep(RECONNECT_DELAY_S)  # a pause, not a wait for an event
        if self.links.get(old.info.uid) is old and not self.closed:
            self._open_link(old.info)


async def _close_after(link: Link, grace_s: float) -> None:
    """Close a dropped worker's link once its stream had ``grace_s`` to end."""
    try:
        await asyncio.sleep(grace_s)  # the grace itself, not a wait for an event
    finally:
        link.close()
