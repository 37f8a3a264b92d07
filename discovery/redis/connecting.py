"""The one way to a registry's Redis: :func:`connect` (asyncio) and
:func:`connect_sync`, for every URL :mod:`discovery.urls` accepts.

A ``redis+sentinel://`` URL gives a client whose connections ask the
Sentinels for the primary each time one is made (redis-py's
``SentinelConnectionPool``): when the primary fails over, the calls on the
old one fail as a ``ConnectionError`` (redis-py turns the demoted
primary's ``READONLY`` answers into one too), and what retries (a
publisher's heartbeat, a subscriber's reconnect, the dispatcher's
announcement) reaches the new primary. Closing the client closes its
connections to the Sentinels as well.

Callers: the publisher, the subscriber and the one-off reads of
:mod:`discovery.redis`, :func:`discovery.backends.check_reachable`, and the
dispatcher's announcement and clients' lookup
(:mod:`pool.client.rendezvous`).
"""

from __future__ import annotations

from typing import Any, Final

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from discovery.urls import is_sentinel, parse_sentinel

CONNECT_TIMEOUT_S: Final = 1.0


def connect(url: str, **options: Any) -> aioredis.Redis:
    """A client of the Redis ``url`` names (``options`` go to its
    connections; a connect timeout of :data:`CONNECT_TIMEOUT_S` unless
    given). Close it with ``aclose()``.

    :raises ValueError: for a Sentinel URL that is not well formed.
    """
    options.setdefault("socket_connect_timeout", CONNECT_TIMEOUT_S)
    if not is_sentinel(url):
        return aioredis.Redis.from_url(url, **options)
    client: _AsyncSentinelRedis = _primary_of(
        url, options, aiosentinel.Sentinel, _AsyncSentinelRedis, AsyncRetry
    )
    return client


def connect_sync(url: str, **options: Any) -> redis.Redis:
    """:func:`connect` for code without an event loop; close it with
    ``close()``."""
    options.setdefault("socket_connect_timeout", CONNECT_TIMEOUT_S)
    if not is_sentinel(url):
        return redis.Redis.from_url(url, **options)
    client: _SentinelRedis = _primary_of(
        url, options, redis.sentinel.Sentinel, _SentinelRedis, Retry
    )
    return client


def _primary_of(
    url: str,
    options: dict[str, Any],
    sentinel_class: Any,
    client_class: Any,
    retry: Any,
) -> Any:
    """The client (of ``client_class``) of the primary the Sentinels of
    ``url`` name, holding its ``sentinel_class`` manager to close with it.
    The connections to the Sentinels themselves take the timeouts and no
    retry (redis-py's default backs off for seconds at a Sentinel that is
    down before it asks the next; whoever calls retries already)."""
    target = parse_sentinel(url)
    timeouts = {k: v for k, v in options.items() if k.startswith("socket_")}
    manager = sentinel_class(
        target.sentinels,
        sentinel_kwargs=timeouts | {"retry": retry(NoBackoff(), 0)},
        **options,
    )
    client = manager.master_for(
        target.service, client_class, db=target.db, password=target.password
    )
    client.manager = manager
    return client


class _AsyncSentinelRedis(aioredis.Redis):
    """The primary's client, which closes its Sentinels' clients with it."""

    manager: aiosentinel.Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        if self.manager is not None:
            for client in self.manager.sentinels:
                await client.aclose()


class _SentinelRedis(redis.Redis):
    manager: redis.sentinel.Sentinel | None = None

    def close(self) -> None:
        super().close()
        if self.manager is not None:
            for client in self.manager.sentinels:
                client.close()
