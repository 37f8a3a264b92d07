"""``RedisDiscovery``: a namespace's registry in Redis, for pools that span
machines. Same contract as :class:`~discovery.LocalDiscovery`: publishers
publish ``worker-added``/``-updated``/``-dropped``, subscribers iterate the
same events, so code written against one runs on the other.

Keys of a namespace (``{ns}`` is a Redis Cluster hash tag: one slot):

- ``shmp:{ns}:workers``, a hash: uid -> the worker's encoded ``WorkerInfo``;
- ``shmp:{ns}:leases``, a sorted set: uid -> its lease's deadline (ms on
  Redis's own clock, so no two hosts' clocks are compared);
- ``shmp:{ns}:events``, a stream of changes (``t`` type, ``u`` uid, ``i``
  info), trimmed to about :data:`STREAM_MAXLEN` entries.

Every change is one Lua script, so the hash, the leases and the stream never
disagree. A publisher renews each of its workers' leases every
``heartbeat_s`` (and puts the entry back if Redis lost it: a restart, a
flush); a clean exit drops at once. A worker whose host vanishes stops
renewing: every subscriber runs the reaping script about every
``poll_interval`` seconds, which finds expired deadlines and, atomically,
removes each and appends one ``worker-dropped``, so every subscriber sees
exactly one drop whoever found it.

A subscriber reads the stream from the last id it saw, so a reconnect
resumes without missing an event. It starts from a snapshot (the hash and
the stream's last id read in one transaction) and takes one again every
:data:`RESYNC_EVERY_S` (a trimmed stream) and after each reconnect. When
Redis itself was restarted (its run id changed) and lost its data, the
workers it knew are given one lease period to be put back by their
publishers before they are reported dropped: a restart is not a death.
After a restart or a failover, a subscriber reaps nothing for that period
either: a promoted replica holds leases that ran out while no primary
answered, and their publishers renew them once they reconnect. Every
connection is made by :mod:`discovery.redis.connecting`, which also takes
the Sentinels' ``redis+sentinel://`` URLs.

Callers: the pool, when given ``--discovery redis://...``; tests and
benchmarks. Nothing here imports gRPC.
"""

from __future__ import annotations

from typing import Any, Self
from uuid import uuid4

# First, so that a missing extra says how to install it.
try:
    import redis  # noqa: F401
except ImportError:
    raise ImportError(
        "RedisDiscovery needs redis-py: pip install 'shm-pool[redis]'"
    ) from None

from discovery import paths
from discovery.redis.keys import HEARTBEAT_S, TTL_S, Filter, registered
from discovery.redis.publisher import RedisPublisher
from discovery.redis.subscriber import RedisSubscriber

__all__ = [
    "HEARTBEAT_S",
    "TTL_S",
    "RedisDiscovery",
    "RedisPublisher",
    "RedisSubscriber",
    "registered",
]


class RedisDiscovery:
    """Worker discovery through Redis; see the module docstring.

    :param url: the Redis server, ``redis://host:port[/db]``.
    :param namespace: the registry's name; a fresh one if None.
    :param ttl_s: how long a worker stays registered without a heartbeat.
    :param heartbeat_s: how often publishers renew their workers' leases.
    :raises InvalidNamespace: (a ``ValueError``) for a bad name.
    :raises ValueError: for a URL that is not ``redis://`` or ``rediss://``,
        or a heartbeat not shorter than the lease.
    """

    def __init__(
        self,
        url: str,
        namespace: str | None = None,
        *,
        ttl_s: float = TTL_S,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"not a Redis URL: {url!r}; use redis://host:port")
        if not 0 < heartbeat_s < ttl_s:
            raise ValueError(
                f"heartbeat_s must be above 0 and below ttl_s ({ttl_s}), "
                f"got {heartbeat_s}"
            )
        self.url = url
        self._namespace = paths.validate_namespace(
            f"pool-{uuid4().hex[:12]}" if namespace is None else namespace
        )
        self.ttl_s, self.heartbeat_s = ttl_s, heartbeat_s

    @property
    def namespace(self) -> str:
        return self._namespace

    def __enter__(self) -> Self:
        return self  # nothing to create: the keys appear with the first worker

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release: each publisher and subscriber owns its
        connection. (Workers drop when their publishers exit.)"""

    @property
    def publisher(self) -> RedisPublisher:
        return RedisPublisher(
            self.url, self._namespace, ttl_s=self.ttl_s, heartbeat_s=self.heartbeat_s
        )

    @property
    def subscriber(self) -> RedisSubscriber:
        return self.subscribe()

    def subscribe(
        self, filter: Filter | None = None, *, poll_interval: float | None = None
    ) -> RedisSubscriber:
        return RedisSubscriber(
            self.url,
            self._namespace,
            filter,
            poll_interval=poll_interval,
            ttl_s=self.ttl_s,
            heartbeat_s=self.heartbeat_s,
        )
