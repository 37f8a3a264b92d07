"""The dispatchers of a pool on Redis, as its clients of other machines
find them.

A pool on Redis discovery may have several dispatchers, one per host that
runs ``pool up`` in the namespace. Each supervisor announces its
dispatcher's address under a lease of its own (:func:`announce`), renewed
every :data:`RENEW_S` and withdrawn at stop, so a dead or hung host's
announcement runs out after :data:`LEASE_S` (a client leaves it sooner:
after :data:`STALE_S` without a renewal). Two keys per namespace, kept
together by Lua scripts: the hash ``shmp:{ns}:dispatchers`` (id to
:class:`Announced`, JSON) and the sorted set ``shmp:{ns}:dispatcher-leases``
(id to the lease's end, by Redis's clock). Whoever renews or reads removes
what has run out.

Callers: the supervisor (:func:`announce`), and the clients and the
command line, through :class:`pool.client.rendezvous.Locator`
(:func:`live`, :func:`live_sync`). redis is imported when a function here
is called: the shared-memory path never pays for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

if TYPE_CHECKING:
    import redis.asyncio as aioredis

LEASE_S: Final = 3.0
RENEW_S: Final = 1.0
WATCH_S: Final = 0.5  # how often a client looks at its dispatcher's lease
# A client leaves a dispatcher whose lease was not renewed for this long
# (two renewals missed: its host hung), before the lease runs out.
STALE_S: Final = 2 * RENEW_S

_NOW: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
end
"""
# KEYS: dispatchers, leases. ARGV: id, announcement, lease ms.
_RENEW: Final = (
    _NOW
    + """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
"""
)
# KEYS: dispatchers, leases. Returns the live announcements.
_LIVE: Final = _NOW + "return redis.call('HVALS', KEYS[1])\n"
# KEYS: dispatchers, leases. Returns Redis's time (ms) and each live
# announcement's id and lease end, flat: [now, id, end, id, end, ...].
_ENDS: Final = (
    _NOW
    + """
local ends = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
table.insert(ends, 1, now)
return ends
"""
)


@dataclass(frozen=True)
class Announced:
    """Where clients of other machines reach one dispatcher; ``id`` (given
    by :func:`announce`) tells it from the pool's
    others."""

    address: str
    tls: bool = False
    id: str = ""

    def encode(self) -> str:
        return json.dumps({"address": self.address, "tls": self.tls, "id": self.id})

    @classmethod
    def decode(cls, data: bytes) -> Announced:
        """:raises ValueError: for anything :meth:`encode` did not make."""
        fields = json.loads(data)
        if not isinstance(fields, dict) or not all(
            isinstance(fields.get(name), str) for name in ("address", "id")
        ):
            raise ValueError(f"not a dispatcher's announcement: {data!r}")
        return cls(fields["address"], fields.get("tls") is True, fields["id"])


def unavailable() -> tuple[type[BaseException], ...]:
    """What redis-py raises when Redis does not answer."""
    import redis

    return (redis.ConnectionError, redis.TimeoutError, OSError)


def _keys(namespace: str) -> list[str]:
    from discovery.redis.keys import key

    return [key(namespace, "dispatchers"), key(namespace, "dispatcher-leases")]


async def announce(
    url: str,
    namespace: str,
    where: Callable[[], Announced],
    first: asyncio.Event,
) -> None:
    """Keep ``where()`` announced until cancelled, then withdraw it;
    ``first`` is set after the first try. While Redis is unreachable, it
    tries again at each renewal. ``where()`` may change (a restarted
    dispatcher listens elsewhere); its id, made here, does not."""
    from discovery.redis.connecting import connect

    unavailable_now = unavailable()
    client = connect(url)
    renew = client.register_script(_RENEW)
    keys, ident = _keys(namespace), uuid.uuid4().hex
    try:
        while True:
            announced = dataclasses.replace(where(), id=ident).encode()
            with contextlib.suppress(*unavailable_now):
                await renew(keys=keys, args=[ident, announced, int(LEASE_S * 1000)])
            first.set()
            await asyncio.sleep(RENEW_S)  # the lease's heartbeat
    finally:
        with contextlib.suppress(*unavailable_now):
            await asyncio.shield(_withdraw(client, keys, ident))
        await client.aclose()


async def _withdraw(client: aioredis.Redis, keys: list[str], ident: str) -> None:
    async with client.pipeline(transaction=True) as pipe:
        pipe.hdel(keys[0], ident)
        pipe.zrem(keys[1], ident)
        await pipe.execute()


async def live(url: str, namespace: str) -> list[Announced]:
    """The dispatchers announced in ``namespace`` now, their leases running.

    :raises redis.ConnectionError: (or another of :func:`unavailable`) if
        Redis does not answer.
    """
    from discovery.redis.connecting import connect

    client = connect(url)
    try:
        return await _live_on(client, namespace)
    finally:
        await client.aclose()


async def _live_on(client: aioredis.Redis, namespace: str) -> list[Announced]:
    found = client.eval(_LIVE, 2, *_keys(namespace))
    return _decoded(await cast(Awaitable[Any], found))


def live_sync(url: str, namespace: str) -> list[Announced]:
    """:func:`live`, for code without an event loop."""
    from discovery.redis.connecting import connect_sync

    client = connect_sync(url)
    try:
        found = client.eval(_LIVE, 2, *_keys(namespace))
    finally:
        client.close()
    return _decoded(found)


def _decoded(found: Any) -> list[Announced]:
    """The announcements that decode (one that does not is skipped: it is
    no dispatcher of ours)."""
    announced = []
    for data in cast(list[bytes], found or []):
        with contextlib.suppress(ValueError):
            announced.append(Announced.decode(data))
    return sorted(announced, key=lambda a: a.id)


async def until_withdrawn(url: str, namespace: str, ident: str) -> None:
    """Return once the dispatcher ``ident`` is gone (its host died or
    stopped: no longer announced; or hung: its lease not renewed for
    :data:`STALE_S`) and another is there, renewed: there is somewhere else
    to go. Looked for every :data:`WATCH_S`. While Redis does not answer,
    and for a lease after it answers again (a restart or a failover may have
    lost every announcement, or let them run out: their hosts renew them),
    it is taken to be there still."""
    from discovery.redis.connecting import connect

    gone, client = unavailable(), connect(url)
    trusted_from = 0.0  # (monotonic time)
    try:
        while True:
            await asyncio.sleep(WATCH_S)  # (the look itself)
            try:
                fresh = await _renewed(client, namespace)
            except gone:
                trusted_from = math.inf
                continue
            now = time.monotonic()
            trusted_from = min(trusted_from, now + LEASE_S)
            if now >= trusted_from and fresh - {ident} and ident not in fresh:
                return
    finally:
        await client.aclose()


async def _renewed(client: aioredis.Redis, namespace: str) -> set[str]:
    """The ids of the dispatchers whose lease was renewed in the last
    :data:`STALE_S` (by Redis's clock)."""
    found = client.eval(_ENDS, 2, *_keys(namespace))
    now_ms, *pairs = cast(list[Any], await cast(Awaitable[Any], found))
    renewed_after = int(now_ms) + (LEASE_S - STALE_S) * 1000  # (as a lease end)
    ends = dict(zip(pairs[::2], pairs[1::2], strict=True))
    return {i.decode() for i, end in ends.items() if float(end) > renewed_after}
