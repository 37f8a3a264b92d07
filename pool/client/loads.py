"""Which of a pool's dispatchers a client takes: the least loaded, by what
each answers now (:func:`least_loaded`).

A pool on Redis may have a dispatcher on each of several hosts
(:mod:`pool.client.announcements`). A client asks each one's
``ListWorkers``, all at once and for at most :data:`ASK_TIMEOUT_S`, and
takes the one with the fewest tasks (queued, and sent to workers), then
the fewest clients; ties go at random, so that clients that start together
spread. One that does not answer in time (dead, hung, unreachable) is
taken only if none answers. Called by
:meth:`~pool.client.rendezvous.Locator.locate` each time a client
connects, and (:func:`ask`) by the dashboard; no state.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, Protocol, TypeVar

from grpc import aio

from pool import dispatcher_pb2_grpc
from pool.dispatcher_pb2 import ListWorkersReply, ListWorkersRequest
from workers.protocol import auth

ASK_TIMEOUT_S: Final = 0.5  # a dispatcher that answers slower is passed over

Load = tuple[float, float]  # (tasks, clients): the smaller, the less loaded


class Dispatcher(Protocol):
    """What is asked here of a dispatcher to call (a
    :class:`~pool.client.rendezvous.Target`): the token it takes."""

    @property
    def token(self) -> str: ...


D = TypeVar("D", bound=Dispatcher)


async def least_loaded(
    targets: Sequence[D], channel: Callable[[D], Awaitable[aio.Channel]]
) -> D:
    """Of ``targets`` (at least one), the least loaded; see the module
    docstring. ``channel`` opens a channel to a dispatcher."""
    if len(targets) == 1:
        return targets[0]
    shuffled = random.sample(list(targets), len(targets))
    replies = await asyncio.gather(*(ask(t, channel) for t in shuffled))
    loads = [_load(reply) for reply in replies]
    return shuffled[min(range(len(shuffled)), key=loads.__getitem__)]


async def ask(
    target: D, channel: Callable[[D], Awaitable[aio.Channel]]
) -> ListWorkersReply | None:
    """What the dispatcher ``target`` answers (``ListWorkers``), or None if
    it does not within :data:`ASK_TIMEOUT_S`."""
    try:
        async with await channel(target) as opened:
            stub = dispatcher_pb2_grpc.DispatcherStub(opened)  # type: ignore[no-untyped-call]
            reply: ListWorkersReply = await stub.ListWorkers(
                ListWorkersRequest(),
                metadata=auth.call_metadata(target.token),
                timeout=ASK_TIMEOUT_S,
            )
            return reply
    except (aio.AioRpcError, OSError):
        return None


def sent(reply: ListWorkersReply) -> int:
    """The tasks a dispatcher has sent to workers, unanswered."""
    return sum(state.in_flight for state in reply.workers)


def _load(reply: ListWorkersReply | None) -> Load:
    if reply is None:
        return math.inf, math.inf
    return float(reply.queued + sent(reply)), float(reply.clients)
