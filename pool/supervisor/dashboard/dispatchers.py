"""Every dispatcher of a pool on Redis, for the dashboard (:func:`watch`).

A pool whose hosts each run a dispatcher shows them all on each host's
dashboard: every :data:`POLL_S`, the dispatchers announced in Redis
(:mod:`pool.client.announcements`) are each asked ``ListWorkers``
(:func:`pool.client.loads.ask`), and the board is given a row per
dispatcher: its address, whether it is this host's, its clients, what
waits in it and what it has sent to workers (``None`` for one that did
not answer). Run in the supervisor's task group while the pool serves;
nothing of it is kept but the board's last rows. Owned by
:class:`~pool.supervisor.dashboard.server.Dashboard`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from pool.client import announcements, loads
from pool.client.rendezvous import Locator, Target
from pool.dispatcher_pb2 import ListWorkersReply

if TYPE_CHECKING:
    from pool.supervisor.dashboard.board import Board

POLL_S: Final = 1.0


async def watch(
    board: Board, locator: Locator, token: str, here: Callable[[], str]
) -> None:
    """Keep ``board``'s dispatchers current until cancelled; ``here()`` is
    this host's dispatcher's announced address."""
    assert locator.discovery_url is not None
    unavailable = announcements.unavailable()
    while True:
        try:
            found = await announcements.live(locator.discovery_url, locator.namespace)
        except unavailable:
            found = None  # (Redis away: the last rows stay)
        if found is not None:
            targets = [Target(a.address, token, a.tls, id=a.id) for a in found]
            replies = await asyncio.gather(
                *(loads.ask(t, locator.channel) for t in targets)
            )
            pairs = zip(targets, replies, strict=True)
            board.dispatchers([_row(t, r, t.address == here()) for t, r in pairs])
        await asyncio.sleep(POLL_S)  # a poll: the dispatchers push nothing


def _row(
    target: Target, reply: ListWorkersReply | None, is_here: bool
) -> dict[str, Any]:
    row: dict[str, Any] = {"address": target.address, "here": is_here}
    if reply is None:
        return row | dict.fromkeys(("clients", "queued", "sent"))
    return row | {
        "clients": reply.clients,
        "queued": reply.queued,
        "sent": loads.sent(reply),
    }
